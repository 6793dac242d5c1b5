"""Joins, leaves and rejoins: every allocator follows the PeerView's members.

Invariants, with C the global amount:

* GDRL / fill ratio, at every tick, under loss, duplication, reordering and any
  order of joins, leaves, crashes and restarts: the live nodes' accountable
  amounts (holding + link counters) add up to at most C, and so do their
  holdings.  They fall below C by what the down members still hold until their
  best friends inherit it, and by an endowment return in flight.  Once the
  churn has settled (every down member inherited, every return applied), they
  add up to exactly C again.
* DQMP: free + consumed + link counters of the live nodes == quota at every tick
  (a non-manager holds nothing of its own: all it has came over links).
"""
import random

import pytest
from hypothesis import example, given, settings, strategies as st

from drl.agent.allocators import create
from drl.agent.allocators.common import peer_view
from drl.agent.allocators.dqmp import accountable
from drl.agent.allocators.gdrl import PARTS
from drl.agent.allocators.endowment import share
from drl.agent.model import Envelope, LeaseGrant, LeaseRequest, Local, PeerState, Snapshot

from netharness import Net

TOTAL = 6_000_000                 # B/s; GDRL's ledgers hold it as PARTS
FOUNDERS = [f"m{i}" for i in range(6)]
DEAD_AFTER_S = 3.0


def _snap(node, members, alive=(), values=None, demand=1e6, inbox=(), now=0.0):
    values = values or {}
    peers = [PeerState(m, values.get(m, 0.0), alive=m in alive, age_s=0.0 if m in alive else 60.0)
             for m in members if m != node]
    return Snapshot(now=now, node_id=node, interval_s=0.1, global_Bps=12e6, local=Local(demand_Bps=demand),
                    view=peer_view(members, peers), inbox=tuple(inbox))


# -- 1/N policies -------------------------------------------------------------------------------

@pytest.mark.parametrize("members, alive", [("abcd", "bcd"), ("abcde", "bcde"), ("abc", "bc"), ("abcde", "bc")])
def test_one_over_n_policies_follow_the_current_members(members, alive):
    """static splits by the members now; grd and fps share the limit less 1/N per stale
    member (a joiner not heard yet counts stale); gtb subtracts only members' values."""
    n, n_alive = len(members), len(alive)
    snap = _snap("a", tuple(members), alive=alive, values={m: 1e6 for m in alive}, demand=5e6)
    static = create("static").step(None, snap).decision
    assert static.limit_Bps == pytest.approx(12e6 / n)
    grd = create("grd").step(None, snap).decision
    assert grd.info["global_limit_Bps"] == pytest.approx(12e6 * (1 + n_alive) / n)
    idle = _snap("a", tuple(members), alive=alive, demand=0.0)
    fps = create("fps").step(create("fps").initial_state("a", tuple(members)), idle).decision
    assert fps.info["share_Bps"] == pytest.approx(12e6 * (1 + n_alive) / n / (1 + n_alive))
    gtb = create("gtb").step(None, snap).decision
    assert gtb.info["remote_Bps"] == pytest.approx(1e6 * n_alive)


def test_a_member_that_leaves_stops_counting_at_once():
    """A leaver is no member (not a stale one): N shrinks and nothing is reserved for it."""
    before = _snap("a", ("a", "b", "c"), alive="bc", values={"b": 2e6, "c": 2e6})
    after = _snap("a", ("a", "b"), alive="b", values={"b": 2e6})
    grd = create("grd")
    assert grd.step(None, before).decision.info["global_demand_Bps"] == pytest.approx(5e6)
    assert grd.step(None, after).decision.info == {"global_demand_Bps": 3e6, "global_limit_Bps": 12e6}
    assert create("static").step(None, after).decision.limit_Bps == 6e6


# -- lease --------------------------------------------------------------------------------------

