"""The real bpf/limiter.c on a veth pair: h1 (10.0.0.1) sends to h2 (10.0.0.2) through it.

Run: sudo .venv/bin/pytest -m kernel tests/kernel/test_datapath.py
Rates from iperf3 are goodput (TCP/UDP payload); the limiter counts L2
frames, which are ~4.5 % bigger for full-size TCP segments.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from drl.agent.model import Mode
from drl.agent.classes.spec import parse_class, parse_classes
from drl.lab.measure import tc_show
from drl.lab.netns import poll
from drl.lab.metrics import within
from drl.lab.traffic import iperf3, iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

MBIT = 1e6 / 8   # bytes/s


def wire_rate(dp, seconds: float, class_id: int = 0) -> float:
    """Bytes/s the class passed during the next `seconds`."""
    before = dp.read_counters()[class_id].passed_bytes
    time.sleep(seconds)
    return (dp.read_counters()[class_id].passed_bytes - before) / seconds


@pytest.mark.slow
def test_bucket_holds_four_tcp_flows(net, server, datapath):
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=20 * MBIT)
    result = iperf3(net.hosts[0], server, seconds=10, streams=4)
    assert within(result.received_bps, 20e6, 0.10), result


def test_random_drop_drops_its_probability(net, server, datapath):
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_class(0, Mode.PASS)                # iperf3's one UDP handshake datagram must get through
    client = iperf3_start(net.hosts[0], server, seconds=4, udp_bps=20e6, length=1000)
    time.sleep(0.5)
    before = dp.read_counters()[0]
    dp.set_class(0, Mode.DROP, drop_probability=0.3)
    result = client.wait()
    after = dp.read_counters()[0]
    dropped = after.dropped_packets - before.dropped_packets
    assert within(dropped / (after.passed_packets - before.passed_packets + dropped), 0.30, 0.1), after
    assert within(result.lost_packets, dropped, 0.02), (result, dropped)   # every drop is a loss


def test_counters_match_iperf3_bytes(net, server, datapath):
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_class(0, Mode.PASS)
    payload = 1200
    result = iperf3(net.hosts[0], server, seconds=3, udp_bps=50e6, length=payload)
    c = dp.read_counters()[0]
    frame = payload + 8 + 20 + 14            # UDP + IPv4 + Ethernet headers
    assert within(c.passed_packets, result.packets, 0.01), (c, result)
    assert within(c.passed_bytes, result.sent_bytes * frame / payload, 0.01), (c, result)


def test_flow_table_sees_parallel_flows(net, server, datapath):
    dp = datapath()
    dp.set_class(0, Mode.PASS)
    iperf3(net.hosts[0], server, seconds=3, streams=8)
    flows = [f for f in dp.read_flows().get(0, []) if f.key.dport == server.port and f.key.proto == 6]
    assert len({f.key.sport for f in flows if f.bytes > 1_000_000}) == 8, flows   # + control connection
    # each CPU tallies a flow's bytes exactly (flows.h tally_flow); only the flows' last
    # epochs (16.8 ms each) may still be in their memo slots
    total = sum(f.bytes for f in dp.read_flows()[0])
    assert within(total, dp.read_counters()[0].passed_bytes, 0.02)


def test_rate_change_takes_effect_within_a_second(net, server, datapath):
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=40 * MBIT)
    client = iperf3_start(net.hosts[0], server, seconds=7, streams=4)
    time.sleep(1.5)
    before = wire_rate(dp, 1.5)
    dp.set_class(0, Mode.BUCKET, rate_Bps=10 * MBIT)
    time.sleep(1.0)
    after = wire_rate(dp, 2.0)
    client.wait()
    assert within(before, 40 * MBIT, 0.15), before / MBIT
    assert within(after, 10 * MBIT, 0.15), after / MBIT


def test_traffic_outside_the_class_is_not_limited(net, server, datapath):
    dp = datapath(classes=parse_classes(["proto=tcp,dport=5999"]))
    dp.set_class(0, Mode.BUCKET, rate_Bps=1 * MBIT)
    result = iperf3(net.hosts[0], server, seconds=2)
    assert result.received_bps > 100e6, result
    assert dp.read_counters()[0].passed_packets == 0
    assert dp.read_bypass().passed_bytes > result.received_bytes


def test_ipv6_class_is_limited_and_ipv4_is_not(net, server, datapath):
    dp = datapath(classes=parse_classes(["dst=fd00::2/128,proto=tcp"]))
    dp.set_class(0, Mode.BUCKET, rate_Bps=10 * MBIT)
    v6 = iperf3(net.hosts[0], server, seconds=3, streams=2, ipv6=True)
    v4 = iperf3(net.hosts[0], server, seconds=2)
    assert within(v6.received_bps, 10e6, 0.15), v6
    assert v4.received_bps > 100e6, v4


def test_attach_twice_does_not_stack_and_detach_cleans_up(net, datapath):
    h1 = net.hosts[0]
    first = datapath()
    first.attach()
    second = datapath()                      # a restarted agent: replaces the filter, owns it now
    assert tc_show(h1, "filter").count("handle 0xd1") == 1
    second.detach()                          # only ours was on that clsact: both go
    assert "clsact" not in tc_show(h1, "qdisc")
    assert tc_show(h1, "filter").strip() == ""
    first.detach()                           # its filter was replaced: nothing left to remove
    assert "clsact" not in tc_show(h1, "qdisc")


def test_detach_leaves_a_clsact_that_carries_other_filters(net, datapath):
    h1 = net.hosts[0]
    h1.run("tc", "qdisc", "add", "dev", "eth0", "clsact")
    h1.run("tc", "filter", "add", "dev", "eth0", "ingress", "prio", "7", "protocol", "ip", "u32", "match", "u32", "0", "0")
    dp = datapath()
    dp.detach()
    assert "clsact" in tc_show(h1, "qdisc") and "u32" in h1.run("tc", "filter", "show", "dev", "eth0", "ingress")
    assert "drl_egress" not in tc_show(h1, "filter")


@pytest.mark.slow
def test_two_cpus_do_not_overshoot_the_bucket(net, server, datapath):
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=20 * MBIT)
    srv2 = iperf3_server(net.hosts[1])
    clients = [iperf3_start(net.hosts[0], s, seconds=7, streams=2, cpu=cpu)
               for cpu, s in ((0, server), (1, srv2))]
    time.sleep(2)                              # past the initial full bucket
    rate = wire_rate(dp, 4)
    for c in clients:
        c.wait()
    assert 0.85 * 20 * MBIT < rate <= 1.05 * 20 * MBIT, rate / MBIT


def beat(dp, stop: threading.Event) -> None:
    """What the agent's tick does for a class whose config did not change: the heartbeat only."""
    while not stop.wait(0.1):
        dp.heartbeat()


