"""Per-client counting, throttle and ban in bpf/limiter.c (docs/clients.md): h1 (10.0.0.1) -> h2.

Run: sudo .venv/bin/python -m pytest -q tests/kernel/test_datapath_clients.py

h2 answers on 10.0.0.2, and on 10.0.0.3 and 10.0.0.4 added here: three clients
of h1's egress classes in one /24.  A Datapath on h1's eth0, driven directly
(the agent's share and ban decisions are agent/clients/table.py's, tested apart).
"""
from __future__ import annotations

import ipaddress
import sys
import time

import pytest

from drl.agent import abi
from drl.agent.kernel.bucket import cost_ns, unit_times
from drl.agent.classes.spec import parse_classes
from drl.agent.clients.rules import client_rule, parse_client_key, parse_prefix, parse_threshold
from drl.agent.kernel.datapath import DatapathError
from drl.agent.model import Mode
from drl.lab.errors import LabError
from drl.lab.measure import tc_show
from drl.lab.metrics import within
from drl.lab.netns import poll
from drl.lab.traffic import udp_blast

pytestmark = pytest.mark.kernel

H2, H3, H4 = "10.0.0.2", "10.0.0.3", "10.0.0.4"
PAYLOAD = 100
FRAME4 = PAYLOAD + 8 + 20 + 14        # UDP + IPv4 + Ethernet
FRAME6 = PAYLOAD + 8 + 40 + 14


def rule(key: str = "dst/32", measure: str = "bytes", action: str = "throttle", exempt=(), window="1h"):
    """A rule over one hour: a test's packets all count (a window that ended a moment ago
    still weighs ~1), so counts are exact."""
    threshold = f"100MB/{window}" if measure == "bytes" else f"100000/{window}"
    return client_rule(parse_client_key(key), measure, parse_threshold(threshold), action,
                       exempt=[parse_prefix(e) for e in exempt])


def counts(dp, *clients: bytes) -> dict[bytes, int]:
    """The kernel's sliding counts of ``clients`` (those it has a window for), rounded."""
    return {c: round(n) for c, n in dp.client_counts(0, clients).items()}


def packed(addr: str, length: int) -> bytes:
    return ipaddress.ip_network(f"{addr}/{length}", strict=False).network_address.packed


@pytest.fixture
def lab(net):
    """The pair with h2's two more addresses, every one of them resolved from h1 (a packet
    that waits for ARP in the neighbour queue never reaches tc)."""
    h1, h2 = net.hosts
    for addr in (H3, H4):
        h2.run("ip", "addr", "add", f"{addr}/24", "dev", "eth0")
    for addr in (H2, H3, H4):
        h1.run("ping", "-c", "1", "-W", "2", addr)
    h1.run("ping", "-c", "1", "-W", "2", h2.addr6)
    return net


def send_udp(host, counts: dict[str, int], payload: int = PAYLOAD) -> None:
    """So many UDP datagrams from host to each address (port 9, nobody listens)."""
    sends = "; ".join(f"[s{':' in a:d}.sendto(bytes({payload}), ('{a}', 9)) for _ in range({n})]"
                      for a, n in counts.items())
    host.run("python3", "-c", "import socket; s0 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
             f"s1 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); {sends}")


def test_clients_are_counted_per_prefix_in_their_windows_and_flagged_at_the_line(lab, datapath):
    h1, h2 = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/32"), line=25 * FRAME4)
    with dp.batch():
        dp.set_class(0, Mode.PASS)          # set_class keeps the client rule, in a batch too
    every = [packed(H2, 32), packed(H3, 32), packed(H4, 32), packed(h2.addr6, 64)]
    send_udp(h1, {H2: 10, H3: 20, H4: 30, h2.addr6: 5})
    assert counts(dp, *every) == dict(zip(every, (10 * FRAME4, 20 * FRAME4, 30 * FRAME4, 5 * FRAME6)))
    assert dp.read_heavy() == {0: {packed(H4, 32)}} and dp.read_heavy() == {}   # at the line: once
    send_udp(h1, {H3: 7})
    assert counts(dp, packed(H3, 32)) == {packed(H3, 32): 27 * FRAME4}          # the window goes on
    assert dp.read_heavy() == {0: {packed(H3, 32)}}
    dp.forget_clients(0, [packed(H3, 32)])
    assert counts(dp, packed(H3, 32)) == {}                                     # starts over
    dp.set_client_rule(0, rule("dst/24/56", "packets"), line=1000)
    send_udp(h1, {H2: 1, H3: 2, H4: 3})
    assert counts(dp, packed(H2, 24), *every) == {packed(H2, 24): 6}            # one /24: one client
    dp.set_client_line(0, 6)
    send_udp(h1, {H2: 1})
    assert dp.read_heavy() == {0: {packed(H2, 24)}}
    c = dp.read_counters([0])[0]
    assert c.passed_packets == 79 and c.throttled_packets == c.banned_packets == 0, c


