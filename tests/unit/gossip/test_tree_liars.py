"""Issue 44, the tree half: a key holder moves a victim's remote sum by at most its own share.

Any Sums it can build (decode yields only counts within MAX_SUM_NODES and sums within count x
MAX_VALUE, test_wire_bounds.py), sent to any members, in any order, while the others run the
tree honestly: a member that is no chosen summer moves a victim's remote sum only as far as its
own value could, [its honest value less its value .. plus MAX_VALUE]; a chosen summer cannot take it
below the victim's floor, what per-peer gossip brought it within FRESH intervals, so no lower than
the honest sum less the liar's own value where the victim heard every honest peer.  Once it stops,
what it injected is gone: nothing is left above the honest sum."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from drl.agent.gossip.tree import FRESH, SWITCH, SumTree, groups
from drl.agent.gossip.wire import MAX_SUM_NODES, MAX_VALUE, Batch, ClassValue, Sums, SumKind
from drl.agent.model import PeerView

KEY = 7
INTERVAL = 0.1
TOL = 1e3           # rounding: sums of up to 64 MAX_VALUE-sized parts are exact to 2^6 x 2^1


@st.composite
def forged(draw, ids, victim):
    """One Sums a key holder can get decoded, to one member."""
    kind = draw(st.sampled_from([SumKind.TOTAL, SumKind.PARTIAL, SumKind.LEAF]))
    nodes = draw(st.integers(0, 1) if kind == SumKind.LEAF else st.sampled_from([0, 1, 2, len(ids) - 1, len(ids), MAX_SUM_NODES]))
    value = draw(st.sampled_from([0.0, 1.0, nodes * MAX_VALUE]) | st.floats(0.0, nodes * MAX_VALUE))
    summers = tuple(draw(st.lists(st.sampled_from(ids), max_size=3)))
    return draw(st.sampled_from(ids) | st.just(victim)), Sums(kind, nodes, ((KEY, value),) if nodes else (), summers)


class Net:
    def __init__(self, n: int, liar: int, values: list[float]):
        self.ids = tuple(f"n{i:03d}" for i in range(n))
        self.liar = self.ids[liar]
        self.trees = {node: SumTree(node, INTERVAL, timeout_s=60.0) for node in self.ids}
        self.values = dict(zip(self.ids, values))
        self.k, self.flight = 0, []

    def now(self) -> float:
        return self.k * INTERVAL

    def round(self, lies=(), gossip_to: str | None = None, liar_speaks: bool = True) -> None:
        """One interval: what was sent last arrives, the liar's lies with it, then the honest ones
        send (and ``gossip_to`` hears every honest peer's Batch value)."""
        now = self.now()
        for dst, src, sums in self.flight + [(dst, self.liar, s) for dst, s in lies]:
            if dst != self.liar:
                self.trees[dst].receive(src, sums, now)
        if gossip_to is not None:
            for node in self.ids:
                if node not in (gossip_to, self.liar) or (node == self.liar and liar_speaks):
                    self.trees[gossip_to].heard(node, Batch((ClassValue(KEY, self.k + 1, self.values[node]),)), now)
        self.flight = [(dst, node, sums) for node in self.ids if node != self.liar
                       for dst, sums in self.trees[node].round(self.ids, {KEY: self.values[node]}, now,
                                                               lambda peer: True)]
        self.k += 1

    def remote(self, victim: str, gossip_sum: float) -> float:
        view = PeerView(self.ids, {}, gossip_sum, len(self.ids) - 1)
        return self.trees[victim].apply(view, KEY, self.now() - INTERVAL).remote_sum


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([5, 12, 40]), st.data())
def test_a_liar_moves_a_victims_remote_sum_by_at_most_its_own_share(n, data):
    ids = tuple(f"n{i:03d}" for i in range(n))
    summer = data.draw(st.booleans())                  # a chosen summer: its group's first
    liar = data.draw(st.sampled_from([i for i, node in enumerate(ids) if (groups(ids)[node][0] == node) == summer]))
    victim = data.draw(st.sampled_from([i for i in range(n) if i != liar]))
    net = Net(n, liar, data.draw(st.lists(st.floats(1e3, 1e6), min_size=n, max_size=n)))
    heard_all = summer or data.draw(st.booleans())
    victim_id = net.ids[victim]
    own = net.values[net.liar]
    honest = sum(net.values.values()) - net.values[victim_id] - own       # everyone but the victim and the liar
    for _ in range(4):                                                     # the honest tree, settled
        net.round(gossip_to=victim_id if heard_all else None)
    net.values[net.liar] = data.draw(st.floats(0.0, MAX_VALUE))           # what it now gossips as its own
    for _ in range(data.draw(st.integers(1, 2 * SWITCH))):
        lies = data.draw(st.lists(forged(net.ids, victim_id), min_size=1, max_size=6))
        net.round(lies, gossip_to=victim_id if heard_all else None)
        got = net.remote(victim_id, honest + net.values[net.liar])
        assert got >= honest - TOL
        if not summer:
            assert got <= honest + MAX_VALUE + TOL
        tree = net.trees[victim_id].remote(net.now() - INTERVAL)
        assert tree is None or tree.nodes <= n - 1
    for _ in range(3 * FRESH + 2):                 # it stops: silent; what it injected ages out, hop by hop
        net.round(gossip_to=victim_id if heard_all else None, liar_speaks=False)
    tree = net.trees[victim_id].remote(net.now() - INTERVAL)
    assert tree is None or tree.values.get(KEY, 0.0) <= honest * (1 + 1e-9) + 1e-6


