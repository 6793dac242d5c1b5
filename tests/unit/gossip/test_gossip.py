"""Address parsing (agent/gossip/peers.py), the socket-free core (agent/gossip/core.py: sequencing,
loss, branching, routing, counters) over an in-memory network, and real UDP on
127.0.0.1 (agent/gossip/transport.py)."""
from __future__ import annotations

import math
import random
import socket
import time

import pytest

from drl.agent.gossip.core import GossipCore, Outgoing, Stats
from drl.agent.gossip.membership import Membership
from drl.agent.model import Envelope, Transfer
from drl.agent.gossip.peers import AddressError, Peer, format_addr, parse_hostport, parse_peers
from drl.agent.gossip import transport
from drl.agent.gossip.transport import Standalone, TransportError, UdpTransport
from drl.agent.gossip.wire import MAX_DATAGRAM, Batch, LimitNote

KEY = b"k" * 32


# -- addresses -------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("10.0.0.1:7000", ("10.0.0.1", 7000)),
    (" h1.example:65535 ", ("h1.example", 65535)),
    ("[::1]:7000", ("::1", 7000)),
    ("[fe80::1%eth0]:1", ("fe80::1%eth0", 1)),
])
def test_parse_hostport(text, expected):
    assert parse_hostport(text) == expected
    assert parse_hostport(format_addr(expected)) == expected


@pytest.mark.parametrize("text,message", [
    ("10.0.0.1", "expected HOST:PORT"),
    (":7000", "expected HOST:PORT"),
    ("[::1]7000", "expected HOST:PORT"),
    ("::1:7000", r"IPv6 address needs brackets: \[::1\]:7000"),
    ("h:0", "bad port"),
    ("h:70000", "bad port"),
    ("h:http", "bad port"),
])
def test_parse_hostport_errors(text, message):
    with pytest.raises(AddressError, match=message):
        parse_hostport(text)


def test_parse_peers():
    assert parse_peers("10.0.0.2:7000, b@[::1]:7001,") == [Peer(("10.0.0.2", 7000)), Peer(("::1", 7001), "b")]
    assert parse_peers("") == []
    with pytest.raises(AddressError, match="node id listed twice: b"):
        parse_peers("b@10.0.0.2:7000,b@10.0.0.3:7000")
    with pytest.raises(AddressError, match="empty node id"):
        parse_peers("@10.0.0.2:7000")
    with pytest.raises(AddressError, match=r"peer listed twice: \[::1\]:7001"):
        parse_peers("[::1]:7001,10.0.0.2:7000,[::1]:7001")
    with pytest.raises(AddressError, match="bad port"):
        parse_peers("10.0.0.2:7000,10.0.0.3:x")


# -- the core over an in-memory network ---------------------------------------------------------

def vals(values: dict) -> dict:
    """{class key: value} as publish wants it: every class active."""
    return {key: Outgoing(value) for key, value in values.items()}


def values_of(rx) -> list:
    return [(v.key, v.value) for v in rx.payload.values]


class Net:
    """Cores addressed "a", "b", ... with node ids "A", "B", ...; delivery is explicit."""

    def __init__(self, n: int, branching: int = 10, key: bytes | None = KEY):
        self.addrs = [chr(ord("a") + i) for i in range(n)]
        self.cores = {a: self.core(a, branching, key) for a in self.addrs}

    def core(self, addr, branching=10, key=KEY, incarnation=1):
        others = [p for p in self.addrs if p != addr]
        return GossipCore(addr.upper(), "c", key, others, branching, incarnation, random.Random(addr))

    def deliver(self, src, sent, now=0.0):
        return [rx for dst, data in sent
                if (rx := self.cores[dst].receive(data, src, now)) is not None]


def test_updates_reach_every_peer_in_a_mesh_and_ids_are_learned():
    net = Net(3)
    rxs = net.deliver("a", net.cores["a"].publish(vals({1: 10.0, 2: 20.0}), now=5.0))
    assert [(rx.header.dst, values_of(rx)) for rx in rxs] == [("", [(1, 10.0), (2, 20.0)])] * 2
    assert {rx.header.node for rx in rxs} == {"A"} and rxs[0].header.sent_at == 5.0
    # b has now learned that "a" is A, so its datagrams to a name the receiver
    rx = net.deliver("b", [s for s in net.cores["b"].publish({}, 6.0) if s[0] == "a"])[0]
    assert rx.header.dst == "A" and rx.payload == Batch()


