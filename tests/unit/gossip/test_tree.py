"""The sum tree (agent/gossip/tree.py): exact sums in three rounds at any N, a dead summer passed
over, a moved leaf counted once, TOTALs only from our summer, and apply's coverage rule."""
from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from drl.agent.gossip.tree import FAN_IN, FRESH, SWITCH, SumTree, _jump, _key, groups, tree_wanted
from drl.agent.gossip.wire import Sums, SumKind
from drl.agent.model import PeerView

KEY = 7
INTERVAL = 0.1


class Cluster:
    """``n`` trees exchanging their messages with one interval of delay, as agents do."""

    def __init__(self, n: int, seed: int = 1, loss: float = 0.0):
        self.ids = tuple(f"n{i:04d}" for i in range(n))
        self.trees = {node: SumTree(node, INTERVAL, timeout_s=60.0) for node in self.ids}
        self.rng = random.Random(seed)
        self.values = {node: self.rng.uniform(0.1, 10.0) for node in self.ids}
        self.dead: set[str] = set()
        self.loss, self.k, self.flight = loss, 0, []
        self.members = self.ids

    def round(self) -> None:
        now = self.k * INTERVAL
        for dst, src, sums in self.flight:
            if dst not in self.dead and self.rng.random() >= self.loss:
                self.trees[dst].receive(src, sums, now)
        self.flight = [(dst, node, sums) for node in self.members if node not in self.dead
                       for dst, sums in self.trees[node].round(self.members, {KEY: self.values[node]}, now,
                                                               lambda peer: True)]
        self.k += 1

    def now(self) -> float:
        return (self.k - 1) * INTERVAL

    def errors(self) -> dict[str, float | None]:
        """Each live limiter's remote sum less the true one (None: it has none fresh)."""
        live = [node for node in self.members if node not in self.dead]
        total = sum(self.values[node] for node in live)
        out = {}
        for node in live:
            got = self.trees[node].remote(self.now())
            out[node] = None if got is None else got.values.get(KEY, 0.0) - (total - self.values[node])
        return out


def _exact(errors: dict) -> bool:
    return all(e is not None and abs(e) < 1e-6 for e in errors.values())


def _groups(ids) -> list[tuple[str, ...]]:
    return sorted(set(groups(tuple(ids)).values()))


def test_groups_hold_about_fan_in_members_and_a_join_moves_nobody_else():
    ids = tuple(f"n{i:04d}" for i in range(1000))
    before = groups(ids)
    sizes = [len(g) for g in set(before.values())]
    assert len(sizes) == 32 and sum(sizes) == 1000 and 16 <= min(sizes) <= max(sizes) <= 48
    after = groups(ids[:500] + ids[501:])                   # one leaves: 32 groups still
    assert all(set(after[node]) == set(before[node]) - {ids[500]} for node in after)
    moved = sum(_jump(_key(node), 32) != _jump(_key(node), 33) for node in ids)    # 1,025 members: 33 groups
    assert 0 < moved <= 1000 / 33 * 1.5, moved