def test_lease_servers_and_clients_follow_the_members():
    lease = create("lease", ttl_s=2.0, refresh_s=0.5)
    b = lease.initial_state("b", ("a", "b", "c"))
    # a (the lowest id, the server) is here: b asks a
    out = lease.step(b, _snap("b", ("a", "b", "c"), alive="ac"))
    assert [e.dst for e in out.outbox] == ["a"]
    # a left: b is now the lowest member, so it serves, and grants c
    req = Envelope(LeaseRequest(want_Bps=3e6), src="c")
    served = lease.step(out.state, _snap("b", ("b", "c"), alive="c", inbox=[req], now=1.0))
    grants = [e for e in served.outbox if isinstance(e.body, LeaseGrant)]
    # c asked 3 of the 12 Mbit/s, b wants 1: c gets its 3 plus half of the 8 nobody asked for
    assert [g.dst for g in grants] == ["c"] and grants[0].body.capacity_Bps == pytest.approx(7e6)
    # a joiner asks the current server from its first tick
    d = lease.initial_state("d", ("b", "c", "d"))
    assert [e.dst for e in lease.step(d, _snap("d", ("b", "c", "d"), alive="bc")).outbox] == ["b"]


# -- GDRL / fill ratio --------------------------------------------------------------------------

def _diffusion_net(name, loss=0.0, dup=0.0, delay=0, seed=0):
    alloc = create(name, dead_after_s=DEAD_AFTER_S)
    net = Net(alloc, FOUNDERS, TOTAL, loss=loss, dup=dup, max_delay=delay, seed=seed)
    for k, m in enumerate(FOUNDERS):
        net.local[m] = Local(demand_Bps=(k + 1) * 300_000.0)
    return net


def _live_sums(net):
    states = [net.state[m] for m in net.live if net.state[m].ledger is not None]
    return sum(s.ledger.accountable for s in states), sum(s.ledger.holding for s in states)


def _assert_at_most_total(net):
    accountable, holding = _live_sums(net)
    assert accountable <= PARTS and holding <= PARTS


def _down_unclaimed(net):
    """Genesis shares still with a down member: no live node has inherited them."""
    claimed = set().union(*(net.state[m].ledger.claimed for m in net.live if net.state[m].ledger))
    down = (set(net.crashed) | net.gone) & set(net.genesis)
    return sum(share(PARTS, net.genesis, d) for d in down - claimed)


def _settle(net, ticks=40):
    net.loss = net.dup = 0.0
    net.run(ticks, _assert_at_most_total)


def _joiner(name, seed):
    return create(name, dead_after_s=DEAD_AFTER_S, join=True, seed=seed)


def _churn(net, name, kind, pick, joined):
    """One membership change; ``pick`` chooses among the nodes it can apply to."""
    up = sorted(net.live)
    down = sorted(set(net.crashed) | net.gone)
    if kind == "join":
        node = f"j{len(joined)}"
        joined.append(node)
        net.add(node, _joiner(name, pick), None)
        net.local[node] = Local(demand_Bps=900_000.0)
    elif kind == "restart" and down:
        net.restart(down[pick % len(down)])
    elif kind == "fast-restart" and up:
        net.restart(up[pick % len(up)])                      # a new life before anyone saw it fail
    elif kind in ("leave", "crash") and len(up) > 2:
        node = up[pick % len(up)]
        net.leave(node) if kind == "leave" else net.crash(node)


KINDS = ("join", "leave", "crash", "restart", "fast-restart")


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["gdrl", "fillratio"]), seed=st.integers(0, 10**6), loss=st.floats(0, 0.4),
       dup=st.floats(0, 0.2), delay=st.integers(0, 2),
       events=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(KINDS), st.integers(0, 100)), max_size=8))
# m5 and m0 leave together (m1 holds both shares), come back together: m0, asked by m5 as its
# best friend, held none of it, and m5 took its share while m1 still owed it (7/6 of C)
@example(name="gdrl", seed=0, loss=0.0, dup=0.0, delay=0,
         events=[(0, "leave", 5), (0, "leave", 0), (4, "join", 0), (5, "restart", 0), (0, "join", 1), (5, "restart", 0)])