def test_heartbeat_when_nothing_to_publish():
    net = Net(3)
    sent = net.cores["a"].publish({}, 0.0)
    assert len(sent) == 2
    assert all(rx.payload == Batch() for rx in net.deliver("a", sent))


def test_overdue_counts_the_peers_sent_to_before_but_not_within_the_gap():
    core = Net(4).cores["a"]                  # 3 peers
    core.branching = 1                        # one target a round
    assert core.overdue(100.0, 0.0) == 0      # none sent to yet: none overdue
    for t in (0.0, 1.0, 2.0):
        core.publish({}, t)                   # each peer once, round robin
    assert [core.overdue(2.5, gap) for gap in (0.4, 0.6, 1.6, 2.6)] == [3, 2, 1, 0]
    core.set_peers(list(core.peers)[:1])      # a removed peer is none of ours
    assert core.overdue(9.0, 0.0) == 1


def test_loss_detection_and_late_arrival():
    net = Net(2)
    a, b = net.cores["a"], net.cores["b"]
    stream = [a.publish(vals({1: float(i)}), i)[0][1] for i in range(6)]
    assert b.receive(stream[0], "a", 0).gap == 0
    assert b.receive(stream[3], "a", 3).gap == 2       # 1 and 2 lost
    assert b.stats.lost == 2
    late = b.receive(stream[1], "a", 4)
    assert late.gap == 0 and values_of(late) == [(1, 1.0)] and b.stats.lost == 1
    assert b.receive(stream[5], "a", 5).gap == 1
    assert b.stats.lost == 2 and b.stats.received == 4


def test_replays_and_bad_sources_are_rejected_and_counted():
    net = Net(3)
    a, b, c = (net.cores[x] for x in "abc")
    for core in (b, c):                       # let a learn B and C, so it fills in dst
        net.deliver(core.node_id.lower(), [s for s in core.publish({}, 0) if s[0] == "a"])
    sent = dict(a.publish(vals({1: 1.0}), 1.0))
    assert b.receive(sent["b"], "a", 1) is not None
    assert b.receive(sent["b"], "a", 1) is None                 # replay
    assert b.receive(sent["c"], "a", 1) is None                 # captured on the a->c link
    assert b.receive(sent["b"], "z", 1) is None                 # not a configured peer
    assert b.receive(b.publish({}, 1)[0][1], "a", 1) is None    # own datagram looped back
    assert b.receive(b"\x00" * 40, "a", 1) is None
    assert b.receive(sent["b"][:-1] + b"!", "a", 1) is None
    assert dict(b.stats.rejected) == {"replayed": 1, "wrong_dst": 1, "unknown_peer": 1, "loop": 1,
                                      "forged": 2}
    assert b.stats.received == 1


def test_a_capture_replayed_into_a_restarted_peer_is_refused_and_the_echo_says_who_hears_whom():
    """Datagrams name the receiver's life; a restarted receiver (a new incarnation, its replay
    windows empty) refuses everything sent to its previous one, values and transfers alike."""
    net = Net(2)
    a, b = net.cores["a"], net.cores["b"]
    net.deliver("b", b.publish({}, 0.0))                 # a hears B: its datagrams name B's life
    capture = [data for _, data in a.publish(vals({1: 9.0}), 0.5)]
    assert [rx.header.dst_incarnation for rx in net.deliver("a", [("b", d) for d in capture], 0.5)] == [1]
    net.cores["b"] = b2 = net.core("b", incarnation=2)    # b restarts
    assert [b2.receive(d, "a", 1.0) for d in capture] == [None]
    assert dict(b2.stats.rejected) == {"other_life": 1} and b2.stats.received == 0
    # a has not heard B's new life: it names none, and says it has not heard b for 1.5 s
    rx = net.deliver("b", b2.publish({}, 1.5), 1.5)[0]    # b2's datagram: never heard a
    assert rx.header.dst_incarnation == 0 and rx.header.dst_heard_ms == 2**32 - 1
    fresh = net.deliver("a", a.publish(vals({1: 9.0}), 2.0), 2.0)[0]
    assert fresh.header.dst_incarnation == 2 and fresh.header.dst_heard_ms == 500 and values_of(fresh) == [(1, 9.0)]


