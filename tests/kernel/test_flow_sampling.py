"""Each CPU tallies a flow's passed bytes in the flow's memo slot and the tally visits the
flow table once per 16.8 ms epoch the flow sends in (bpf/flows.h tally_flow, settle):
per-flow byte counts are exact, but for a flow's last epoch, which stays in its slot until
the flow sends again or another flow takes the slot.  Tallies smaller than a CPU's packets
per 250 us visit with a chance and count for that many (Horvitz-Thompson): the first two
tests have none, test_many_small_flows_are_estimated_without_bias nearly only those.

Run: sudo .venv/bin/pytest -m kernel tests/kernel/test_flow_sampling.py
FPS's own use of them: tests/kernel/test_agent.py and test_allocators.py (FPS tests).
"""
from __future__ import annotations

import ctypes as ct

import pytest

from drl.agent.model import Mode
from drl.lab.metrics import within
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

FRAME = 1514 / 1448          # L2 bytes per TCP payload byte: the class counts frames


def flow_bytes(dp, port: int) -> list[int]:
    return sorted(f.bytes for f in dp.read_flows().get(0, []) if f.key.dport == port and f.bytes > 100_000)


def largest_gap(dp) -> int:
    """The largest packets per 250 us any CPU measured for class 0 (limiter.h counters)."""
    return max(c.flow_every for c in dp._bpf[b"counters"][ct.c_int(0)])


def test_paced_flows_are_counted_exactly(net, datapath):
    """3 streams paced at 8 Mbit/s and 1 at 24 Mbit/s, in 16 KB writes: a few hundred GSO skbs
    a second, each stream's bytes within 2 % (its last epoch, <= 16.8 ms of it, is 0.4-0.8 %)."""
    h1, h2 = net.hosts
    dp = datapath()
    dp.set_class(0, Mode.PASS)
    dp.read_flows()         # the first read is whole; the ones below drain flows_visited, as ticks do
    with iperf3_server(h2) as slow_srv, iperf3_server(h2) as fast_srv:
        slow = iperf3_start(h1, slow_srv, seconds=4, streams=3, bitrate_bps=8e6, length=16384)
        fast = iperf3_start(h1, fast_srv, seconds=4, streams=1, bitrate_bps=24e6, length=16384)
        slow_result, fast_result = slow.wait(), fast.wait()
        assert largest_gap(dp) == 1
        for port, result in ((slow_srv.port, slow_result), (fast_srv.port, fast_result)):
            counted = flow_bytes(dp, port)
            sent = sorted(b * FRAME for b in result.stream_bytes)
            assert len(counted) == len(sent) and all(within(c, s, 0.02) for c, s in zip(counted, sent)), \
                (counted, sent)


def test_line_rate_flows_are_counted_exactly(net, server, datapath):
    """8 streams at veth line rate (tens of thousands of skbs a second, more than one per
    250 us and CPU): each stream's bytes within 2 %, total within 1 %."""
    h1 = net.hosts[0]
    dp = datapath()
    dp.set_class(0, Mode.PASS)
    dp.read_flows()         # the first read is whole; the ones below drain flows_visited, as ticks do
    result = iperf3_start(h1, server, seconds=3, streams=8).wait()
    assert largest_gap(dp) > 1                   # m > 1, yet each stream's tallies are whole
    counted = flow_bytes(dp, server.port)
    sent = sorted(b * FRAME for b in result.stream_bytes)
    assert len(counted) == 8 and all(within(c, s, 0.02) for c, s in zip(counted, sent)), (counted, sent)
    assert within(sum(counted), sum(sent), 0.01), (sum(counted), sum(sent))
    # what the drains put together is the table (the data streams: only their last ACKs and FINs
    # may visit it between the two reads)
    drained, table = ({f.key: f.bytes for f in flows.get(0, []) if f.key.dport == server.port and f.bytes > 100_000}
                      for flows in (dp.read_flows(), dp.read_flows(full=True)))
    assert drained.keys() == table.keys() and all(within(drained[k], table[k], 0.001) for k in table), (drained, table)


# N 36-byte datagrams from one socket to `ports` ports round-robin, paced at pps; prints how
# many the kernel took
_SPRAY = """
import socket, sys, time
dst, first, ports, count, pps = sys.argv[1], *map(int, sys.argv[2:6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent, t0 = 0, time.monotonic()
for i in range(count):
    try:
        s.sendto(b"x" * 36, (dst, first + i % ports))
        sent += 1
    except OSError:
        pass
    if i % 100 == 99:
        time.sleep(max(0.0, t0 + i / pps - time.monotonic()))
print(sent)
"""


