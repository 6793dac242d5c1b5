"""Quota demand/release loops for DQMP ([Behl12] §5.1 "Crashes of Nodes").

    demand = QuotaLoops(n_nodes=100, max_Bps=6.25e6, rng=rng)
    demand.advance(now_s, interval_s, enforce, alive)    # sends what the allowance permits
    demand.waits_s                                        # how long each unmet demand waited

[Behl12] §5.1: each node "adds a randomly chosen delta d, with -10,000 <= d <=
+10,000, to its previous quota demand", bounded by b, issues the request,
waits until it is fulfilled, then sleeps 25-75 ms.  Here a node's demand is a
sending rate that takes such a step (delta uniform in +-20 % of the bound b =
``max_Bps``) whenever its sleep is over, and the bytes it may send are capped
by the datapath allowance DQMP grants (``Decision.quota_bytes``).  A demand
that the allowance cannot cover in full is a request still waiting: it keeps
its demand and does not sleep until it is served, and ``waits_s`` records
each request's response time (0 when the local grant covered it at once).
Volume quota is consumed, not released: a lower demand simply sends less.
"""
from __future__ import annotations

import numpy as np

from .tcp import CounterSample, Enforcement


class QuotaLoops:
    def __init__(self, n_nodes: int, max_Bps: float, rng: np.random.Generator,
                 sleep_s: tuple[float, float] = (0.025, 0.075)):
        self.max_Bps, self.rng, self.sleep_s = max_Bps, rng, sleep_s
        self.want_Bps = rng.uniform(0.0, max_Bps, n_nodes)
        self.wake_at = rng.uniform(*sleep_s, n_nodes)
        self.issued_at = np.full(n_nodes, np.nan)      # NaN: no request outstanding
        self.passed = np.zeros(n_nodes)
        self.dropped = np.zeros(n_nodes)
        self.waits_s: list[float] = []

    def advance(self, now_s: float, interval_s: float, enforce: Enforcement, alive: np.ndarray) -> None:
        self._issue(now_s, alive)
        want = self.want_Bps * interval_s * alive
        sent = np.minimum(want, enforce.quota_bytes)
        self.passed += sent
        self.dropped += want - sent
        served = alive & (want - sent <= 1e-6) & ~np.isnan(self.issued_at)
        # Response time at tick resolution: served in the tick it was issued = 0.
        self.waits_s += (now_s - self.issued_at[served]).tolist()
        self.issued_at[served] = np.nan
        self.wake_at[served] = now_s + interval_s + self.rng.uniform(*self.sleep_s, int(served.sum()))

    def _issue(self, now_s: float, alive: np.ndarray) -> None:
        """Woken nodes change their demand by a random delta (+-20 % of the bound)."""
        ready = alive & np.isnan(self.issued_at) & (self.wake_at <= now_s)
        delta = self.rng.uniform(-0.2, 0.2, int(ready.sum())) * self.max_Bps
        self.want_Bps[ready] = np.clip(self.want_Bps[ready] + delta, 0.0, self.max_Bps)
        self.issued_at[ready] = now_s

    def counters(self, i: int) -> CounterSample:
        return CounterSample(int(self.passed[i]), int(self.dropped[i]))

    def flow_records(self, i: int, now_s: float) -> list:
        return []