def test_wrong_key_changes_nothing():
    net = Net(2)
    intruder = GossipCore("A", "c", b"w" * 32, ["b"], 1, 1)
    b = net.cores["b"]
    assert net.deliver("a", intruder.publish(vals({1: 1e9}), 0)) == []
    assert b.stats.rejected == {"forged": 1} and b.stats.received == 0
    assert b.route(Envelope(Transfer(1, 1.0), dst="A"), 1, 0) is None   # nothing learned


def test_restarted_peer_gets_a_fresh_window_and_old_life_is_rejected():
    net = Net(2)
    b = net.cores["b"]
    old = net.cores["a"]
    first = [old.publish(vals({1: 1.0}), t)[0][1] for t in range(3)]
    assert b.receive(first[2], "a", 2) is not None
    reborn = net.core("a", incarnation=2)                   # seq starts at 1 again
    rx = b.receive(reborn.publish(vals({1: 5.0}), 3)[0][1], "a", 3)
    assert rx.header.incarnation == 2 and rx.header.seq == 1
    assert b.receive(first[0], "a", 4) is None               # a replay from the previous life
    assert b.stats.rejected == {"old_incarnation": 1}


def test_point_to_point_routing():
    net = Net(3)
    a = net.cores["a"]
    env = Envelope(Transfer(xfer_id=3, amount=2.5, link_total=7.5), dst="C")
    assert a.route(env, 4, 0) is None and a.stats.unroutable == 1
    net.deliver("c", [s for s in net.cores["c"].publish({}, 0) if s[0] == "a"])
    addr, data = a.route(env, 4, 1)
    rx = net.cores["c"].receive(data, "a", 1)
    assert addr == "c" and rx.header.class_id == 4
    assert rx.envelope == Envelope(Transfer(3, 2.5, 7.5), src="A")


def test_a_transfer_meant_for_a_previous_life_is_dropped():
    """Routed to the life we last heard; a restarted receiver must not credit it (its
    capacity came back another way: docs/allocators.md "Rejoin")."""
    net = Net(3)
    a = net.cores["a"]
    net.deliver("c", [s for s in net.cores["c"].publish({}, 0) if s[0] == "a"])   # a hears C's life 1
    env = Envelope(Transfer(xfer_id=3, amount=2.5, link_total=7.5), dst="C")
    _, data = a.route(env, 4, 1)
    assert net.cores["c"].receive(data, "a", 1) is not None          # the life it was meant for
    _, data = a.route(env, 4, 2)
    reborn = net.cores["c"] = net.core("c", incarnation=2)
    assert reborn.receive(data, "a", 2) is None and reborn.stats.rejected == {"other_life": 1}
    net.deliver("c", [s for s in reborn.publish({}, 3) if s[0] == "a"])                # a hears life 2
    assert reborn.receive(a.route(env, 4, 4)[1], "a", 4) is not None


@pytest.mark.parametrize("n_peers,branching", [(1, 1), (7, 1), (10, 3), (12, 4), (9, 8), (490, 3)])
def test_branching_picks_distinct_targets_and_serves_everyone_each_cycle(n_peers, branching):
    core = GossipCore("X", "c", None, list(range(n_peers)), branching, 1, random.Random(1))
    rounds = math.ceil(n_peers / branching)
    last = {p: -1 for p in range(n_peers)}
    worst = 0
    for t in range(20 * rounds):
        targets = core.targets()
        assert len(targets) == min(branching, n_peers) == len(set(targets))
        for p in targets:
            worst = max(worst, t - last[p])
            last[p] = t
    assert worst <= 2 * rounds     # the bound membership.liveness_timeout relies on


def test_branching_at_least_peers_is_a_mesh():
    core = GossipCore("X", "c", None, ["p", "q", "r"], 5, 1)
    assert [core.targets() for _ in range(3)] == [["p", "q", "r"]] * 3
    with pytest.raises(ValueError, match="branching must be >= 1"):
        GossipCore("X", "c", None, ["p"], 0, 1)


def test_targets_are_random():
    picks = {tuple(GossipCore("X", "c", None, list(range(50)), 3, 1, random.Random(s)).targets())
             for s in range(20)}
    assert len(picks) > 15