def test_many_small_flows_are_estimated_without_bias(net, datapath):
    """3,000 UDP flows round-robin from one CPU at ~20,000 datagrams a second: more flows
    than the CPU's 1,024 memo slots, so a slot changes hands on most packets, and each
    evicted tally (1 packet) is smaller than m (~5 packets per 250 us), so it visits with
    probability 1/m and counts m.  The flows' bytes together stay those the class passed
    (unbiased; the tallies left in the slots at the end are at most 1,024 datagrams,
    2.5 %), and nearly every flow is in the table."""
    import sys

    h1, h2 = net.hosts
    dp = datapath()
    dp.set_class(0, Mode.PASS)
    dp.set_sample_probability(1.0)
    dp.read_flows()
    flows, count, first = 3000, 40_000, 30_000
    spray = h1.popen(sys.executable, "-c", _SPRAY, h2.addr4, str(first), str(flows), str(count), "20000",
                     cpu=0, capture=True)
    sent = int(spray.communicate(timeout=30)[0])
    assert sent > 0.99 * count, sent
    assert largest_gap(dp) > 1                   # small tallies took the Horvitz-Thompson path
    ours = [f for f in dp.read_flows(full=True).get(0, []) if first <= f.key.dport < first + flows]
    frame = 36 + 8 + 20 + 14
    assert len(ours) > 0.9 * flows, len(ours)
    assert within(sum(f.bytes for f in ours), sent * frame, 0.06), (sum(f.bytes for f in ours), sent * frame)


def test_read_flows_follows_the_table_and_keeps_unchanged_samples(net, datapath):
    """read_flows (agent/kernel/flows.py _FlowReader) applies the entries the program copied to
    flows_visited, and reads the whole table when asked (and every few seconds): whatever
    the table went through, a flow has the values items() reads, keeps its place in its
    class, and an entry nothing visited is the same object as before (the estimator's
    cheap path).  The test plays the program: a visit writes both maps, an eviction only
    the table."""
    import random

    import socket
    import struct

    dp = datapath(max_flows=1024)
    # detached: the maps change by the test's writes only (the namespace's own IPv6
    # neighbour discovery entered the table between two reads in a full run)
    dp.detach()
    table, visited = dp._bpf[b"flows"], dp._bpf[b"flows_visited"]
    rng = random.Random(3)
    now = 1_000

    def key(port: int):          # limiter.h flow_key: 10.0.0.1:1000 -> 10.0.0.2:port, UDP
        k = table.Key()
        k.src[0], k.dst[0] = (struct.unpack("=I", socket.inet_aton(a))[0] for a in ("10.0.0.1", "10.0.0.2"))
        k.family, k.proto, k.sport, k.dport = 4, 17, 1000, port
        return k

    def put(port: int, nbytes: int, first: int, last: int, class_id: int) -> None:
        value = table.Leaf()
        value.bytes, value.packets, value.first_ns, value.last_ns, value.class_id = nbytes, nbytes // 100, first, last, class_id
        table[key(port)] = value
        visited[key(port)] = value

    def as_read(flows: dict) -> dict:
        return {(f.key.sport, f.key.dport): (f.class_id, f.bytes, f.packets, f.first_ns, f.last_ns)
                for class_id, samples in flows.items() for f in samples if f.class_id == class_id}

    def in_table() -> dict:
        return {(k.sport, k.dport): (v.class_id, v.bytes, v.packets, v.first_ns, v.last_ns) for k, v in table.items()}

    def order(flows: dict) -> list:
        return [(class_id, f.key.dport) for class_id, samples in flows.items() for f in samples]

    for port in range(300):
        put(port, 0, now, now, 0)
    flows = dp.read_flows()
    assert as_read(flows) == in_table()
    for round_ in range(40):
        now += rng.choice([0, 4_000_000])        # a visit may fall in the coarse clock's same tick
        for port in rng.sample(range(400), 60):
            try:
                old = table[key(port)]
            except KeyError:
                put(port, 100, now, now, rng.randrange(2))         # a flow enters, in either class
                continue
            if rng.random() < 0.1:
                del table[key(port)]                                # leaves (evicted)
            else:
                put(port, old.bytes + rng.choice([0, 100]), old.first_ns, now, old.class_id)    # a visit
        full = round_ % 4 == 3
        before, flows = flows, dp.read_flows(full=full)
        got, table_now = as_read(flows), in_table()
        assert sum(map(len, flows.values())) == len(got)          # each flow once, in its class
        if full:
            assert got == table_now
        else:   # an evicted flow stays until the next full read
            assert {k: got[k] for k in table_now} == table_now
        kept = set(order(before)) & set(order(flows))             # a flow keeps its place
        assert [p for p in order(before) if p in kept] == [p for p in order(flows) if p in kept]
        again = dp.read_flows()
        assert order(again) == order(flows)
        assert all(a is b for c in flows for a, b in zip(again[c], flows[c]))
