"""Counters -> rates: the estimation step of [Raghavan07] §3.1.

Every estimate interval the daemon hands the class's cumulative counters and
the flow table to :meth:`Estimator.update`, which returns the
:class:`~agent.model.Local` an allocator consumes::

    est = Estimator(ewma=0.1)
    local = est.update(now_s, counters, flows)   # Local(demand_Bps=..., flow_rates_Bps=...)

The paper computes "the average arrival rate over fixed time intervals and
applies a standard EWMA filter" with a "1-second EWMA parameter" of 0.1
(§5.1, footnote 4): ``ewma`` is the share of the old estimate still present
after one second, so the smoothing does not change with the interval
(``kept_share``; 0 = no filter).  Demand is arrivals, i.e.
passed + dropped bytes: what the traffic asked for, not what we let through.

A flow's rate is its share of the bytes its class passed, smoothed with
``flow_ewma`` (default 0.8 left after one second), times the class's sent
rate smoothed with ``ewma``.  TCP flows inside one bucket trade the tokens
among themselves within a second (at 10 Mbit/s and microsecond RTTs one of 7
flows holds twice the mean for a few hundred ms), so per-flow rates smoothed
like the demand are noisy, and the maximum of noisy rates overstates the
per-flow rate the more flows there are: FPS then undercounts the limiter with
more flows.  The share is what is smoothed longer, not the rate, so when the
class's rate changes (a limit doubles, a newcomer ramps up) every flow's rate
follows it at the demand's speed (README "TCP on veth" has the measurements).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from drl.agent.model import Local, ewma as smooth
from drl.agent.allocators.common import kept_share

# A flow whose last packet is older than this many intervals, and at least
# IDLE_MIN_S, has ended: it no longer stands for demand.  The floor keeps a TCP
# flow waiting out a retransmission timeout (200 ms minimum, doubling) in the
# sample set, so it is not counted as new, at a bogus rate, when it resumes.
IDLE_INTERVALS = 3
IDLE_MIN_S = 1.0


class CounterSample(Protocol):
    passed_bytes: int
    dropped_bytes: int


class FlowRecord(Protocol):
    key: object
    bytes: int
    first_ns: int
    last_ns: int


@dataclass(slots=True)
class _FlowShare:
    bytes: int
    share: float | None = None   # smoothed share of the class's passed bytes; None before a sample
    samples: int = 0
    active: bool = True


@dataclass
class Estimator:
    ewma: float = 0.1
    flow_ewma: float = 0.8
    _last_s: float | None = None
    _last_arrived: int = 0
    _last_passed: int = 0
    _demand: float | None = None
    _sent: float | None = None
    _flows: dict = field(default_factory=dict)

    def update(self, now_s: float, counters: CounterSample,
               flows: Iterable[FlowRecord] = (), now_ns: int | None = None) -> Local:
        arrived = counters.passed_bytes + counters.dropped_bytes
        if self._last_s is None or now_s <= self._last_s:
            self._last_s, self._last_arrived, self._last_passed = now_s, arrived, counters.passed_bytes
            self._flows = {f.key: _FlowShare(f.bytes) for f in flows}
            return Local(demand_Bps=0.0, sent_Bps=0.0, sent_total_bytes=counters.passed_bytes)
        dt = now_s - self._last_s
        kept = kept_share(self.ewma, dt)
        passed = counters.passed_bytes - self._last_passed
        self._demand = smooth(self._demand, (arrived - self._last_arrived) / dt, kept)
        self._sent = smooth(self._sent, passed / dt, kept)
        new_flows = self._update_flows(flows, dt, passed, now_ns)
        self._last_s, self._last_arrived, self._last_passed = now_s, arrived, counters.passed_bytes
        rates = [f.share * self._sent for f in self._flows.values() if f.active and f.share]
        rates.sort(reverse=True)
        return Local(demand_Bps=self._demand, sent_Bps=self._sent, flow_rates_Bps=tuple(rates),
                     new_flows=new_flows, sent_total_bytes=counters.passed_bytes)

    def _update_flows(self, flows: Iterable[FlowRecord], dt: float, passed: int, now_ns: int | None) -> int:
        """Smooth every flow's share of the bytes its class passed (module
        docstring); returns how many flows are new.

        Until a flow has been seen for as many intervals as ``flow_ewma``
        remembers, its share is the plain mean of its samples, so its first
        interval does not linger for seconds.  A flow is part of its class,
        so a sample is at most 1: a flow sampled just after a bucket burst
        (its bytes over a few ms) would otherwise start at many times the
        limit, and FPS would divide the limit by that rate and starve the
        newcomer (a CI run measured 1.2 of 4 Mbit/s in a new limiter's third
        second).
        """
        kept = kept_share(self.flow_ewma, dt)
        idle_ns = int(max(IDLE_INTERVALS * dt, IDLE_MIN_S) * 1e9)
        seen: dict = {}
        new = 0
        for f in flows:
            flow = self._flows.get(f.key)
            if flow is None:
                new += 1
                # A flow new to us: its bytes since it entered the flow table against the class's rate.
                span = dt if now_ns is None else max((now_ns - f.first_ns) / 1e9, 1e-3)
                flow, sample = _FlowShare(f.bytes), (f.bytes / span / self._sent if self._sent else 1.0)
            else:
                sample = (f.bytes - flow.bytes) / passed if passed > 0 else None
            if sample is not None:
                n = flow.samples
                flow.share = smooth(flow.share, min(1.0, max(0.0, sample)), min(kept, n / (n + 1)))
                flow.samples = n + 1
            flow.bytes = f.bytes
            flow.active = now_ns is None or now_ns - f.last_ns <= idle_ns
            seen[f.key] = flow
        self._flows = seen
        return new