def test_counters_and_control_bandwidth():
    stats = Stats(window_s=2.0, overhead_bytes=28)
    core = GossipCore("A", "c", KEY, ["b", "c", "d"], 2, 1, stats=stats)
    sizes = []
    for t in range(10):                                  # 10 intervals of 0.5 s: 2 peers, both classes in one
        sent = core.publish(vals({1: 1.0, 2: 2.0}), t * 0.5)
        assert len(sent) == 2
        sizes.append(sum(len(data) for _, data in sent))
    assert stats.sent == 20 and stats.sent_bytes == sum(sizes)
    # the last 2 s hold 4 intervals (t = 3.0 .. 4.5) of 2 datagrams each
    assert stats.control_bps(4.5) == pytest.approx(8 * (sum(sizes[-4:]) + 8 * 28) / 2.0)
    assert stats.control_bps(100.0) == 0.0
    assert stats.as_dict(100.0)["sent"] == 20


# -- real UDP on loopback -----------------------------------------------------------------------

def bound(n, host="127.0.0.1"):
    """n sockets bound to free ports, handed to the transports as they are: no
    bind-close-rebind, so no other process can take a port in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind((host, 0))
    return socks, [s.getsockname()[1] for s in socks]


def udp(node, sock, peers, key=KEY, **kw):
    return UdpTransport(sock, [("127.0.0.1", p) for p in peers], node_id=node,
                        cluster="c", key=key, branching=kw.pop("branching", 3), incarnation=1, **kw)


def poll_until(transport, now, want, tries=100):
    """Loopback delivery is immediate on Linux; the retries only absorb scheduling noise."""
    got = transport.poll(now)
    for _ in range(tries - 1):
        if len(got) >= want:
            break
        time.sleep(0.01)
        got += transport.poll(now)
    return got


def test_udp_loopback_right_and_wrong_key():
    (sa, sb, sc), (pa, pb, pc) = bound(3)
    with udp("A", sa, [pb, pc]) as a, udp("B", sb, [pa, pc]) as b, \
            udp("C", sc, [pa, pb], key=b"w" * 32) as intruder:
        members = Membership("B", b.peer_addrs, timeout_s=1.0)
        a.publish(vals({1: 125000.0}), now=0.0)
        intruder.publish(vals({1: 9e9}), now=0.0)
        a.publish(vals({1: 250000.0}), now=0.1)
        rxs = poll_until(b, 0.1, 2)
        for rx in rxs:
            members.observe(rx, 0.1)
        assert [values_of(rx) for rx in rxs] == [[(1, 125000.0)], [(1, 250000.0)]]
        view = members.view(1, 0.1)
        assert view.remote_sum == 250000.0 and view.n_alive == 1
        assert view.members == ("?127.0.0.1:%d" % pc, "A", "B")
        assert b.stats.rejected == {"forged": 1} and b.stats.received == 2
        assert b.send(Envelope(Transfer(1, 10.0), dst="A"), 1, 0.2)
        [rx] = poll_until(a, 0.2, 1)
        assert rx.envelope == Envelope(Transfer(1, 10.0), src="B") and rx.header.dst == "A"


def test_udp_reads_a_bounded_number_a_poll_and_leaves_the_rest_queued():
    (sa, sb), (pa, pb) = bound(2)
    with udp("A", sa, [pb]) as a, udp("B", sb, [pa], queue_size=2) as b:
        for t in range(5):
            a.publish(vals({1: float(t)}), t)
        a.sock.sendto(b"x" * (MAX_DATAGRAM + 100), ("127.0.0.1", pb))
        time.sleep(0.05)
        polls = [[values_of(rx) for rx in b.poll(5.0)] for _ in range(4)]
        assert polls == [[[(1, 0.0)], [(1, 1.0)]], [[(1, 2.0)], [(1, 3.0)]], [[(1, 4.0)]], []]
        assert b.stats.rejected == {"oversized": 1} and b.stats.received == 5


def test_udp_counts_what_the_kernel_dropped_for_a_full_buffer_as_queue_full():
    (sa, sb), (pa, pb) = bound(2)
    with udp("A", sa, [pb]) as a, udp("B", sb, [pa]) as b:
        b.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)      # a few datagrams' room
        for t in range(200):
            a.publish(vals({1: float(t)}), t)
        time.sleep(0.05)
        first = len(b.poll(200.0))
        a.publish(vals({1: 200.0}), 200)      # stamped with the drops so far
        time.sleep(0.05)
        second = len(b.poll(201.0))
        assert 0 < first < 200 and second == 1
        assert b.stats.rejected == {"queue_full": 200 - first}


def test_udp_bind_errors_are_one_line():
    [sock], [port] = bound(1)
    with udp("A", sock, []):
        with pytest.raises(TransportError, match=f"cannot listen on 127.0.0.1:{port}: port already in use"):
            UdpTransport.bind(("127.0.0.1", port), [], node_id="B", cluster="c", key=None, branching=1,
                              incarnation=1)
    with pytest.raises(TransportError, match="address is not on this host"):
        UdpTransport.bind(("192.0.2.1", 7000), [], node_id="A", cluster="c", key=None, branching=1,
                          incarnation=1)
    with pytest.raises(TransportError, match="cannot resolve no-such-host.invalid:7000"):
        UdpTransport.bind(("127.0.0.1", 0), [("no-such-host.invalid", 7000)], node_id="A",
                          cluster="c", key=None, branching=1, incarnation=1)


def test_udp_peer_list_may_name_this_node():
    [sa], [pa] = bound(1)
    with udp("A", sa, [pa, 7001]) as a:
        assert list(a.peer_addrs) == [("127.0.0.1", 7001)] and ("127.0.0.1", 7001) in a.peer_addrs


def test_udp_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 on this host")
    (sa, sb), (pa, pb) = bound(2, "::1")
    with UdpTransport(sa, [("::1", pb)], node_id="A", cluster="c", key=KEY, branching=1,
                      incarnation=1) as a, \
            UdpTransport(sb, [parse_hostport(f"[::1]:{pa}")], node_id="B", cluster="c",
                         key=KEY, branching=1, incarnation=1) as b:
        a.publish({}, 0.0)
        [rx] = poll_until(b, 0.0, 1)
        assert rx.addr == ("::1", pa) and rx.payload == Batch()
        assert b.stats.overhead_bytes == 48


# -- the peer set changes at runtime (a registry's watch) -------------------------------------

def quiet(values: dict) -> dict:
    """{class key: value} with no demand: sent REPEATS times after a change, then resting."""
    return {key: Outgoing(value, active=False) for key, value in values.items()}


def test_targets_cover_joining_peers_within_one_cycle_and_never_a_removed_one():
    core = GossipCore("X", "c", None, list(range(9)), 3, 1, random.Random(1))
    for _ in range(4):
        core.targets()
    core.set_peers([p for p in range(12) if p != 4])
    served = [t for _ in range(4) for t in core.targets()]           # ceil(11 / 3) rounds
    assert set(served) == {p for p in range(12) if p != 4}
    assert all(4 not in core.targets() for _ in range(40))


def test_an_unchanged_peer_list_keeps_its_cycle():
    core, same = (GossipCore("X", "c", None, list(range(9)), 2, 1, random.Random(7)) for _ in range(2))
    picks = []
    for _ in range(10):
        core.set_peers(list(range(9)), timeout_s=5.0)         # the registry said the same again
        picks.append(core.targets())
    assert picks == [same.targets() for _ in range(10)] and core.timeout_s == 5.0


def test_a_joining_peer_gets_every_class_in_its_first_datagram():
    net = Net(3)
    a = net.cores["a"]
    classes = quiet({1: 1.0}) | vals({2: 2.0})

    def heard(t):
        return [values_of(rx) for rx in net.deliver("a", a.publish(classes, t))]

    a.set_peers(["b"])
    for t in range(12):
        heard(t)
    assert heard(12) == [[(2, 2.0)]]                           # class 1 has rested since
    a.set_peers(["b", "c"])
    assert heard(13) == [[(2, 2.0)], [(1, 1.0), (2, 2.0)]]     # to b, to c (new)
    assert heard(14) == [[(2, 2.0)]] * 2


def test_a_removed_peer_is_ignored_and_forgotten():
    net = Net(3)
    a, c = net.cores["a"], net.cores["c"]
    net.deliver("c", [s for s in c.publish({}, 0) if s[0] == "a"])        # a learns C
    a.announce(LimitNote(7, 2, 1.0), "c")
    a.set_peers(["b"])
    assert [addr for addr, _ in a.publish(vals({1: 1.0}), 1)] == ["b"]   # its pending note is gone too
    assert net.deliver("c", [s for s in c.publish({}, 1) if s[0] == "a"]) == []
    assert a.stats.rejected == {"unknown_peer": 1}
    assert a.route(Envelope(Transfer(1, 1.0), dst="C"), 1, 1) is None and "C" not in a._lives


def test_a_node_id_rejoining_at_a_new_address_speaks_only_from_there():
    net = Net(4)
    a, c = net.cores["a"], net.cores["c"]
    a.set_peers(["b", "c"], names={"b": "B", "c": "C"})
    assert net.deliver("c", [s for s in c.publish({}, 0) if s[0] == "a"])
    a.set_peers(["b", "d"], names={"b": "B", "d": "C"})                   # C came back on host d
    moved = GossipCore("C", "c", KEY, ["a"], 10, 2)                       # restarted there
    assert net.deliver("d", [s for s in moved.publish({}, 1) if s[0] == "a"])
    assert a.route(Envelope(Transfer(1, 1.0), dst="C"), 1, 1)[0] == "d"
    a.set_peers(["b", "c", "d"], names={"b": "B", "d": "C"})              # c is back, unnamed
    assert net.deliver("c", [s for s in c.publish({}, 2) if s[0] == "a"]) == []
    assert a.stats.rejected == {"wrong_sender": 1}                        # C is named at d


def test_a_peer_whose_lease_lapsed_keeps_hearing_us_when_it_comes_back():
    """b never dropped a: had a started its counters to b over, b would refuse them as replays
    (and its values as older ones) until they caught up."""
    net = Net(3)
    a, b = net.cores["a"], net.cores["b"]
    for t in range(5):
        assert net.deliver("a", [s for s in a.publish(vals({1: float(t)}), t) if s[0] == "b"])
    a.set_peers(["c"])
    a.set_peers(["b", "c"])
    [rx] = net.deliver("a", [s for s in a.publish(vals({1: 9.0}), 6) if s[0] == "b"])
    assert values_of(rx) == [(1, 9.0)] and rx.gap == 0 and rx.payload.values[0].seq == 6
    assert b.stats.rejected == {}


def test_the_link_counters_of_removed_peers_are_kept_for_a_bounded_few():
    core = GossipCore("X", "c", None, ["p"], 10, 1)
    core.publish(vals({1: 1.0}), 0)
    gone = [f"g{i}" for i in range(GossipCore.KEEP_GONE + 5)]
    for g in gone:                                      # each joins, hears us, and leaves
        core.set_peers(["p", g])
        core.publish(vals({1: 1.0}), 0)
    core.set_peers(["p"])
    assert set(core._seq) == {"p", *gone[-GossipCore.KEEP_GONE:]} == set(core._seqs)


def test_udp_set_peers_resolves_new_peers_only_and_keeps_the_unresolvable_as_members(monkeypatch):
    (sa, sb), (pa, pb) = bound(2)
    with udp("A", sa, []) as a, udp("B", sb, [pa]) as b:           # A started with a registry and no peers
        me, them, bad = ("127.0.0.1", pa), ("localhost", pb), ("no-such-host.invalid", 7000)
        members = a.set_peers({me: "A", them: "B", bad: "Z"})
        assert members == {("127.0.0.1", pb): "B", bad: "Z"}      # Z: never heard, so stale, counted in N
        assert list(a.peer_addrs) == [("127.0.0.1", pb)] and a.resolved == {me: me, them: ("127.0.0.1", pb)}
        assert list(a.unresolved) == [bad] and "cannot resolve" in a.unresolved[bad]
        a.publish(vals({1: 5.0}), 0.0)
        [rx] = poll_until(b, 0.0, 1)
        assert values_of(rx) == [(1, 5.0)]
        b.publish({}, 0.1)
        [rx] = poll_until(a, 0.1, 1)
        assert rx.header.node == "B"
        monkeypatch.setattr(transport, "_resolve", None)          # known peers: no DNS on the tick
        assert a.set_peers({them: "B"}) == {("127.0.0.1", pb): "B"} and a.unresolved == {}
        assert a.set_peers({}) == {} and len(a.peer_addrs) == 0


def test_a_standalone_agent_cannot_gain_peers():
    lone = Standalone()
    assert lone.set_peers({}) == {}
    with pytest.raises(TransportError, match="no gossip socket"):
        lone.set_peers({("10.0.0.2", 7000): "b"})