@pytest.mark.slow
def test_stale_config_falls_back_to_the_safe_rate(net, server, datapath):
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=100 * MBIT, safe_rate_Bps=5 * MBIT, timeout_s=2.0)
    stop = threading.Event()
    beating = threading.Thread(target=beat, args=(dp, stop))
    beating.start()
    try:
        time.sleep(2.5)                      # the config is older than its timeout, the heartbeat is not
        fresh = iperf3(net.hosts[0], server, seconds=1, streams=2)
    finally:
        stop.set()
        beating.join()
    time.sleep(2.2)                          # now the agent has been silent > 2 s
    stale = iperf3(net.hosts[0], server, seconds=4, streams=4)
    assert fresh.received_bps > 50e6, fresh
    assert within(stale.received_bps, 5e6, 0.15), stale


@pytest.mark.slow
def test_a_crashed_owner_leaves_the_safe_rate_enforced_until_the_next_one_takes_over(net, server, datapath):
    """close(detach=False), what a crashed agent does (agent/service/daemon.py serve): the filter and
    the maps it holds stay, and the stale config falls back to the safe rate.  The next
    Datapath replaces the filter and its stop leaves nothing."""
    h1 = net.hosts[0]
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=100 * MBIT, safe_rate_Bps=5 * MBIT, timeout_s=1.0)
    dp.close(detach=False)
    assert tc_show(h1, "filter").count("handle 0xd1") == 1
    time.sleep(1.2)                          # no write and no heartbeat for > 1 s
    left = iperf3(h1, server, seconds=3, streams=4)
    assert within(left.received_bps, 5e6, 0.15), left
    datapath().close()
    assert "clsact" not in tc_show(h1, "qdisc") and tc_show(h1, "filter").strip() == ""


