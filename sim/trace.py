"""What a simulation run recorded, tick by tick, and the measures taken from it.

    trace = sim.run(600)
    trace.delivered_Bps[-100:].mean()       # aggregate forwarded rate over the last 100 ticks
    trace.limits[k]                         # every node's local limit at tick k (NaN = down)
    jain(trace.published[k])                # e.g. [Stanojevic09]'s JFI(q(t))
    envelope(trace.delivered_Bps, trace.interval_s, G, D)   # the worst window vs G x T + D

Per-node series are float32 (T x N): 600 ticks of 10,000 nodes are 24 MB each.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from drl.lab.fairness import jain  # noqa: F401  (sim.gdrl_graphs, sim.scale import it from here)
from drl.lab.metrics import envelope as _envelope

if TYPE_CHECKING:
    from .engine import Setup, Simulation
    from .tcp import Enforcement


class Trace:
    def __init__(self, setup: "Setup", n_ticks: int, demand, start_s: float = 0.0):
        n = setup.n_nodes
        self.interval_s = setup.interval_s
        self.t = start_s + np.arange(n_ticks) * setup.interval_s
        self.delivered_Bps = np.zeros(n_ticks)   # bytes forwarded by all limiters / interval
        self.arrived_Bps = np.zeros(n_ticks)     # bytes offered to all limiters / interval
        self.limit_sum_Bps = np.zeros(n_ticks)   # sum of alive nodes' local limits
        self.control_Bps = np.zeros(n_ticks)     # gossip + point-to-point bytes / interval
        self.n_alive = np.zeros(n_ticks, dtype=np.int64)
        self.limits = np.full((n_ticks, n), np.nan, dtype=np.float32)
        self.published = np.full((n_ticks, n), np.nan, dtype=np.float32)
        self.node_passed_Bps = np.zeros((n_ticks, n), dtype=np.float32)
        self._passed = demand.passed.copy()      # cumulative counters when the trace began
        self._dropped = demand.dropped.copy()

    def record(self, k: int, sim: "Simulation", enforce: "Enforcement", control_bytes: int) -> None:
        dt = self.interval_s
        alive = sim.net.alive
        passed, dropped = sim.demand.passed, sim.demand.dropped
        tick_passed = passed - self._passed
        self.delivered_Bps[k] = tick_passed.sum() / dt
        self.arrived_Bps[k] = (tick_passed.sum() + (dropped - self._dropped).sum()) / dt
        self.node_passed_Bps[k] = tick_passed / dt
        self._passed, self._dropped = passed.copy(), dropped.copy()
        self.limit_sum_Bps[k] = enforce.limit_Bps[alive].sum()
        self.control_Bps[k] = control_bytes / dt
        self.n_alive[k] = int(alive.sum())
        self.limits[k, alive] = enforce.limit_Bps[alive]
        self.published[k, alive] = sim.publish[alive]



def envelope(delivered_Bps, interval_s: float, global_Bps: float, budget_bytes: int, start_s: float = 0.0) -> dict:
    """The worst window of >= 1 s of a delivered series (B/s per tick) against G x T + D, with
    the keys of the lab's result.json (lab/results.py): ``ratio`` (<= 1: the promise held) at
    ``at_s`` for ``window_s``, and the most carried beyond G x T, ``excess_bytes``; times are
    ``start_s`` plus the offset into the series."""
    e = _envelope([float(x) for x in delivered_Bps], interval_s, global_Bps, budget_bytes)
    at = lambda t: None if t is None else round(t + start_s, 3)   # noqa: E731
    return {"budget_bytes": budget_bytes, "ratio": e["ratio"], "at_s": at(e["ratio_at_s"]),
            "window_s": e["ratio_window_s"], "excess_bytes": round(e["excess"]), "excess_at_s": at(e["at_s"]),
            "excess_window_s": e["window_s"]}
