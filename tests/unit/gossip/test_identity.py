"""Peer identity in the gossip core (agent/gossip/core.py "Identity", agent/gossip/lives.py) and membership:
a node id is bound to its source address, and an incarnation that jumps cannot lock
the real peer out.  The forger here holds the cluster key (so the MAC passes) and
sends from a configured peer's address; nothing it says under another id may count.

In-memory addresses "a", "c" are peers of the victim B; node ids are upper case.
"""
from __future__ import annotations

import random

import pytest

from drl.agent.gossip.core import GossipCore, Outgoing
from drl.agent.gossip.lives import MAX_LIVES
from drl.agent.gossip.membership import Membership
from drl.agent.model import Envelope, Transfer
from drl.agent.gossip.wire import LimitNote

KEY = b"k" * 32
TIMEOUT = 0.3


def victim(names=None):
    """B, with peers at "a" and "c", and its membership."""
    core = GossipCore("B", "c", KEY, ["a", "c"], 10, 1, random.Random(1), names=names, timeout_s=TIMEOUT)
    return core, Membership("B", ["a", "c"], TIMEOUT, names=names)


def speaker(node, incarnation=1):
    """Anyone holding the key, speaking to B as ``node``."""
    return GossipCore(node, "c", KEY, ["b"], 1, incarnation, random.Random(node))


def say(core, value, now, note: LimitNote | None = None) -> bytes:
    if note:
        core.announce(note, "b")
    [(_, data)] = core.publish({7: Outgoing(value)}, now)
    return data


def hear(b, members, data, addr, now):
    rx = b.receive(data, addr, now)
    if rx is not None:
        members.observe(rx, now)
    return rx


def state(b, members, now):
    """Everything a forged datagram must leave alone."""
    view = members.view(7, now)
    lives = {node: (ls.current, ls.floor, {inc: (life.window.top, life.window.bits, life.heard)
                                           for inc, life in ls.lives.items()})
             for node, ls in b._lives.items()}
    return (members.status(now), view.members, view.remote_sum, view.n_alive, dict(b._addr_of), dict(b._node_at),
            dict(b._heard), lives, b.stats.received, b.stats.lost, set(b._full))


NAMED = {"a": "A", "c": "C"}


def test_a_foreign_id_from_a_named_peers_address_is_rejected_counted_and_changes_nothing():
    b, members = victim(NAMED)
    a, c = speaker("A"), speaker("C")
    assert hear(b, members, say(a, 100.0, 0.0), "a", 0.0) and hear(b, members, say(c, 200.0, 0.0), "c", 0.0)
    before = state(b, members, 0.1)
    forger = speaker("C", incarnation=2**50)           # C's id, a higher incarnation, a new limit
    forged = say(forger, 2.0**40, 0.1, LimitNote(7, 99, 1e6))
    assert hear(b, members, forged, "a", 0.1) is None  # from A's address
    assert b.stats.rejected == {"wrong_sender": 1}
    assert state(b, members, 0.1) == before            # no slot renamed, no value, window or incarnation touched
    assert members.view(7, 0.1).members == ("A", "B", "C") and members.view(7, 0.1).remote_sum == 300.0
    # the real peers go on as if nothing happened: no gap, no old_incarnation
    assert hear(b, members, say(a, 110.0, 0.2), "a", 0.2).gap == 0
    assert hear(b, members, say(c, 210.0, 0.2), "c", 0.2).gap == 0
    assert b.stats.rejected == {"wrong_sender": 1} and b.stats.received == 4


def test_a_named_id_from_another_configured_address_is_rejected():
    b, members = victim(NAMED)
    a = speaker("A")
    assert hear(b, members, say(a, 100.0, 0.0), "a", 0.0)
    assert hear(b, members, say(speaker("A", 5), 2.0**40, 0.1), "c", 0.1) is None
    assert hear(b, members, say(speaker("A", 5), 2.0**40, 5.0), "c", 5.0) is None    # however long A is silent
    assert b.stats.rejected == {"wrong_sender": 2}
    assert [r["node_id"] for r in members.status(5.0)] == ["A", "C"]
    assert b.route(Envelope(Transfer(1, 1.0), dst="A"), 7, 5.0)[0] == "a"