def test_zero_rate_still_lets_a_small_burst_through(net, server, datapath):
    dp = datapath(classes=parse_classes(["proto=udp"]), floor_rate_Bps=15_000)
    dp.set_class(0, Mode.BUCKET, rate_Bps=0)
    client = iperf3_start(net.hosts[0], server, seconds=2, udp_bps=5e6, length=1000)
    client.proc.wait()
    passed = dp.read_counters()[0].passed_bytes
    # a full bucket at start + 15 KB per second, never the 1.25 MB offered
    assert 15_000 <= passed <= 15_000 * 4, passed


def test_quota_stops_the_class_when_used_up(net, server, datapath):
    dp = datapath(classes=parse_classes(["proto=udp"]))
    dp.set_class(0, Mode.PASS, quota_bytes=1_000_000)
    iperf3(net.hosts[0], server, seconds=2, udp_bps=20e6, length=1000)
    c = dp.read_counters()[0]
    assert 990_000 <= c.passed_bytes <= 1_000_000 and c.dropped_packets > 1000, c
    assert dp.read_quota(0) < 1042


def test_exempt_gossip_is_never_policed(net, datapath):
    """The agent's own gossip: UDP from its port with its socket mark (abi.GOSSIP_MARK).
    Everything else on the port is policed: tests/kernel/test_takeover.py."""
    from drl.agent.abi import GOSSIP_MARK
    dp = datapath(classes=[parse_class("proto=udp")], gossip_port=7946)
    dp.set_class(0, Mode.DROP, drop_probability=1.0)
    net.hosts[0].run("python3", "-c", "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                     f"s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, ({GOSSIP_MARK}).to_bytes(4, sys.byteorder)); "
                     f"s.bind(('{net.hosts[0].addr4}', 7946)); "
                     f"[s.sendto(bytes(1000), ('{net.hosts[1].addr4}', 7946)) for _ in range(100)]")
    assert dp.read_counters()[0].passed_packets == dp.read_counters()[0].dropped_packets == 0
    assert dp.read_bypass().passed_packets >= 100


_DIAL = """
import socket, sys
from drl.agent.cluster.etcd import Gateway
host, port, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    if mark:
        Gateway((host, port), None, 1.0, mark=mark)._marked((host, port), 1.0).sendall(bytes(10_000))
    else:
        socket.create_connection((host, port), 1.0).sendall(bytes(10_000))
except OSError:
    sys.exit(1)
"""


def test_the_registry_connections_are_never_policed(net, datapath):
    """The agent's etcd connections (agent/cluster/etcd.py: TCP to the registry's port with the
    gossip mark) pass a class that drops every TCP packet; unmarked, or to another port, not."""
    from drl.agent.abi import GOSSIP_MARK
    h1, h2 = net.hosts
    h2.popen(sys.executable, "-c", "import socket, time\n"
             "servers = [socket.create_server(('0.0.0.0', port)) for port in (2379, 2380)]\ntime.sleep(60)")
    poll(lambda: h2.listening(2379) and h2.listening(2380), 5.0)
    dp = datapath(classes=[parse_class("proto=tcp")], gossip_port=7946, registry_port=2379)
    dp.set_class(0, Mode.DROP, drop_probability=1.0)

    def dial(port: int, mark: int) -> bool:
        return subprocess.run(h1.argv(sys.executable, "-c", _DIAL, h2.addr4, str(port), str(mark))).returncode == 0

    assert dial(2379, GOSSIP_MARK)
    assert dp.read_counters()[0].passed_packets == dp.read_counters()[0].dropped_packets == 0
    assert not dial(2379, 0) and not dial(2380, GOSSIP_MARK)        # a SYN that never gets through
    assert dp.read_counters()[0].dropped_packets >= 2


def test_a_limiter_h_in_the_working_directory_is_not_compiled(net, datapath, tmp_path, monkeypatch):
    """bcc compiles as if from the working directory: ours must come from bpf/ (an agent
    started from a directory holding some other limiter.h failed to compile)."""
    (tmp_path / "limiter.h").write_text('#error "the limiter.h of the working directory"\n')
    monkeypatch.chdir(tmp_path)
    dp = datapath(classes=parse_classes(["dport=5201,proto=udp"]))     # not IPv6 neighbour discovery
    _send_udp(net, {5201: 3})
    assert dp.read_counters([0])[0].passed_packets == 3