def test_every_limiter_reads_the_exact_sum_of_the_others_three_rounds_after_the_first_at_1000():
    c = Cluster(1000)
    for _ in range(4):          # values published in the first, read in the fourth
        c.round()
    assert _exact(c.errors())
    assert {c.trees[node].remote(c.now()).nodes for node in c.ids} == {999}
    summers = [node for node in c.ids if c.trees[node].status(c.now())["summer"] == node]
    assert summers == sorted(g[0] for g in _groups(c.ids))       # the first of every group
    assert len(summers) == -(-1000 // FAN_IN)


def test_a_change_reaches_every_limiter_in_three_rounds():
    c = Cluster(300)
    for _ in range(5):
        c.round()
    c.values[c.ids[123]] += 50.0
    for _ in range(3):          # published, at its summer, at the other summers
        c.round()
    assert not _exact(c.errors())
    c.round()                   # at every leaf
    assert _exact(c.errors())


def test_dead_summers_are_passed_over_and_their_groups_counted_again():
    c = Cluster(200)
    first, second = _groups(c.ids)[:2]
    c.dead = {first[0], second[0], second[1], second[-1]}     # two summers (one's successor too) and a leaf
    for _ in range(2 * (SWITCH + 1) + 6):      # two in a row to pass over, then the summers learn each other
        c.round()
    assert _exact(c.errors())
    assert {c.trees[node].remote(c.now()).nodes for node in c.ids if node not in c.dead} == {195}
    assert c.trees[second[3]].status(c.now()) == {"summer": second[2], "leaves": 0, "covers": 195,
                                                 "passed_over": [second[0], second[1]]}


def test_a_summer_that_leaves_hands_its_group_on_and_nobody_is_counted_twice():
    c = Cluster(40)
    for _ in range(4):
        c.round()
    gone = _groups(c.ids)[0][0]
    c.members = tuple(node for node in c.ids if node != gone)      # its group's next member sums
    c.dead = {gone}
    worst = 0.0
    for _ in range(6):
        c.round()
        worst = max([worst, *(e for e in c.errors().values() if e is not None)])
    assert worst <= c.values[gone] + 1e-9      # the leaver's own, for a round at most: never a leaf twice
    assert _exact(c.errors())


def test_a_total_counts_only_from_our_summer():
    c = Cluster(40)
    for _ in range(4):
        c.round()
    group = _groups(c.ids)[0]
    leaf = c.trees[group[3]]
    before = leaf.remote(c.now()).values[KEY]
    stranger = next(node for node in c.ids if node != group[0])
    leaf.receive(stranger, Sums(SumKind.TOTAL, 39, ((KEY, 0.0),)), c.now())       # a peer, not its summer
    assert leaf.remote(c.now()).values[KEY] == before
    leaf.receive(group[0], Sums(SumKind.TOTAL, 39, ((KEY, 1.0),)), c.now())       # its summer
    assert leaf.remote(c.now()).values[KEY] == 1.0


def test_sums_go_stale_after_fresh_intervals():
    c = Cluster(40)
    for _ in range(4):
        c.round()
    node = c.ids[3]
    assert c.trees[node].remote(c.now() + FRESH * INTERVAL) is not None
    assert c.trees[node].remote(c.now() + (FRESH + 1) * INTERVAL) is None


def _view(n_nodes: int, n_alive: int, remote: float, reserves: tuple[float, ...] | None = None) -> PeerView:
    members = tuple(f"n{i:04d}" for i in range(n_nodes))
    reserved = None if reserves is None else sum(reserves)
    return PeerView(members, {}, remote, n_alive, reserved, 0, reserves or ())


def test_apply_reads_the_tree_only_where_it_covers_the_alive_peers():
    c = Cluster(40)
    for _ in range(4):
        c.round()
    tree, now = c.trees[c.ids[3]], c.now()
    true = sum(c.values.values()) - c.values[c.ids[3]]
    assert math.isclose(tree.apply(_view(40, 39, 1.0), KEY, now).remote_sum, true)
    assert tree.apply(_view(41, 39, 1.0), 99, now).remote_sum == 0.0        # a class nobody publishes
    assert tree.apply(_view(45, 40, 1.0), KEY, now).remote_sum == 1.0       # more alive than it counts


def test_apply_keeps_reservations_only_for_the_peers_the_tree_misses():
    c = Cluster(40)
    for _ in range(4):
        c.round()
    tree, now = c.trees[c.ids[3]], c.now()
    # per-peer gossip has heard 30 of 39: the tree counts all 39, so none is reserved for
    view = tree.apply(_view(40, 30, 1.0, (5.0,) * 9), KEY, now)
    assert (view.n_alive, view.reserved_Bps, view.stale_reserves) == (39, 0.0, ())
    # 42 members, 9 not heard: the tree misses 2, whose reservations are the two largest
    view = tree.apply(_view(42, 32, 1.0, (9.0, 7.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0)), KEY, now)
    assert (view.n_alive, view.reserved_Bps) == (39, 16.0)
    view = tree.apply(_view(42, 32, 1.0), KEY, now)                          # the simulator's 1/N rule
    assert (view.n_alive, view.reserved_Bps) == (39, None)


def test_the_tree_runs_only_where_it_is_faster_than_per_peer_gossip():
    assert tree_wanted(n_peers=99, branching=3, reads_sum=True)
    assert not tree_wanted(n_peers=16, branching=16, reads_sum=True)       # a full mesh: one interval
    assert not tree_wanted(n_peers=99, branching=3, reads_sum=False)       # no class reads a sum


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 120), loss=st.floats(0.0, 0.5), dead=st.sets(st.integers(0, 119), max_size=20),
       rounds=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_under_any_loss_the_count_and_the_sum_agree(n, loss, dead, rounds, seed):
    """Every limiter publishes 1, so whatever the tree lost on the way, the sum a limiter reads
    is the number of limiters it says it counts: a value never travels without its count."""
    c = Cluster(n, seed=seed, loss=loss)
    c.values = dict.fromkeys(c.ids, 1.0)
    c.dead = {c.ids[i] for i in dead if i < n}
    for _ in range(rounds):
        c.round()
        for node in c.ids:
            if node not in c.dead and (got := c.trees[node].remote(c.now())) is not None:
                assert got.values.get(KEY, 0.0) == got.nodes >= 0
