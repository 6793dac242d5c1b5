"""agent/gossip/membership.py with a fake clock: liveness timeouts, the 1/N stale policy, recovery,
restarts, newest-wins updates, and the drlctl status rows."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.gossip.core import Received
from drl.agent.gossip.membership import Membership, liveness_timeout
from drl.agent.model import Local, Snapshot, Transfer, effective_limit
from drl.agent.gossip.wire import Batch, ClassValue, Header

PEERS = [("10.0.0.2", 7000), ("10.0.0.3", 7000), ("10.0.0.4", 7000)]
GLOBAL_BPS = 1_200_000.0


class Peer:
    """Builds what gossip would hand membership for one peer."""

    def __init__(self, addr, node, incarnation=1):
        self.addr, self.node, self.incarnation, self.seq = addr, node, incarnation, 0

    def rx(self, payload, class_id=1, seq=None, gap=0):
        """A datagram carrying ``payload``; a number is that class's value in a Batch,
        whose per-class seq is the datagram's here."""
        self.seq = seq if seq is not None else self.seq + 1
        h = Header(cluster="c", node=self.node, seq=self.seq, incarnation=self.incarnation, sent_at=0.0)
        if isinstance(payload, float):
            payload = Batch((ClassValue(class_id, self.seq, payload),))
        return Received(h, payload, self.addr, gap)


def limit(view):
    snap = Snapshot(now=0.0, node_id="n1", interval_s=0.1, global_Bps=GLOBAL_BPS,
                    local=Local(demand_Bps=0.0), view=view)
    return effective_limit(snap)


@pytest.fixture
def m():
    return Membership("n1", PEERS, timeout_s=0.3)


def test_unheard_peers_are_stale_placeholders_and_n_is_from_config(m):
    view = m.view(1, now=0.0)
    assert view.members == ("?10.0.0.2:7000", "?10.0.0.3:7000", "?10.0.0.4:7000", "n1")
    assert view.n_nodes == 4 == m.n_nodes and view.n_alive == 0 and view.remote_sum == 0.0
    assert all(not p.alive and p.age_s == math.inf for p in view.peers.values())
    assert limit(view) == GLOBAL_BPS / 4          # until peers are heard, enforce our 1/N share


def test_timeout_zeroes_stale_values_shrinks_the_limit_and_recovers(m):
    n2, n3, n4 = (Peer(a, f"n{i + 2}") for i, a in enumerate(PEERS))
    m.observe(n2.rx(100.0), 0.0)
    m.observe(n3.rx(200.0), 0.0)
    m.observe(n4.rx(400.0), 0.0)
    view = m.view(1, 0.3)                           # exactly at the timeout: still alive
    assert view.members == ("n1", "n2", "n3", "n4")
    assert view.remote_sum == 700.0 and view.n_alive == 3 and limit(view) == GLOBAL_BPS
    m.observe(n2.rx(Batch()), 0.2)  # heartbeats keep a peer alive
    m.observe(n3.rx(250.0), 0.25)
    view = m.view(1, 0.4)                           # n4 silent for 0.4 s > 0.3 s
    assert view.peers["n4"] == type(view.peers["n4"])("n4", 0.0, False, 0.4, incarnation=1)   # its life goes on
    assert view.remote_sum == 350.0 and view.n_alive == 2 and view.n_stale == 1
    assert limit(view) == pytest.approx(GLOBAL_BPS * 3 / 4)   # one 1/N share gone (§5.6)
    view = m.view(1, 10.0)                          # everyone gone: the 1/N limiter
    assert view.remote_sum == 0.0 and limit(view) == GLOBAL_BPS / 4
    m.observe(n4.rx(50.0), 10.0)            # recovery
    view = m.view(1, 10.1)
    assert view.peers["n4"].alive and view.remote_sum == 50.0 and view.n_alive == 1