def test_a_sliding_window_weighs_the_window_before(lab, datapath):
    """A 1-s window: what came in the last window counts less the further into this one
    (agent/clients/table.py sliding_count on the kernel's two windows)."""
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/32", "packets", window="1s"))
    time.sleep(1.0 - (dp.now_ns() % 10**9) / 1e9 + 0.05)      # early in a window
    send_udp(h1, {H2: 100})
    sent_in = dp.now_ns() // 10**9
    for wait_s in (0.1, 0.4):
        time.sleep(max(0.0, (sent_in + 1) * 10**9 - dp.now_ns()) / 1e9 + wait_s)   # into the next window
        into = (dp.now_ns() % 10**9) / 1e9
        got = dp.client_counts(0, [packed(H2, 32)])[packed(H2, 32)]
        assert abs(got - 100 * (1 - into)) <= 2, (got, into)


_SERVE = """
import socket, sys, threading
s = socket.create_server(("", int(sys.argv[1])), family=socket.AF_INET6, dualstack_ipv6=True)
while True:
    s.accept()[0].close()
"""
_DIAL = """
import socket, sys
for addr in sys.argv[2:]:
    socket.create_connection((addr, int(sys.argv[1])), 2).close()
"""


def test_conns_count_tcp_syns_opened_and_accepted(lab, datapath):
    h1, h2 = lab.hosts
    for host in lab.hosts:
        host.popen(sys.executable, "-c", _SERVE, "7000")
    assert poll(lambda: h1.listening(7000) and h2.listening(7000), 5.0)
    dp = datapath(classes=parse_classes(["proto=tcp"]))
    dp.set_client_rule(0, rule("dst/32", "conns"))
    h1.run(sys.executable, "-c", _DIAL, "7000", *[H2] * 5, *[H3] * 3)    # SYNs out
    h2.run(sys.executable, "-c", _DIAL, "7000", h1.addr4, h1.addr4)      # SYN-ACKs out
    assert counts(dp, packed(H2, 32), packed(H3, 32)) == {packed(H2, 32): 7, packed(H3, 32): 3}


def test_a_throttled_client_gets_its_rate_and_the_others_all(lab, datapath):
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/32"))
    rate = 500_000                                            # bytes/s: 4 Mbit/s of 20 offered
    blasts = [udp_blast(h1, addr, 20e6, 6) for addr in (H2, H3)]
    time.sleep(0.5)                                           # both counted, known clear of limits
    dp.set_client_limits(0, {packed(H2, 32): (rate, rate)})
    time.sleep(1.0)
    clients = [packed(H2, 32), packed(H3, 32)]
    was, before, start = counts(dp, *clients), dp.read_counters([0])[0], time.monotonic()
    time.sleep(3.0)
    now, after = counts(dp, *clients), dp.read_counters([0])[0]
    elapsed = time.monotonic() - start
    clients = {c: (now[c] - was[c],) for c in clients}       # arrivals in the 3 s: one window of an hour
    for blast in blasts:
        blast.wait()
    throttled = after.throttled_bytes - before.throttled_bytes
    passed_h2 = clients[packed(H2, 32)][0] - throttled        # counts are arrivals, throttled or not
    assert within(passed_h2 / elapsed, rate, 0.10), passed_h2 / elapsed
    assert clients[packed(H3, 32)][0] / elapsed > 3 * rate, clients   # untouched
    assert after.passed_bytes - before.passed_bytes == pytest.approx(sum(c[0] for c in clients.values()) - throttled,
                                                                     rel=0.02)
    assert after.dropped_packets == 0