def test_many_classes_are_read_in_one_batch_exactly(net, datapath):
    """read_counters of many ids takes the batch path (one lookup over ids 0..max, CPUs
    summed in C): each class's own packets, none of its neighbours'."""
    dp = datapath(classes=parse_classes([f"dport={7000 + i},proto=udp" for i in range(8)]), max_classes=16)
    _send_udp(net, {7000 + i: i + 1 for i in range(8)})
    got = dp.read_counters(range(16))
    assert [got[i].passed_packets for i in range(16)] == [i + 1 for i in range(8)] + [0] * 8
    assert [got[i].passed_bytes // got[i].passed_packets for i in range(8)] == [142] * 8   # 100 + UDP/IP/Ethernet


def _send_udp(net, packets_per_port: dict[int, int]) -> None:
    """From h1 to h2: so many 100-byte UDP datagrams to each port."""
    sends = "; ".join(f"[s.sendto(bytes(100), ('{net.hosts[1].addr4}', {port})) for _ in range({n})]"
                      for port, n in packets_per_port.items())
    net.hosts[0].run("python3", "-c", f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); {sends}")


def _config(dp, class_id: int) -> bytes:
    import ctypes as ct
    return bytes(dp._bpf[b"config"][ct.c_int(class_id)])


def test_the_fail_safe_bucket_is_as_deep_as_asked_else_the_police_rule(net, datapath):
    """The agent gives the fail-safe its share of the burst budget (agent/burst.py); without
    one it is the police rule at the safe rate (300 ms, at least 128 KiB)."""
    import ctypes as ct

    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=10 * MBIT, safe_rate_Bps=2.5e6, timeout_s=5.0, safe_burst_bytes=100_000)
    assert dp._bpf[b"config"][ct.c_int(0)].safe_burst_bytes == 100_000
    dp.set_class(0, Mode.BUCKET, rate_Bps=10 * MBIT, safe_rate_Bps=2.5e6, timeout_s=5.0)
    assert dp._bpf[b"config"][ct.c_int(0)].safe_burst_bytes == 750_000


OUT_OF_RANGE = [
    {"rate_Bps": float("inf")}, {"rate_Bps": float("nan")}, {"rate_Bps": 2.0**64},
    {"burst_bytes": 2**64}, {"burst_bytes": -1}, {"safe_rate_Bps": float("inf")}, {"safe_rate_Bps": -5.0},
    {"timeout_s": float("inf")}, {"timeout_s": -1.0}, {"timeout_s": 1e12}, {"quota_bytes": 2**64},
    {"quota_bytes": -1}, {"shape_prio": 2**32}, {"drop_probability": float("nan")},
    {"safe_burst_bytes": 2**64}, {"safe_burst_bytes": -1}]


def test_a_value_out_of_range_leaves_the_previous_config(net, datapath):
    """set_class is all-or-nothing: a value the C type cannot hold (1e400mbit is inf) raises
    DatapathError and the class keeps the config it had, alone or inside a batch (where the
    other classes' writes still go through) -- never a zeroed or half-written slot.  One
    datapath for every value: a compile costs more than all the checks together."""
    import ctypes as ct

    from drl.agent.kernel.datapath import DatapathError

    dp = datapath(classes=parse_classes(["dport=80,proto=tcp", "dport=81,proto=tcp"]))
    good = {"rate_Bps": 10 * MBIT, "safe_rate_Bps": 1 * MBIT, "timeout_s": 5.0}
    for bad in OUT_OF_RANGE:
        dp.set_class(0, Mode.BUCKET, **good)
        dp.set_class(1, Mode.BUCKET, rate_Bps=5 * MBIT)
        before = _config(dp, 0)
        with pytest.raises(DatapathError):
            dp.set_class(0, Mode.BUCKET, **{**good, **bad})
        assert _config(dp, 0) == before, bad
        with pytest.raises(DatapathError):
            with dp.batch():
                dp.set_class(1, Mode.BUCKET, rate_Bps=20 * MBIT)
                dp.set_class(0, Mode.BUCKET, **{**good, **bad})
        assert _config(dp, 0) == before, bad
        assert dp._bpf[b"config"][ct.c_int(1)].rate_Bps == int(20 * MBIT), bad