def test_values_are_per_class_and_newest_wins(m):
    n2 = Peer(PEERS[0], "n2")
    m.observe(n2.rx(5.0, class_id=1, seq=5), 0.0)
    m.observe(n2.rx(9.0, class_id=2, seq=6), 0.0)
    m.observe(n2.rx(3.0, class_id=1, seq=4), 0.1)     # reordered, older: ignored
    assert m.view(1, 0.1).remote_sum == 5.0
    assert m.view(2, 0.1).remote_sum == 9.0
    assert m.view(3, 0.1).remote_sum == 0.0 and m.view(3, 0.1).n_alive == 1
    m.observe(n2.rx(Transfer(1, 1.0), class_id=1, seq=7), 0.2)  # envelopes: alive, no value
    assert m.view(1, 0.45).peers["n2"].alive and m.view(1, 0.45).remote_sum == 5.0


def test_restarted_peer_starts_clean(m):
    old = Peer(PEERS[0], "n2", incarnation=1)
    m.observe(old.rx(5.0, class_id=1, seq=900), 0.0)
    m.observe(old.rx(6.0, class_id=2, seq=901), 0.0)
    new = Peer(PEERS[0], "n2", incarnation=2)
    m.observe(new.rx(7.0, class_id=1), 1.0)            # seq 1 < 900, but a new life
    assert m.view(1, 1.0).remote_sum == 7.0
    assert m.view(2, 1.0).remote_sum == 0.0                    # class 2 value died with n2's old life


def test_new_node_id_at_an_address_replaces_the_old(m):
    m.observe(Peer(PEERS[0], "n2").rx(5.0), 0.0)
    m.observe(Peer(PEERS[0], "n9").rx(1.0), 0.1)
    view = m.view(1, 0.1)
    assert "n2" not in view.peers and view.peers["n9"].value == 1.0 and view.n_nodes == 4
    m.observe(Peer(PEERS[1], "n9").rx(2.0), 0.2)      # n9 moved: old slot reverts
    assert m.view(1, 0.2).members == ("?10.0.0.2:7000", "?10.0.0.4:7000", "n1", "n9")


def test_unknown_address_is_ignored(m):
    m.observe(Peer(("10.9.9.9", 1), "x").rx(1e9), 0.0)
    assert m.view(1, 0.0).remote_sum == 0.0 and "x" not in m.view(1, 0.0).members


def test_status_rows(m):
    m.observe(Peer(PEERS[1], "n3").rx(1.0, gap=2), 1.0)
    rows = m.status(1.5)
    assert rows[1] == {"node_id": "n3", "address": "10.0.0.3:7000", "state": "stale",
                       "last_seen_s": 0.5, "incarnation": 1, "lost": 2, "hears_us": False}
    assert rows[0]["state"] == "stale" and rows[0]["last_seen_s"] is None
    assert m.status(1.2)[1]["state"] == "alive"


def test_liveness_timeout():
    assert liveness_timeout(0.1, n_peers=1, branching=3) == pytest.approx(0.3)      # mesh: 3 intervals
    assert liveness_timeout(0.1, n_peers=9, branching=3) == pytest.approx(0.9)      # 3 cycles of 3
    assert liveness_timeout(0.1, n_peers=489, branching=3, misses=5) == pytest.approx(81.5)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Membership("n1", PEERS, 0.0)