def test_a_client_is_held_from_the_line_in_debt_for_its_overshoot_until_the_agent_decides(lab, datapath):
    """A class that holds (hold: a count per window) gives a client whose count reaches the line
    a bucket at the hold's rate, in debt for what the packet that reached it took beyond the
    line: here 1 frame a second, and half a frame of debt.  The agent's limits keep that bucket;
    unlisting it, drop_holds and a new rule each let the client go."""
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    hold_rule = rule("dst/32")
    dp.set_client_rule(0, hold_rule, line=5.5 * FRAME4, hold=FRAME4 * hold_rule.window_s)

    def throttled_of(sends: dict[str, int]) -> int:
        before = dp.read_counters([0])[0].throttled_packets
        send_udp(h1, sends)
        return dp.read_counters([0])[0].throttled_packets - before

    assert throttled_of({H2: 5, H3: 6, H4: 6}) == 0           # the 6th reaches the line and passes
    assert dp.read_heavy() == {0: {packed(H3, 32), packed(H4, 32)}}
    assert throttled_of({H2: 1, H3: 1}) == 1                   # H2 at the line now: held from its next
    assert dp.read_heavy() == {0: {packed(H2, 32)}}
    time.sleep(0.6)                                            # the half-frame debt paid
    assert throttled_of({H3: 2}) == 1                          # one frame of credit, then its rate
    dp.set_client_limits(0, {packed(H3, 32): (FRAME4, FRAME4)})
    assert throttled_of({H3: 1}) == 1                          # the hold's bucket, kept
    dp.set_client_limits(0, {})
    dp.drop_holds(0, [packed(H2, 32)])
    assert throttled_of({H2: 3, H3: 3}) == 0                   # let go (flagged once a window)
    assert throttled_of({H4: 20}) >= 10                        # the kernel's own hold stays (1 frame/s)
    dp.set_client_rule(0, rule("dst/32", window="2h"), line=5.5 * FRAME4, hold=FRAME4 * 7200)
    assert throttled_of({H4: 3}) == 0                          # a new rule: counts and holds start over
    dp.set_client_rule(0, hold_rule, line=5.5 * FRAME4)        # no hold: flagged, not held
    assert throttled_of({H4: 9}) == 0 and dp.read_heavy() == {0: {packed(H4, 32)}}
    with pytest.raises(DatapathError, match="a hold of -1 is not a finite count"):
        dp.set_client_line(0, 1.0, hold=-1)


def test_a_full_map_of_client_buckets_or_bans_leaves_the_last_new_clients_out(datapath):
    """MAX_CLIENT_LIMITS buckets at most, the kernel's holds included, and MAX_CLIENT_BANS bans:
    the new clients past it are returned, in the order given, and the agent goes on; room
    comes back as clients go."""
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/32"))
    every = [bytes([10, 1 + i // 65536, i // 256 % 256, i % 256])
             for i in range(max(abi.MAX_CLIENT_LIMITS, abi.MAX_CLIENT_BANS) + 10)]
    many = every[:abi.MAX_CLIENT_LIMITS + 10]
    assert dp.set_client_limits(0, {c: (1000.0, 1000.0) for c in many}) == many[-10:]
    kept = {c: (2000.0, 1000.0) for c in many[10:]}             # the first ten go: room for the last
    assert dp.set_client_limits(0, kept) == []
    assert dp.set_client_limits(0, {}) == []
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    until, many = dp.now_ns() + 10**9, every[:abi.MAX_CLIENT_BANS + 10]
    assert dp.set_client_bans(0, dict.fromkeys(many, until)) == many[-10:]      # bans alike
    assert dp.set_client_bans(0, dict.fromkeys(many[10:], until)) == []


def test_a_stale_config_throttles_at_the_safe_rate(lab, datapath):
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/32", "packets"))
    dp.set_class(0, Mode.PASS, timeout_s=1.0)
    dp.set_client_limits(0, {packed(H2, 32): (10_000, 200)})       # packets/s; 1200-byte datagrams
    blast = udp_blast(h1, H2, 8e6, 5)                               # ~830 packets/s
    time.sleep(1.5)                                                 # no heartbeat: stale after 1 s
    was, before, start = counts(dp, packed(H2, 32)), dp.read_counters([0])[0], time.monotonic()
    time.sleep(3.0)
    now, after = counts(dp, packed(H2, 32)), dp.read_counters([0])[0]
    arrived, elapsed = now[packed(H2, 32)] - was[packed(H2, 32)], time.monotonic() - start
    blast.wait()
    assert within((arrived - (after.throttled_packets - before.throttled_packets)) / elapsed, 200, 0.10)


def test_a_ban_drops_both_ways_and_ends_by_itself(lab, datapath):
    h1, h2 = lab.hosts
    dp = datapath(classes=parse_classes(["dst=10.0.0.0/24"]))
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    assert "drl_ingress" in h1.run("tc", "filter", "show", "dev", "eth0", "ingress")
    send_udp(h1, {H2: 3})                                           # counted, known clear of bans
    until_ns = dp.now_ns() + 4 * 10**9
    dp.set_client_bans(0, {packed(H2, 32): until_ns})
    send_udp(h1, {H2: 10, H3: 10})
    with pytest.raises(LabError):                                   # its requests never reach h1
        h2.run("ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", H2, h1.addr4)
    h2.run("ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", H3, h1.addr4)   # another client of the class
    c = dp.read_counters([0])[0]
    assert (c.banned_packets, c.banned_bytes) == (12, 10 * FRAME4 + 2 * 98), c   # UDP out, pings in (frames)
    assert counts(dp, packed(H2, 32)) == {packed(H2, 32): 3 * FRAME4}        # what a ban drops is not counted
    time.sleep(max(0.0, (until_ns - dp.now_ns()) / 1e9) + 0.05)              # nothing written since
    h2.run("ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", H2, h1.addr4)
    assert dp.read_counters([0])[0].banned_packets == c.banned_packets


_COUNT_UDP = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("", 7946))
s.settimeout(2)
n = 0
try:
    while True:
        s.recv(2000)
        n += 1
except socket.timeout:
    print(n)
"""


def test_a_banned_peer_still_reaches_the_gossip_port(lab, datapath):
    """At ingress there is no mark yet: the agent's ports alone pass (limiter.c drl_ingress)."""
    h1, h2 = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]), gossip_port=7946)
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    dp.set_client_bans(0, {packed(H2, 32): dp.now_ns() + 60 * 10**9})
    receiver = h1.popen("python3", "-c", _COUNT_UDP, capture=True)
    assert poll(lambda: ":7946 " in h1.run("ss", "-Hlun"), 5.0)
    h2.run("python3", "-c", "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
           f"[s.sendto(bytes(100), ('{h1.addr4}', port)) for port in [7946] * 5 + [7947] * 4]")
    assert receiver.communicate(timeout=10)[0].strip() == "5"
    assert dp.read_counters([0])[0].banned_packets == 4