def _settled(n: int = 5) -> Net:
    net = Net(n, liar=n - 1, values=[1.0e4 * (i + 1) for i in range(n)])
    for _ in range(4):
        net.round(gossip_to=net.ids[1])
    return net


def test_a_huge_partial_from_a_member_that_is_no_summer_changes_nothing():
    net = _settled()
    first = net.ids[0]                            # the one summer of a five-member cluster
    before = net.trees[first].remote(net.now() - INTERVAL).values[KEY]
    for _ in range(3):
        net.round([(first, Sums(SumKind.PARTIAL, 5, ((KEY, 5 * MAX_VALUE),)))], gossip_to=net.ids[1])
    assert net.trees[first].remote(net.now() - INTERVAL).values[KEY] == before


def test_a_summer_that_claims_more_members_than_there_are_is_passed_over_for_gossip():
    net = Net(5, liar=0, values=[1.0e4] * 5)        # the liar sorts first: everyone's summer
    victim = net.trees[net.ids[1]]
    for _ in range(4):
        net.round([(node, Sums(SumKind.TOTAL, 4, ((KEY, 4.0e4),))) for node in net.ids[1:]])
    assert victim.remote(net.now() - INTERVAL).nodes == 4
    net.round([(net.ids[1], Sums(SumKind.TOTAL, 2**20, ()))])
    assert victim.remote(net.now() - INTERVAL) is None and victim.lies == 1      # per-peer gossip meanwhile
    assert victim.status(net.now())["passed_over"] == [net.ids[0]]


def test_a_total_below_half_the_gossip_floor_for_switch_rounds_is_a_lie():
    net = Net(5, liar=0, values=[1.0e4] * 5)
    victim_id = net.ids[1]
    victim = net.trees[victim_id]
    for _ in range(4):
        net.round([(node, Sums(SumKind.TOTAL, 4, ((KEY, 4.0e4),))) for node in net.ids[1:]], gossip_to=victim_id)
    zero = [(node, Sums(SumKind.TOTAL, 4, ((KEY, 0.0),))) for node in net.ids[1:]]    # "everyone else is idle"
    for _ in range(SWITCH - 1):
        net.round(zero, gossip_to=victim_id)
        assert net.remote(victim_id, 0.0) >= 3.0e4             # held to the floor of the honest peers meanwhile
    net.round(zero, gossip_to=victim_id)
    assert victim.remote(net.now() - INTERVAL) is None and victim.lies == 1
