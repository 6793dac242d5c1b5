"""Measurements of one run, all on one grid of ``DT`` = 100 ms bins from the schedule's start.

    with SinkMeter(plan) as meter:          # the sink interface's received bytes
        meter.sample(t)                      # call every 100 ms
    aggregate = meter.series(n_bins)         # bytes/s per bin: what reached the sink
    flows, hung = flow_series(groups, out, launched, n_bins)

The aggregate comes from one counter read on one clock (the sink's only
interface), so its 100-ms histogram is trustworthy.  Per-flow rates come from
the receivers: iperf3 servers report each stream's received bytes every
100 ms relative to their test's start, which the lab places at the moment it
launched the client (a few ms off at most); web groups report bytes per 100 ms.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import NetNS

from .errors import LabError
from .topology import Plan
from .traffic import Group

DT = 0.1


MAX_READ_S = 0.010    # a read stamped within 5 ms: 5 ms of the limit at most moves across a window's edge


class SinkMeter:
    def __init__(self, plan: Plan):
        sink = plan.exp.sink
        self.ns = plan.ns(sink)
        self.iface = plan.iface(sink, plan.exp.neighbours(sink)[0]).name
        self.samples: list[tuple[float, int]] = []
        self.reads: list[tuple[float, float]] = []     # (t, seconds the read took), kept or not

    def __enter__(self) -> "SinkMeter":
        self.nl = NetNS(self.ns)
        self.index = self.nl.link_lookup(ifname=self.iface)[0]
        return self

    def __exit__(self, *exc) -> None:
        self.nl.close()

    def sample(self, t: float) -> None:
        """Read the counter now, ``t`` seconds into the run.  The read crosses into the sink's
        namespace and can take milliseconds on a busy machine: it is stamped at its middle, since
        every ms a window's edge is off moves 1 ms of the limit in or out of the window, and a
        shaped class's whole burst budget is 50 ms of the limit (lab/results.py's envelope)."""
        asked = time.monotonic()
        link = self.nl.get_links(self.index)[0]
        took = time.monotonic() - asked
        self.reads.append((round(t, 4), round(took, 4)))
        if took <= MAX_READ_S:     # a slower read: when it saw the counter is unknown; the next one spans the gap
            self.samples.append((t + took / 2, link.get_attr("IFLA_STATS64")["rx_bytes"]))

    def rate(self, over_s: float = 1.0) -> float:
        """Bytes/s over the last ``over_s`` seconds (for the progress line)."""
        if len(self.samples) < 2:
            return 0.0
        t1, b1 = self.samples[-1]
        t0, b0 = next(((t, b) for t, b in reversed(self.samples) if t1 - t >= over_s), self.samples[0])
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def series(self, n_bins: int) -> list[float]:
        """Counter differences spread onto the grid."""
        pieces = [(t0, t1, b1 - b0) for (t0, b0), (t1, b1) in zip(self.samples, self.samples[1:])]
        return spread(pieces, n_bins)


def spread(pieces: list[tuple[float, float, float]], n_bins: int) -> list[float]:
    """Amounts observed over [t0, t1) -> bytes/s per DT bin, split by overlap."""
    acc = [0.0] * n_bins
    for t0, t1, amount in pieces:
        if t1 <= t0:
            continue
        for k in range(max(0, math.floor(t0 / DT)), min(n_bins, math.ceil(t1 / DT))):
            overlap = min(t1, (k + 1) * DT) - max(t0, k * DT)
            if overlap > 0:
                acc[k] += amount * overlap / (t1 - t0)
    return [a / DT for a in acc]


@dataclass(frozen=True)
class Flow:
    label: str
    limiter: str
    kind: str
    start_s: float
    stop_s: float
    series: list[float]  # bytes/s per bin


def flow_series(groups: list[Group], out: Path, launched: dict[int, float],
                n_bins: int) -> tuple[list[Flow], list[str]]:
    """Every flow of every group that was launched, from its receiver's report, and the UDP
    groups that left none: iperf3 sets a UDP stream up with one datagram each way and never
    resends it, so on a lossy link one run in ~50 hangs at setup, sends nothing and is
    stopped at the end (docs/lab.md); it voids its own flows, not the run."""
    flows, hung = [], []
    for g in groups:
        if g.index not in launched:
            continue
        t0, t = launched[g.index], g.traffic
        stop = min(t.stop_s, t0 + g.seconds)
        try:
            report = json.loads(g.report(out).read_text())
        except (OSError, ValueError):
            report = None
        if t.kind == "udp" and not (report or {}).get("intervals"):
            hung.append(g.label)
            continue
        if report is None:
            raise LabError(f"no measurements from {g.label}: {g.report(out)} is missing or unreadable")
        if t.kind == "web":
            pieces = [(t0 + k * report["bin_s"], t0 + (k + 1) * report["bin_s"], b) for k, b in enumerate(report["bins"])]
            flows.append(Flow(g.label, g.limiter, "web", t0, stop, spread(pieces, n_bins)))
            continue
        if not report.get("intervals"):
            raise LabError(f"iperf3 for {g.label} failed: {report.get('error', 'no intervals in its report')}")
        # A report with intervals and an error is a receiver stopped after the run while its
        # client was still closing (a starved flow in retransmission timeout): its data counts.
        for j in range(t.flows):
            pieces = [(t0 + s["start"], t0 + s["end"], s["bytes"])
                      for iv in report["intervals"] for s in iv["streams"][j:j + 1]]
            flows.append(Flow(f"{g.label}.{j}", g.limiter, t.kind, t0, stop, spread(pieces, n_bins)))
    return flows, hung


def web_transfers(groups: list[Group], out: Path) -> list[dict]:
    return [tr for g in groups if g.traffic.kind == "web" and g.report(out).exists()
            for tr in json.loads(g.report(out).read_text())["transfers"]]