def test_exempt_addresses_are_nobodys_clients(lab, datapath):
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_client_rule(0, rule("dst/24", action="ban", exempt=[f"{H3}/32"]))
    dp.set_client_bans(0, {packed(H2, 24): dp.now_ns() + 60 * 10**9})
    send_udp(h1, {H2: 4, H3: 5})
    c = dp.read_counters([0])[0]
    assert (c.banned_packets, c.passed_packets) == (4, 5), c
    assert counts(dp, packed(H2, 24)) == {}


def test_ingress_filter_follows_ban_rules_and_detach_leaves_nothing(lab, datapath):
    h1, _ = lab.hosts

    def ingress() -> str:
        return h1.run("tc", "filter", "show", "dev", "eth0", "ingress")

    dp = datapath()
    dp.set_client_rule(0, rule("dst/32"))
    assert "drl_ingress" not in ingress()                  # throttle only: nothing at ingress
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    assert "drl_ingress" in ingress()
    h1.run("tc", "filter", "del", "dev", "eth0", "ingress")     # removed under us
    assert dp.ensure_attached() and "drl_ingress" in ingress()
    assert not dp.ensure_attached()
    dp.set_client_rule(0, None)
    assert "drl_ingress" not in ingress() and "drl_egress" in tc_show(h1, "filter")
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    dp.detach()
    assert "clsact" not in tc_show(h1, "qdisc")
    assert tc_show(h1, "filter").strip() == "" and ingress().strip() == ""


def test_a_class_without_a_client_rule_is_as_before(lab, datapath):
    h1, _ = lab.hosts
    dp = datapath(classes=parse_classes(["dst=10.0.0.2/32,proto=udp", "proto=udp"]))
    dp.set_client_rule(0, rule("dst/32", action="ban"))
    dp.set_client_bans(0, {packed(H2, 32): dp.now_ns() + 60 * 10**9})
    dp.set_class(1, Mode.BUCKET, rate_Bps=1e9)
    send_udp(h1, {H3: 10, H4: 5})
    assert counts(dp, packed(H3, 32), packed(H4, 32)) == {}
    c = dp.read_counters([1])[1]
    assert (c.passed_packets, c.passed_bytes) == (15, 15 * FRAME4) and c.banned_packets == 0, c
    dp.reset_class(0)                                      # a class id's reuse forgets the rule
    assert dp.read_heavy() == {} and "drl_ingress" not in h1.run("tc", "filter", "show", "dev", "eth0", "ingress")
    with pytest.raises(DatapathError, match="no client rule"):
        dp.client_counts(0, [packed(H2, 32)])


def test_unit_prices_fit_and_round_up():
    """A client's price per unit: bytes as a class's, packets and connections below one a second."""
    for measure, rate, units in (("bytes", 125_000, 1 << 20), ("packets", 0.5, 65535), ("conns", 0.01, 1)):
        price, depth_ns = unit_times(rate, 4, abi.MAX_NS_PER_UNIT[measure])
        assert price * rate >= 10**9 << abi.NS_FRAC_BITS or price == abi.MAX_NS_PER_UNIT[measure]
        assert units * price + (1 << abi.NS_FRAC_BITS) < 2**64
        assert depth_ns == min(abi.MAX_DEPTH_NS, cost_ns(4, price))
    assert unit_times(0, 4, abi.MAX_NS_PER_UNIT["conns"]) == (0, 0)
    assert unit_times(0.5, 4, abi.MAX_NS_PER_UNIT["packets"])[0] < abi.MAX_NS_PER_UNIT["packets"]  # 2 s a packet