def test_random_churn_never_creates_capacity(name, seed, loss, dup, delay, events):
    """Any joins, leaves, crashes and restarts, at any time, with loss, duplicates and
    reordering: the live nodes never hold (or account for) more than C."""
    net = _diffusion_net(name, loss, dup, delay, seed)
    joined: list[str] = []
    schedule: dict[int, list] = {}
    for tick, kind, pick in events:
        schedule.setdefault(tick, []).append((kind, pick))
    for tick in range(45):
        for kind, pick in schedule.get(tick, []):
            _churn(net, name, kind, pick, joined)
        net.tick()
        _assert_at_most_total(net)


EPISODES = ("leave", "leave-rejoin", "crash-restart", "fast-restart", "join", "join-leave")


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["gdrl", "fillratio"]), seed=st.integers(0, 10**6), loss=st.floats(0, 0.4),
       episodes=st.lists(st.tuples(st.sampled_from(EPISODES), st.integers(0, 100)), min_size=1, max_size=5))
def test_every_change_settles_back_to_exactly_c(name, seed, loss, episodes):
    """One change at a time, each followed by a settling period: at most C throughout,
    exactly C (plus the shares of members still down and not yet inherited: none,
    once their best friend has acted) after each, and a rejoiner has its share back."""
    net = _diffusion_net(name, loss=loss, delay=1, seed=seed)
    joined: list[str] = []
    net.run(5, _assert_at_most_total)
    for kind, pick in episodes:
        up = [m for m in sorted(net.live) if m in net.genesis]
        node = up[pick % len(up)] if up else None
        if kind in ("join", "join-leave") or node is None or len(net.live) <= 3:
            _churn(net, name, "join", pick, joined)
            if kind == "join-leave":
                net.run(10, _assert_at_most_total)
                net.leave(joined[-1])
        elif kind == "leave":
            net.leave(node)
        elif kind == "leave-rejoin":
            net.leave(node)
            net.run(5, _assert_at_most_total)
            net.restart(node)
        elif kind == "crash-restart":
            net.crash(node)
            net.run(int(DEAD_AFTER_S) + 3, _assert_at_most_total)
            net.restart(node)
        else:
            net.restart(node)
        net.loss = loss
        net.run(10, _assert_at_most_total)
        _settle(net)
        accountable, _ = _live_sums(net)
        assert accountable + _down_unclaimed(net) == PARTS
        for m in net.live:
            st_ = net.state[m]
            if st_.rejoined:     # its share back, and those of the down members behind it
                assert st_.returned >= share(PARTS, st_.genesis, m) and not st_.ledger.elsewhere


def test_restarted_node_gets_its_share_back_and_the_sum_never_exceeds_c():
    """The old bug: a restarted founder re-took its genesis share while its best friend
    had already inherited it (sum of C_i above C).  Now it restarts holding 0, its best
    friend returns the share, and the sum is C again."""
    net = _diffusion_net("gdrl")
    net.run(20)
    net.crash("m2")
    net.run(int(DEAD_AFTER_S) + 2, _assert_at_most_total)
    assert "m2" in net.state["m3"].ledger.claimed             # m2's best friend inherited
    net.restart("m2")
    net.run(1, _assert_at_most_total)
    assert net.state["m2"].rejoined and net.state["m2"].ledger.holding <= share(PARTS, net.genesis, "m2")
    net.run(30, _assert_at_most_total)
    assert net.state["m2"].returned == share(PARTS, net.genesis, "m2")
    assert "m2" not in net.state["m3"].ledger.claimed
    assert _live_sums(net)[0] == PARTS


