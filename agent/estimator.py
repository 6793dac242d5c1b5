"""Counters -> rates: the estimation step of 000_efbf5459a9d12355.txt §3.1.

Every estimate interval the daemon hands the class's cumulative counters and
the flow table to :meth:`Estimator.update`, which returns the
:class:`~agent.allocators.base.Local` an allocator consumes::

    est = Estimator(ewma=0.1)
    local = est.update(now_s, counters, flows)   # Local(demand_Bps=..., flow_rates_Bps=...)

The paper computes "the average arrival rate over fixed time intervals and
applies a standard EWMA filter" with a "1-second EWMA parameter" of 0.1
(§5.1, footnote 4): ``ewma`` is the share of the old estimate still present
after one second, so the smoothing does not change with the interval
(``kept_share``; 0 = no filter).  Demand is arrivals, i.e.
passed + dropped bytes: what the traffic asked for, not what we let through.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from agent.allocators.base import Local, ewma as smooth
from agent.allocators.common import kept_share

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


@dataclass
class _FlowRate:
    bytes: int
    rate_Bps: float
    active: bool = True


@dataclass
class Estimator:
    ewma: float = 0.1
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
            self._flows = {f.key: _FlowRate(f.bytes, 0.0) for f in flows}
            return Local(demand_Bps=0.0, sent_Bps=0.0, sent_total_bytes=counters.passed_bytes)
        dt = now_s - self._last_s
        kept = kept_share(self.ewma, dt)
        self._demand = smooth(self._demand, (arrived - self._last_arrived) / dt, kept)
        self._sent = smooth(self._sent, (counters.passed_bytes - self._last_passed) / dt, kept)
        new_flows = self._update_flows(flows, dt, kept, now_ns, self._demand)
        self._last_s, self._last_arrived, self._last_passed = now_s, arrived, counters.passed_bytes
        rates = sorted((f.rate_Bps for f in self._flows.values() if f.active and f.rate_Bps > 0), reverse=True)
        return Local(demand_Bps=self._demand, sent_Bps=self._sent, flow_rates_Bps=tuple(rates),
                     new_flows=new_flows, sent_total_bytes=counters.passed_bytes)

    def _update_flows(self, flows: Iterable[FlowRecord], dt: float, kept: float,
                      now_ns: int | None, demand_Bps: float) -> int:
        """Per-flow EWMA rates from byte deltas, none above the class's demand;
        returns how many flows are new.

        A flow is part of its class, so its smoothed rate cannot honestly exceed
        the class's smoothed demand.  Without the cap a flow sampled just after
        a bucket burst (its bytes over a few ms) starts at many times the limit
        and, at the per-second EWMA, stays there for a second: FPS then divides
        the limit by that rate and starves the newcomer (a CI run measured 1.2
        of 4 Mbit/s in a new limiter's third second).
        """
        idle_ns = int(max(IDLE_INTERVALS * dt, IDLE_MIN_S) * 1e9)
        seen: dict = {}
        new = 0
        for f in flows:
            old = self._flows.get(f.key)
            if old is None:
                new += 1
                # A flow new to us counts its bytes since it entered the flow table.
                span = dt if now_ns is None else max((now_ns - f.first_ns) / 1e9, 1e-3)
                rate = f.bytes / span
            else:
                rate = smooth(old.rate_Bps, max(0, f.bytes - old.bytes) / dt, kept)
            rate = min(rate, demand_Bps)
            seen[f.key] = _FlowRate(f.bytes, rate, active=now_ns is None or now_ns - f.last_ns <= idle_ns)
        self._flows = seen
        return new