def test_each_class_counts_its_own_lost_values(m):
    n2 = Peer(PEERS[0], "n2")
    for class_seq in (1, 2, 5):                       # class 7: 3 and 4 lost
        m.observe(n2.rx(Batch((ClassValue(7, class_seq, 1.0), ClassValue(8, 1 + class_seq // 5, 2.0)))), 0.0)
    assert m.class_lost[7] == 2 and m.class_lost[8] == 0
    assert m.view(7, 0.0).remote_sum == 1.0 and m.view(8, 0.0).remote_sum == 2.0


def test_named_slots_keep_their_id():
    """gossip.py rejects these (wrong_sender) before membership; membership ignores them too."""
    m = Membership("n1", PEERS, 0.3, names={PEERS[0]: "n2", PEERS[1]: "n3"})
    m.observe(Peer(PEERS[0], "n2").rx(5.0), 0.0)
    m.observe(Peer(PEERS[0], "n9").rx(1e9), 0.1)     # another id at n2's address
    m.observe(Peer(PEERS[2], "n3").rx(1e9), 0.1)     # n3 from an unnamed address
    view = m.view(1, 0.1)
    assert view.members == ("?10.0.0.4:7000", "n1", "n2", "n3") and view.remote_sum == 5.0 and view.n_alive == 1


def test_a_lower_incarnation_gossip_accepts_again_replaces_the_higher_ones_values(m):
    """gossip.py accepts a lower incarnation again once a (forged) higher one is silent."""
    m.observe(Peer(PEERS[0], "n2", incarnation=1000).rx(5.0, seq=50), 0.0)
    m.observe(Peer(PEERS[0], "n2", incarnation=2**50).rx(9e9, seq=10**6), 0.1)
    m.observe(Peer(PEERS[0], "n2", incarnation=1000).rx(6.0, seq=60), 0.5)
    assert m.view(1, 0.5).remote_sum == 6.0 and m.status(0.5)[0]["incarnation"] == 1000


# -- the stale rule counts what a silent peer's datapath may still pass -----------------------

def test_a_silent_peer_counts_its_last_local_limit_or_more_until_its_fail_safe_then_the_safe_rate():
    m = Membership("n1", PEERS, timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
    n2, n3, n4 = Peer(PEERS[0], "n2"), Peer(PEERS[1], "n3"), Peer(PEERS[2], "n4")
    m.observe(n2.rx(Batch((ClassValue(1, 1, 5.0, local_Bps=600_000.0),))), 0.0)
    m.observe(n3.rx(Batch((ClassValue(1, 1, 5.0, local_Bps=100_000.0),))), 0.0)
    safe = GLOBAL_BPS / 3                                          # 400 kB/s

    def reserved(t):
        m.observe(n4.rx(Batch(())), t)                             # n4 heard throughout: we are not deaf
        return m.view(1, t, safe_Bps=safe).reserved_Bps
    assert reserved(0.2) == 0.0                                    # both alive
    # stale: what they may still pass, the safe rate at least (alive and unheard, each holds
    # itself to it: model.heard_cap)
    assert reserved(1.0) == 600_000 + safe
    assert reserved(1.8) == 600_000 + safe                         # either side of a fail-safe: the larger
    assert reserved(2.4) == 2 * safe                               # fail-safes surely on
    m.observe(n4.rx(Batch(())), 1.0)
    snap = Snapshot(now=1.0, node_id="n1", interval_s=0.1, global_Bps=GLOBAL_BPS,
                    local=Local(demand_Bps=0.0), view=m.view(1, 1.0, safe_Bps=safe))
    assert effective_limit(snap) == GLOBAL_BPS - 1_000_000         # never more than the rest can pass
    assert m.view(1, 1.0).reserved_Bps is None and limit(m.view(1, 1.0)) == GLOBAL_BPS / 2   # the 1/N rule


def test_a_host_that_hears_no_peer_reserves_each_its_safe_rate_and_keeps_its_own():
    """Deaf (or the last one alive): what the peers last told does not starve it (issue 43:
    0.1 Mbit/s for 2 s), whatever they told; with N = 1 nothing is reserved."""
    safe = GLOBAL_BPS / 3
    for told in (0.0, 600_000.0, GLOBAL_BPS, 1e15, math.nan, math.inf):
        m = Membership("n1", PEERS[:2], timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
        for i, peer in enumerate((Peer(PEERS[0], "n2"), Peer(PEERS[1], "n3"))):
            m.observe(peer.rx(Batch((ClassValue(1, 1, 5.0, local_Bps=told if i else 1.0),))), 0.0)
        for t in (0.31, 1.0, 2.4, 60.0):
            view = m.view(1, t, safe_Bps=safe)
            assert view.reserved_Bps == 2 * safe and view.stale_reserves == (safe, safe), (told, t)
            snap = Snapshot(t, "n1", 0.1, GLOBAL_BPS, Local(demand_Bps=0.0), view)
            assert effective_limit(snap) == pytest.approx(safe), (told, t)      # its own safe rate, at once
    alone = Membership("n1", [], timeout_s=0.3).view(1, 5.0, safe_Bps=GLOBAL_BPS)
    assert alone.reserved_Bps == 0.0 and limit(alone) == GLOBAL_BPS


def test_a_told_limit_beside_a_heard_peer_is_reserved_as_told_and_never_nan():
    """Not deaf: a dead peer's last local limit is what its datapath passes until its
    fail-safe, however large (a class in pass mode tells its demand); one that told nothing
    finite counts at the safe rate, so no sum is ever NaN."""
    safe = GLOBAL_BPS / 3
    for told, want in ((0.0, safe), (1e15, 1e15), (math.nan, safe), (math.inf, safe)):
        m = Membership("n1", PEERS[:2], timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
        n2, n3 = Peer(PEERS[0], "n2"), Peer(PEERS[1], "n3")
        m.observe(n2.rx(Batch((ClassValue(1, 1, 5.0, local_Bps=told),))), 0.0)
        m.observe(n3.rx(Batch(())), 1.0)
        view = m.view(1, 1.0, safe_Bps=safe)
        assert view.reserved_Bps == want and not math.isnan(limit(view)) and limit(view) >= 0.0, told
        m.observe(n3.rx(Batch(())), 2.5)
        assert m.view(1, 2.5, safe_Bps=safe).reserved_Bps == safe          # its fail-safe surely on


def test_a_silent_peer_keeps_the_safe_rate_of_the_limit_it_knew_when_the_limit_is_lowered():
    """Its kernel keeps the fail-safe it was given: counting it at the lowered limit's share
    let three hosts pass 2.97 Mbit/s under a 1.5 Mbit/s limit (a set after a SIGKILL)."""
    m = Membership("n1", PEERS[:2], timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
    n2, n3 = Peer(PEERS[0], "n2"), Peer(PEERS[1], "n3")
    old, new = 2e6 / 3, 0.5e6 / 3
    for t in (0.0, 0.1, 0.2):
        m.observe(n2.rx(Batch((ClassValue(1, 1 + int(t * 10), 5.0, local_Bps=300_000.0),))), t)
        m.observe(n3.rx(Batch((ClassValue(1, 1 + int(t * 10), 5.0, local_Bps=300_000.0),))), t)
        m.view(1, t, safe_Bps=old)
    for t in (0.3, 0.4, 0.5, 0.6, 0.7):          # the limit is lowered at 0.3; n3 hears it, n2 is dead
        m.observe(n3.rx(Batch((ClassValue(1, 10 + int(t * 10), 5.0, local_Bps=50_000.0),))), t)
        m.view(1, t, safe_Bps=new)
    assert m.view(1, 3.0, safe_Bps=new).reserved_Bps == old + new     # n2 at the old share, n3 the new
    assert m.view(1, 3.1, safe_Bps=new).reserved_Bps == old + new     # and stays so: its kernel keeps it
    m.observe(n2.rx(Batch((ClassValue(1, 30, 5.0, local_Bps=50_000.0),))), 3.2)    # n2 back: it heard it
    assert m.view(1, 6.0, safe_Bps=new).reserved_Bps == 2 * new


def test_a_limit_lowered_just_before_a_peer_fell_silent_is_one_it_may_not_have_heard():
    """Lowered at 0.15, n2's last datagram at 0.2: the change may not have reached it.  The
    ticks in between, with no peer stale yet, must not forget the older safe rate."""
    m = Membership("n1", PEERS[:1], timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
    n2 = Peer(PEERS[0], "n2")
    old, new = 4e5, 1e5
    m.observe(n2.rx(Batch((ClassValue(1, 1, 5.0, local_Bps=300_000.0),))), 0.0)
    m.view(1, 0.0, safe_Bps=old)
    m.observe(n2.rx(Batch((ClassValue(1, 2, 5.0, local_Bps=300_000.0),))), 0.2)
    for t in (0.15, 0.3, 0.45):
        m.view(1, t, safe_Bps=new)
    assert m.view(1, 3.0, safe_Bps=new).reserved_Bps == old


def test_a_peer_never_heard_or_silent_about_a_class_counts_the_safe_rate():
    m = Membership("n1", PEERS[:2], timeout_s=0.3, failsafe_s=2.0, slack_s=0.3)
    m.observe(Peer(PEERS[0], "n2").rx(Batch((ClassValue(7, 1, 5.0, local_Bps=900_000.0),))), 0.0)
    assert m.view(1, 1.0, safe_Bps=400_000.0).reserved_Bps == 2 * 400_000.0


# -- the peer set changes at runtime (a registry's watch) -------------------------------------

A, B, C, D = PEERS + [("10.0.0.5", 7000)]


def test_a_joining_peer_is_a_fresh_stale_slot_and_the_others_keep_theirs():
    m = Membership("n1", [A, B], 0.3, names={A: "n2", B: "n3"})
    m.observe(Peer(A, "n2", incarnation=5).rx(100.0, gap=2), 0.0)
    assert m.view(1, 0.1).n_nodes == 3
    m.set_peers({A: "n2", B: "n3", C: "n4"})
    view = m.view(1, 0.1)                            # same instant: the cached rows are not reused
    assert view.n_nodes == 4 == m.n_nodes and view.members == ("n1", "n2", "n3", "n4")
    assert view.remote_sum == 100.0 and view.n_alive == 1 and not view.peers["n4"].alive
    assert m.status(0.1)[0] == {"node_id": "n2", "address": "10.0.0.2:7000", "state": "alive",
                                "last_seen_s": 0.1, "incarnation": 5, "lost": 2, "hears_us": False}
    m.observe(Peer(C, "n4").rx(50.0), 0.2)
    assert m.view(1, 0.2).remote_sum == 150.0 and m.view(1, 0.2).n_alive == 2


def test_a_leaving_peer_is_gone_at_once_not_stale():
    m = Membership("n1", [A, B, C], 0.3, names={A: "n2", B: "n3", C: "n4"})
    for addr, node in ((A, "n2"), (B, "n3")):
        m.observe(Peer(addr, node).rx(100.0), 0.0)
    assert limit(m.view(1, 0.1)) == pytest.approx(GLOBAL_BPS * 3 / 4)     # n4 unheard: stale, its 1/N held back
    m.set_peers({A: "n2", C: "n4"})
    view = m.view(1, 0.1)
    assert view.members == ("n1", "n2", "n4") and view.n_nodes == 3 and view.remote_sum == 100.0
    m.set_peers({A: "n2"})
    assert limit(m.view(1, 0.1)) == GLOBAL_BPS                            # N = 2, both alive
    m.observe(Peer(B, "n3").rx(1e9), 0.2)                                  # gossip drops these; so do we
    assert m.view(1, 0.2).remote_sum == 100.0 and [r["node_id"] for r in m.status(0.2)] == ["n2"]


def test_a_lost_peer_stays_in_n_counts_while_heard_and_its_datapath_stays_reserved():
    """Gone from the registry without leaving: cut off from etcd (still heard) or killed
    (silent, its filter at its fail-safe rate): never more than the limit in total."""
    m = Membership("n1", [A, B], 0.3, names={A: "n2", B: "n3"}, failsafe_s=2.0)
    n2, n3 = Peer(A, "n2"), Peer(B, "n3")
    m.observe(n2.rx(100.0), 0.0)
    m.observe(n3.rx(200.0), 0.0)
    m.set_peers({A: "n2", B: "n3"}, lost=[B])
    assert m.n_nodes == 3                                      # its datapath counts: our safe rate G/3
    view = m.view(1, 0.1, safe_Bps=1000.0)                     # n3 still heard: it counts
    assert view.members == ("n1", "n2", "n3") and view.n_alive == 2 and view.remote_sum == 300.0
    m.observe(n2.rx(100.0), 2.9)
    view = m.view(1, 3.0, safe_Bps=1000.0)                     # n3 silent: out of the view ...
    assert view.members == ("n1", "n2") and view.n_alive == 1 and view.remote_sum == 100.0
    assert view.reserved_Bps == 1000.0                         # ... its fail-safe rate reserved
    assert [(r["node_id"], r["state"]) for r in m.status(3.0)] == [("n2", "alive"), ("n3", "lost")]
    m.set_peers({A: "n2", B: "n3"})                            # registered again: a member
    assert m.n_nodes == 3 and m.view(1, 1.0).members == ("n1", "n2", "n3")


def test_a_node_id_rejoining_at_a_new_address_is_a_fresh_slot_there():
    m = Membership("n1", [A, B], 0.3, names={A: "n2", B: "n3"})
    m.observe(Peer(A, "n2").rx(100.0), 0.0)
    m.set_peers({D: "n2", B: "n3"})
    view = m.view(1, 0.1)
    assert view.members == ("n1", "n2", "n3") and view.remote_sum == 0.0 and not view.peers["n2"].alive
    m.observe(Peer(A, "n2").rx(1e9), 0.1)                                  # the old address: not a peer
    m.observe(Peer(D, "n2", incarnation=2).rx(7.0), 0.1)
    assert m.view(1, 0.1).remote_sum == 7.0 and m.status(0.1)[0]["address"] == "10.0.0.5:7000"


def test_an_address_named_anew_starts_over_and_a_learned_id_named_elsewhere_reverts():
    m = Membership("n1", [A, B], 0.3)
    m.observe(Peer(A, "n2").rx(100.0), 0.0)
    m.observe(Peer(B, "n3").rx(200.0), 0.0)
    m.set_peers({A: "n2", B: None})                  # a learned id named as learned: the same peer
    assert m.view(1, 0.0).remote_sum == 300.0
    m.set_peers({A: "n9", B: None, C: "n3"})         # another host at A; n3 now lives at C
    view = m.view(1, 0.0)
    assert view.members == ("?10.0.0.3:7000", "n1", "n3", "n9") and view.remote_sum == 0.0
    m.set_peers({A: None, B: None, C: "n3"})         # a name dropped: the id stays, as learned
    assert m.view(1, 0.0).members == ("?10.0.0.3:7000", "n1", "n3", "n9")


def test_the_liveness_timeout_follows_n_when_the_caller_says_so():
    m = Membership("n1", [A], liveness_timeout(0.1, n_peers=1, branching=1), names={A: "n2"})
    m.observe(Peer(A, "n2").rx(1.0), 0.0)
    assert not m.view(1, 0.5).peers["n2"].alive                      # 3 intervals
    grown = {A: "n2", B: "n3", C: "n4"}
    m.set_peers(grown, timeout_s=liveness_timeout(0.1, n_peers=3, branching=1), slack_s=0.7)
    assert m.view(1, 0.5).peers["n2"].alive and m.timeout_s == pytest.approx(0.9) and m.slack_s == 0.7
    m.set_peers({A: "n2"})                                           # an explicit --peer-timeout: None keeps it
    assert m.timeout_s == pytest.approx(0.9)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        m.set_peers(grown, timeout_s=0.0)


# Random joins, leaves, moves and datagrams against a brute-force recomputation: a slot's
# history starts when its (address, id) pair last appeared, and only its own id's datagrams count.

IDS = ["n2", "n3", "n4", "n5", "n6"]
ADDRS = [("10.0.1.%d" % i, 7000) for i in range(6)]

peer_sets = st.dictionaries(st.sampled_from(IDS), st.sampled_from(ADDRS), max_size=5).map(
    lambda d: {addr: node for node, addr in d.items()})          # one id per address, as the registry has
events = st.lists(st.one_of(
    st.tuples(st.just("set"), peer_sets, st.sampled_from([None, 0.3, 0.6, 1.2])),
    st.tuples(st.just("rx"), st.sampled_from(ADDRS), st.sampled_from(IDS), st.integers(1, 3),
              st.sampled_from([1, 2]), st.floats(0.0, 100.0)),
    st.tuples(st.just("tick"), st.floats(0.0, 0.5))), max_size=40)


def brute_force(log, now, class_id):
    """(members, n_nodes, n_alive, remote_sum) recomputed from the whole log."""
    sets = [(i, peers, timeout) for i, (kind, peers, timeout, *_) in enumerate(log) if kind == "set"]
    peers, timeout = sets[-1][1], [t for _, _, t in sets if t][-1]
    n_alive, total = 0, 0.0
    for addr, node in peers.items():
        start = max(j for (_, before, _), (j, after, _) in zip(sets, sets[1:])      # when it last joined
                    if before.get(addr) != node and after.get(addr) == node)
        heard = [(t, inc, key, value) for kind, *rx in log[start:] if kind == "rx"
                 for (a, n, inc, key, value, t) in [rx] if (a, n) == (addr, node)]
        if heard and now - heard[-1][0] <= timeout:
            n_alive += 1
            life = itertools.takewhile(lambda h: h[1] == heard[-1][1], reversed(heard))   # since its last restart
            total += next((value for _, _, key, value in life if key == class_id), 0.0)    # seqs only grow here
    return tuple(sorted(["n1", *peers.values()])), 1 + len(peers), n_alive, total


@settings(max_examples=150, deadline=None)
@given(events=events)
def test_runtime_peer_changes_match_a_brute_force_recomputation(events):
    peers = {ADDRS[0]: "n2"}
    m = Membership("n1", list(peers), 0.3, names=peers)
    log, now, seq = [("set", {}, 0.3), ("set", peers, None)], 0.0, {}
    for kind, *args in events:
        if kind == "set":
            m.set_peers(args[0], timeout_s=args[1])
            log.append(("set", *args))
        elif kind == "rx":
            addr, node, inc, key, value = args
            seq[node] = seq.get(node, 0) + 1
            m.observe(Peer(addr, node, inc).rx(Batch((ClassValue(key, seq[node], value),)), seq=seq[node]), now)
            log.append(("rx", *args, now))      # datagrams from non-members or under a wrong id count nowhere
        else:
            now += args[0]
        for class_id in (1, 2):
            view = m.view(class_id, now)
            members, n_nodes, n_alive, total = brute_force(log, now, class_id)
            assert (view.members, view.n_nodes, view.n_alive) == (members, n_nodes, n_alive)
            assert view.remote_sum == pytest.approx(total)


def test_a_peer_that_says_it_does_not_hear_us_is_counted_in_unheard_by():
    """Its echo (dst_heard_ms) past the liveness timeout: it counts us stale, so we are held
    to our safe rate (model.heard_cap) however well we hear it; one that never heard us
    (no life of ours named) counts too, one that heard us lately does not."""
    m = Membership("n1", PEERS[:2], timeout_s=0.3)
    n2, n3 = Peer(PEERS[0], "n2"), Peer(PEERS[1], "n3")

    def rx(peer, heard_ms, incarnation=9):
        r = peer.rx(1.0)
        return dataclasses.replace(r, header=dataclasses.replace(r.header, dst_incarnation=incarnation,
                                                                 dst_heard_ms=heard_ms))

    m.observe(rx(n2, 100), 0.0)
    m.observe(rx(n3, 100), 0.0)
    assert m.view(1, 0.1).unheard_by == 0
    m.observe(rx(n2, 400), 0.2)                          # n2 has not heard us for 0.4 s > 0.3
    assert m.view(1, 0.2).unheard_by == 1
    m.observe(rx(n3, 0, incarnation=0), 0.2)             # n3 names no life of ours: never heard us
    assert m.view(1, 0.2).unheard_by == 2
    m.observe(rx(n2, 50), 0.3)
    assert m.view(1, 0.3).unheard_by == 1
    assert m.view(1, 0.9).unheard_by == 0                # stale peers are not asked: the stale rule covers them

