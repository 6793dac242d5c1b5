"""What kernel tests and benchmarks read off a running Lab: rates at a sink, tc state, the 3:7 split.

    rate = sink_rate_bps(sink, seconds=10)      # L2 bits/s arriving at the sink's eth0
    rate = tcp_rate_at_sink(sender, sink, seconds=8, streams=4, settle_s=3, measure_s=4)   # while iperf3 sends
    run = three_to_seven(lab, a1, a2, sink, poll_s=1.0)
    run.share, jain(run.stream_bytes)
    with RxMeter(sink) as meter:                # the sink's rx bytes every 100 ms, on a thread
        ...
    series = meter.series(t0, t1)               # bytes/s per 100-ms bin of [t0, t1)

Rates are counted at the sink's interface (L2 bytes, what the limiter
counts), so a +-10 % range has room for header accounting but not for a
broken allocator.  (The lab's own runs sample the sink with
lab/collector.py's SinkMeter on a fixed 100-ms grid.)
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pyroute2 import NetNS

from .agents import Agent
from .collector import DT, spread
from .netns import Host, Lab
from .traffic import iperf3_server, iperf3_start


def rx_bytes(host: Host) -> int:
    return int(host.run("cat", "/sys/class/net/eth0/statistics/rx_bytes"))


def sink_rate_bps(host: Host, seconds: float) -> float:
    """L2 bits/s arriving on host's eth0 over the next ``seconds`` (what the limiter counts)."""
    before = rx_bytes(host)
    time.sleep(seconds)
    return (rx_bytes(host) - before) * 8 / seconds


def tcp_rate_at_sink(sender: Host, sink: Host, *, seconds: float, streams: int, settle_s: float,
                     measure_s: float) -> float:
    """Bulk TCP (iperf3, ``streams`` flows for ``seconds``) from sender to a server on sink:
    sink_rate_bps over ``measure_s``, from ``settle_s`` after the start (past the full bucket)."""
    with iperf3_server(sink) as srv:
        client = iperf3_start(sender, srv, seconds=seconds, streams=streams)
        time.sleep(settle_s)
        rate = sink_rate_bps(sink, measure_s)
        client.stop()                   # what it sends after the measurement counts nowhere
    return rate


class RxMeter:
    """The received bytes of host's eth0 every DT (100 ms) on a thread of its own, read over
    netlink (lab/collector.py's way: a process spawned per read would blur the 100-ms bins)."""

    def __init__(self, host: Host):
        self.host = host
        self.samples: list[tuple[float, int]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "RxMeter":
        self.nl = NetNS(self.host.ns)
        self.index = self.nl.link_lookup(ifname="eth0")[0]
        self._sample()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()
        self.nl.close()

    def _sample(self) -> None:
        link = self.nl.get_links(self.index)[0]
        self.samples.append((time.monotonic(), link.get_attr("IFLA_STATS64")["rx_bytes"]))

    def _loop(self) -> None:
        while not self.stopping.wait(DT):
            self._sample()

    def series(self, start: float, end: float) -> list[float]:
        """Bytes/s per DT bin of [start, end) (time.monotonic()), counter differences spread by overlap."""
        pieces = [(t0 - start, t1 - start, b1 - b0) for (t0, b0), (t1, b1) in zip(self.samples, self.samples[1:])
                  if t1 > start and t0 < end]
        return spread(pieces, int((end - start) / DT))


def tc_show(host: Host, what: str) -> str:
    """``tc qdisc``/``tc filter`` (egress) on host's eth0."""
    return host.run("tc", what, "show", "dev", "eth0", *(["egress"] if what == "filter" else []))


@dataclass
class SplitRun:
    """One run of FPS's 3:7 setting (three_to_seven)."""
    share: float                 # the 3-flow limiter's mean limit over the sum of both means
    sink_bps: float              # L2 bits/s at the sink over the measured measure_s
    stream_bytes: tuple          # every flow's bytes (3 then 7), for Jain's index
    statuses: list               # both agents' status at the end


def three_to_seven(lab: Lab, a1: Agent, a2: Agent, sink: Host, poll_s: float, measure_s: int = 30) -> SplitRun:
    """[Raghavan07] §5.1: 3 cubic flows leave a1's host, 7 leave a2's, for measure_s + 8 s
    (38 s) towards ``sink``; after 6 s of warm-up the local limits are read every ``poll_s``
    for ``measure_s`` (the kernel test and bench/split.py)."""
    limits = []
    with iperf3_server(sink) as s1, iperf3_server(sink) as s2:
        c1 = iperf3_start(lab.host(a1.host), s1, seconds=measure_s + 8, streams=3)
        c2 = iperf3_start(lab.host(a2.host), s2, seconds=measure_s + 8, streams=7)
        time.sleep(6)
        before = rx_bytes(sink)
        started = time.monotonic()
        while time.monotonic() - started < measure_s:
            limits.append([a.status()["local_limit_bps"] for a in (a1, a2)])
            time.sleep(poll_s)
        rate = (rx_bytes(sink) - before) * 8 / (time.monotonic() - started)
        statuses = [a.status() for a in (a1, a2)]
        r1, r2 = c1.wait(), c2.wait()
    l1, l2 = (sum(col) / len(col) for col in zip(*limits))
    return SplitRun(l1 / (l1 + l2), rate, r1.stream_bytes + r2.stream_bytes, statuses)