def test_named_peers_are_addressed_before_they_are_heard():
    b, _ = victim(NAMED)
    assert b.route(Envelope(Transfer(1, 1.0), dst="C"), 7, 0.0)[0] == "c"
    [rx] = [speaker_rx for addr, data in b.publish({}, 0.0) if addr == "c"
            for speaker_rx in [GossipCore("C", "c", KEY, ["b"], 1, 1).receive(data, "b", 0.0)]]
    assert rx.header.dst == "C"                        # names the receiver from the first datagram


def test_an_unnamed_peers_learned_id_is_bound_until_its_address_is_stale():
    b, members = victim()
    a = speaker("A")
    assert hear(b, members, say(a, 100.0, 0.0), "a", 0.0)
    assert hear(b, members, say(speaker("X"), 2.0**40, 0.1), "a", 0.1) is None     # another id at A's address
    assert hear(b, members, say(speaker("A", 9), 2.0**40, 0.1), "c", 0.1) is None  # A's id from elsewhere
    assert b.stats.rejected == {"wrong_sender": 2}
    assert members.view(7, 0.1).members == ("?c", "A", "B") and members.view(7, 0.1).remote_sum == 100.0
    assert hear(b, members, say(a, 100.0, 0.25), "a", 0.25)                     # A keeps it bound
    assert hear(b, members, say(speaker("X"), 5.0, 0.5), "a", 0.5) is None
    # A silent for longer than the timeout: a host that really replaced it joins
    rx = hear(b, members, say(speaker("X"), 5.0, 0.6), "a", 0.6)
    assert rx and members.view(7, 0.6).members == ("?c", "B", "X") and members.view(7, 0.6).remote_sum == 5.0
    assert b.route(Envelope(Transfer(1, 1.0), dst="A"), 7, 0.6) is None
    # ... and A, moved to c, may speak from there now that its old binding is gone
    assert hear(b, members, say(a, 1.0, 0.7), "c", 0.7)
    assert members.view(7, 0.7).members == ("A", "B", "X")


def test_a_forged_higher_incarnation_locks_the_real_peer_out_for_at_most_the_timeout():
    b, members = victim(NAMED)
    a = speaker("A", incarnation=1000)
    t = 0.0
    for _ in range(5):
        assert hear(b, members, say(a, 100.0, t), "a", t)
        t = round(t + 0.1, 3)
    forger = speaker("A", incarnation=2**50)             # the key, A's address and A's id: accepted
    forged = say(forger, 2.0**40, t)
    assert hear(b, members, forged, "a", t)
    assert members.view(7, t).remote_sum == 2.0**40
    last_forged, recovered = t, None
    while recovered is None:
        t = round(t + 0.1, 3)
        rx = hear(b, members, say(a, 100.0, t), "a", t)
        if rx is not None:
            recovered = t
    assert set(b.stats.rejected) == {"old_incarnation"} and b.stats.rejected["old_incarnation"] >= 2
    assert recovered - last_forged <= TIMEOUT + 0.1      # within the liveness timeout (+ one interval)
    view = members.view(7, t)
    assert view.remote_sum == 100.0 and view.n_alive == 1     # the forged life's values are gone
    assert members.status(t)[0]["incarnation"] == 1000
    assert "a" in b._full                                # A gets every class again, as after a restart


def test_replays_stay_rejected_across_the_switch_between_lives():
    b, members = victim(NAMED)
    a = speaker("A", incarnation=1000)
    before = [say(a, 100.0, 0.1 * i) for i in range(3)]
    for i, data in enumerate(before):
        assert hear(b, members, data, "a", 0.1 * i)
    forger = speaker("A", incarnation=2**50)
    forged = say(forger, 2.0**40, 0.3)
    assert hear(b, members, forged, "a", 0.3)
    shouted_down = say(a, 100.0, 0.4)
    assert hear(b, members, shouted_down, "a", 0.4) is None      # old_incarnation, but seen
    assert hear(b, members, say(a, 100.0, 0.7), "a", 0.7)        # forged life silent: A is back
    b.stats.rejected.clear()
    for data in (*before, shouted_down):                         # A's own datagrams again
        assert hear(b, members, data, "a", 0.8) is None
    assert b.stats.rejected == {"replayed": 4}
    # the forged datagram replayed: it is the higher life again, but its window remembers it
    assert hear(b, members, forged, "a", 0.8) is None and b.stats.rejected["replayed"] == 5
    assert hear(b, members, say(a, 100.0, 0.9), "a", 0.9)        # and did not shout A down
    assert members.view(7, 0.9).remote_sum == 100.0