def test_leave_is_inherited_at_once_and_a_fast_restart_by_its_incarnation():
    net = _diffusion_net("fillratio")
    net.run(10)
    net.leave("m4")
    net.run(1)
    assert "m4" in net.state["m5"].ledger.claimed and _live_sums(net)[0] == PARTS
    net.restart("m1")                       # no silence at all: only its incarnation changed
    net.run(1, _assert_at_most_total)
    link = net.state["m2"].ledger.links["m1"]              # m2 inherited m1's old life and returned its share
    assert link.rep_sent == share(PARTS, net.genesis, "m1") and "m1" not in net.state["m2"].ledger.claimed
    net.run(20, _assert_at_most_total)
    assert net.state["m1"].returned == share(PARTS, net.genesis, "m1") and _live_sums(net)[0] == PARTS


def test_a_share_inherited_twice_over_follows_its_best_friend_back():
    """m1 leaves (m2 inherits it); m2 restarts (m3 inherits m2 and m1); m2 is back, so it
    is m1's best friend again and gets both shares; then m3 leaves: nothing is lost."""
    net = _diffusion_net("gdrl")
    net.run(10)
    net.leave("m1")
    net.run(3, _assert_at_most_total)
    net.restart("m2")
    net.run(30, _assert_at_most_total)
    assert net.state["m2"].ledger.claimed == {"m1"} and "m1" not in net.state["m3"].ledger.claimed
    net.leave("m3")
    net.run(30, _assert_at_most_total)
    assert _live_sums(net)[0] == PARTS


def test_joiner_that_leaves_gives_back_what_it_was_given():
    net = _diffusion_net("gdrl")
    net.run(10)
    net.add("j0", _joiner("gdrl", 3))
    net.local["j0"] = Local(demand_Bps=2_000_000.0)
    net.run(60)
    assert net.decision["j0"].limit_Bps > 100_000
    net.leave("j0")
    net.run(1)
    assert _live_sums(net)[0] == PARTS


# -- DQMP ---------------------------------------------------------------------------------------

class Traffic:
    """Each live node passes a random part of its allowance every tick."""

    def __init__(self, seed):
        self.rng, self.sent = random.Random(seed), {}

    def __call__(self, net):
        for m in net.live:
            if m not in net.decision:
                continue
            self.sent[m] = self.sent.get(m, 0) + min(net.decision[m].quota_bytes, self.rng.randint(0, 300))
            net.local[m] = Local(demand_Bps=150, sent_total_bytes=self.sent[m])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), loss=st.floats(0, 0.4), dup=st.floats(0, 0.2), delay=st.integers(0, 2),
       events=st.lists(st.tuples(st.integers(1, 30), st.sampled_from(KINDS), st.integers(0, 100)), max_size=8))
def test_dqmp_quota_exact_through_joins_leaves_and_restarts(seed, loss, dup, delay, events):
    members = [f"n{i}" for i in range(8)]
    quota = 400_000
    alloc = create("dqmp", quota_bytes=quota, unit_bytes=1, dead_after_s=2.0, manager="n0")
    net = Net(alloc, members, 0.0, loss=loss, dup=dup, max_delay=delay, seed=seed)
    traffic = Traffic(seed)
    schedule: dict[int, list] = {}
    for tick, kind, pick in events:
        schedule.setdefault(tick, []).append((kind, pick))
    joined = 0
    for tick in range(40):
        for kind, pick in schedule.get(tick, []):
            others = [m for m in sorted(net.live) if m != "n0"]
            down = sorted(set(net.crashed) | net.gone)
            if kind == "join":
                net.add(f"x{joined}", alloc)
                joined += 1
            elif kind == "restart" and down:
                net.restart(down[pick % len(down)])
            elif kind == "fast-restart" and others:
                net.restart(others[pick % len(others)])
            elif kind in ("leave", "crash") and others:
                node = others[pick % len(others)]
                net.leave(node) if kind == "leave" else net.crash(node)
        net.tick()
        traffic(net)
        assert sum(accountable(net.state[m]) for m in net.live) == quota
