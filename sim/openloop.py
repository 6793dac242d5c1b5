"""Open-loop Poisson demand: packets arrive whatever the limiter does ([Stanojevic09] §III).

    demand = PoissonDemand(rates_Bps=np.array([...]), rng=rng)    # or a function t -> rates
    demand.advance(now_s, interval_s, enforce, alive)

[Stanojevic09] §III-A: "Limiter i receives packets arriving
according to a Poisson process with intensity lambda_i", served at C_i (an
M/M/1 queue).  Arrivals do not react to the limit, so the estimator's demand
(passed + dropped) is an estimate of lambda_i, from which GDRL's spare-bandwidth
indicator q_i = lambda_i - C_i (eq. 14) follows.  What exceeds the limit in an
interval is counted as dropped: the queue itself is not modelled, only the
arrival process the indicator is estimated from.
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np

from .tcp import CounterSample, Enforcement
from drl.agent.model import Mode

PACKET_BYTES = 1000
Rates = Union[np.ndarray, Callable[[float], np.ndarray]]


class PoissonDemand:
    def __init__(self, rates_Bps: Rates, n_nodes: int, rng: np.random.Generator,
                 packet_bytes: int = PACKET_BYTES):
        self.rates, self.rng, self.packet_bytes = rates_Bps, rng, packet_bytes
        self.passed = np.zeros(n_nodes)
        self.dropped = np.zeros(n_nodes)

    def rates_at(self, t: float) -> np.ndarray:
        return self.rates(t) if callable(self.rates) else self.rates

    def advance(self, now_s: float, interval_s: float, enforce: Enforcement, alive: np.ndarray) -> None:
        lam = self.rates_at(now_s) * interval_s / self.packet_bytes
        arrived = self.rng.poisson(lam) * float(self.packet_bytes) * alive
        capped = enforce.mode == Mode.BUCKET
        passed = np.where(capped, np.minimum(arrived, enforce.limit_Bps * interval_s), arrived)
        self.passed += passed
        self.dropped += arrived - passed

    def counters(self, i: int) -> CounterSample:
        return CounterSample(int(self.passed[i]), int(self.dropped[i]))

    def flow_records(self, i: int, now_s: float) -> list:
        return []