def test_a_real_restart_after_a_forged_jump_is_accepted():
    b, members = victim(NAMED)
    assert hear(b, members, say(speaker("A", 1000), 100.0, 0.0), "a", 0.0)
    assert hear(b, members, say(speaker("A", 2**50), 2.0**40, 0.1), "a", 0.1)
    reborn = speaker("A", 2000)                          # above A's old life, below the forged one
    assert hear(b, members, say(reborn, 50.0, 0.2), "a", 0.2) is None
    assert hear(b, members, say(reborn, 50.0, 0.5), "a", 0.5)
    assert members.view(7, 0.5).remote_sum == 50.0 and members.status(0.5)[0]["incarnation"] == 2000


def test_many_forged_lives_cannot_crowd_out_the_real_one():
    b, members = victim(NAMED)
    a = speaker("A", incarnation=1000)
    assert hear(b, members, say(a, 100.0, 0.0), "a", 0.0)
    for i in range(2 * MAX_LIVES):                       # a burst of lives, all above A's
        hear(b, members, say(speaker("A", 2**50 + i), 2.0**40, 0.05), "a", 0.05)
    assert len(b._lives["A"].lives) == MAX_LIVES and 1000 in b._lives["A"].lives
    t = 0.1
    while hear(b, members, say(a, 100.0, t), "a", t) is None:    # A keeps speaking, shouted down
        t = round(t + 0.1, 3)
    assert t <= 0.05 + TIMEOUT + 0.1
    # more lives later: the silent forged ones make room, A's life stays
    for i in range(2 * MAX_LIVES):
        hear(b, members, say(speaker("A", 2**51 + i), 2.0**40, t), "a", t)
    assert 1000 in b._lives["A"].lives and b._lives["A"].floor < 1000
    while hear(b, members, say(a, 100.0, t), "a", t) is None:
        t = round(t + 0.1, 3)
    assert members.view(7, t).remote_sum == 100.0


def test_restarts_forget_old_lives_and_their_datagrams_stay_old():
    b, members = victim(NAMED)
    first = [say(speaker("A", 1), 1.0, 0.0)]
    assert hear(b, members, first[0], "a", 0.0)
    t = 0.0
    for inc in range(2, 2 + 2 * MAX_LIVES):              # restart after restart
        t += 1.0
        assert hear(b, members, say(speaker("A", inc), float(inc), t), "a", t)
    lives = b._lives["A"]
    assert len(lives.lives) <= MAX_LIVES and lives.floor >= 1
    t += 5.0                                             # even with the current life silent
    assert hear(b, members, first[0], "a", t) is None and b.stats.rejected == {"old_incarnation": 1}


@pytest.mark.parametrize("names", [NAMED, None])
def test_insecure_mode_binds_identities_too(names):
    b = GossipCore("B", "c", None, ["a", "c"], 10, 1, names=names, timeout_s=TIMEOUT)
    a = GossipCore("A", "c", None, ["b"], 1, 1)
    assert b.receive(a.publish({}, 0.0)[0][1], "a", 0.0)
    assert b.receive(GossipCore("C", "c", None, ["b"], 1, 1).publish({}, 0.1)[0][1], "a", 0.1) is None
    assert b.stats.rejected == {"wrong_sender": 1}


def test_udp_transport_binds_the_names_it_is_given_as_resolved_addresses():
    import socket
    import time

    from drl.agent.gossip.transport import UdpTransport
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    pa, pb, pc = (s.getsockname()[1] for s in socks)
    kw = dict(cluster="c", key=KEY, branching=3, incarnation=1)
    with UdpTransport(socks[0], [("127.0.0.1", pb)], node_id="A", **kw) as a, \
            UdpTransport(socks[2], [("127.0.0.1", pb)], node_id="A", **kw) as impostor, \
            UdpTransport(socks[1], [("localhost", pa), ("127.0.0.1", pc)], node_id="B",
                         names={("localhost", pa): "A"}, timeout_s=TIMEOUT, **kw) as b:
        impostor.publish({}, 0.0)            # "A" from c's address
        a.publish({}, 0.0)
        got = []
        for _ in range(100):
            got += b.poll(0.0)
            if len(got) + sum(b.stats.rejected.values()) >= 2:
                break
            time.sleep(0.01)
        assert [(rx.header.node, rx.addr) for rx in got] == [("A", ("127.0.0.1", pa))]
        assert b.stats.rejected == {"wrong_sender": 1}
