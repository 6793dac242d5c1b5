"""A fluid model of TCP flows crossing the limiters, vectorised over all flows.

    flows = Flows.build(node=[0, 0, 1], rtt_s=0.04)        # 2 flows at limiter 0, 1 at limiter 1
    tcp = TcpFluid(flows, n_nodes=2, rng=rng)
    tcp.advance(now_s, interval_s, enforce, alive)         # one estimate interval
    tcp.counters(0), tcp.flow_records(0, now_s)            # what agent/estimator.py reads

Each flow's rate follows AIMD once per RTT ([Raghavan07] §5 uses
TCP New Reno): slow start doubles it per RTT, congestion avoidance adds one
MSS per RTT, and a loss event halves it (at most once per RTT, as New Reno
recovers a window's losses together).  The window never drops below one
segment: a loss at a window under two segments is a retransmission timeout,
the flow falls silent for the RTO (200 ms, doubling on each consecutive one)
and resumes at one segment per RTT.  That floor is what TCP does when the
fair share is below a packet per RTT (1249 flows on 50 Mbit/s in [Raghavan07] §5.6:
about 40 kbit/s each, a third of a 1448-byte segment per 40 ms RTT), and it
is why random drop (GRD) loses its grip there while a token bucket (FPS)
does not.  A flow can be bottlenecked upstream
(``cap_Bps``, §5.4): its rate never exceeds the cap.  Each limiter enforces
the allocator's Decision on its flows' aggregate as the datapath would:
BUCKET = token bucket at ``limit_Bps`` with ``bucket_bytes`` depth (75,000
bytes in §5.1), DROP = random drop with ``drop_probability`` (GRD), PASS.
The share of a limiter's bytes it drops is every flow's per-packet loss
probability there; a flow sending k packets in a sub-step sees a loss event
with probability 1 - (1 - p)^k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from drl.agent.model import Mode

MSS = 1448          # bytes of payload per segment
INITIAL_WINDOW = 4  # segments (RFC 3390)
RTO_MIN_S = 0.2     # Linux's minimum retransmission timeout
RTO_MAX_S = 60.0


@dataclass(frozen=True)
class Enforcement:
    """Every limiter's current Decision, as arrays indexed by node."""
    mode: np.ndarray
    limit_Bps: np.ndarray
    drop_probability: np.ndarray
    quota_bytes: np.ndarray          # byte allowance until the next tick; inf = unlimited


@dataclass(frozen=True)
class Flows:
    """Flow table, sorted by limiter so each limiter's flows are one slice."""
    node: np.ndarray
    rtt_s: np.ndarray
    cap_Bps: np.ndarray
    start_s: np.ndarray
    stop_s: np.ndarray

    @staticmethod
    def build(node, rtt_s=0.04, cap_Bps=np.inf, start_s=0.0, stop_s=np.inf) -> "Flows":
        node = np.asarray(node, dtype=np.int64)
        cols = [np.broadcast_to(np.asarray(c, dtype=float), node.shape) for c in
                (rtt_s, cap_Bps, start_s, stop_s)]
        order = np.argsort(node, kind="stable")
        return Flows(node[order], *(c[order].copy() for c in cols))


# NamedTuples, not frozen dataclasses: the estimator reads 1,000 of them a tick and a frozen
# dataclass costs ~1 us to build
class CounterSample(NamedTuple):
    passed_bytes: int
    dropped_bytes: int


class FlowRecord(NamedTuple):
    key: int
    bytes: int
    first_ns: int
    last_ns: int


class TcpFluid:
    def __init__(self, flows: Flows, n_nodes: int, rng: np.random.Generator,
                 bucket_bytes: float = 75_000.0, substep_s: float = 0.01):
        self.flows, self.n_nodes, self.rng = flows, n_nodes, rng
        self.bucket_bytes, self.substep_s = bucket_bytes, substep_s
        n = len(flows.node)
        self.rate = INITIAL_WINDOW * MSS / flows.rtt_s
        self.slow_start = np.ones(n, dtype=bool)
        self.last_cut = np.full(n, -np.inf)
        self.silent_until = np.full(n, -np.inf)        # retransmission timeout running
        self.backoff = np.zeros(n)                     # consecutive timeouts
        self.flow_bytes = np.zeros(n)                   # passed bytes per flow, cumulative
        self.passed = np.zeros(n_nodes)                 # per limiter, cumulative
        self.dropped = np.zeros(n_nodes)
        self.tokens = np.full(n_nodes, bucket_bytes)
        self.slices = np.searchsorted(flows.node, np.arange(n_nodes + 1)).tolist()
        self._first_ns = (flows.start_s * 1e9).astype(np.int64).tolist()
        self._counts: tuple | None = None       # this interval's counters, as lists (counters)
        self._flows: tuple | None = None        # this interval's flow columns, as lists (flow_records)

    def advance(self, now_s: float, interval_s: float, enforce: Enforcement, alive: np.ndarray) -> None:
        self._counts = self._flows = None
        steps = max(1, int(round(interval_s / self.substep_s)))
        dt = interval_s / steps
        for k in range(steps):
            self._substep(now_s + k * dt, dt, enforce, alive)

    def _substep(self, t: float, dt: float, enforce: Enforcement, alive: np.ndarray) -> None:
        f = self.flows
        active = (f.start_s <= t) & (t < f.stop_s) & alive[f.node] & (t >= self.silent_until)
        offered = np.where(active, self.rate * dt, 0.0)
        arrived = np.bincount(f.node, weights=offered, minlength=self.n_nodes)
        passed = self._police(arrived, dt, enforce)
        loss = np.divide(arrived - passed, arrived, out=np.zeros_like(arrived), where=arrived > 0)
        self.passed += passed
        self.dropped += arrived - passed
        self.flow_bytes += offered * (1.0 - loss[f.node])
        self._aimd(t, dt, active, loss[f.node])

    def _police(self, arrived: np.ndarray, dt: float, enforce: Enforcement) -> np.ndarray:
        """Bytes each limiter forwards out of ``arrived`` during ``dt``."""
        avail = self.tokens + enforce.limit_Bps * dt
        bucket = enforce.mode == Mode.BUCKET
        by_bucket = np.minimum(arrived, avail)
        self.tokens = np.where(bucket, np.minimum(self.bucket_bytes, avail - by_bucket), self.tokens)
        by_drop = arrived * (1.0 - enforce.drop_probability)
        return np.where(bucket, by_bucket, np.where(enforce.mode == Mode.DROP, by_drop, arrived))

    def _aimd(self, t: float, dt: float, active: np.ndarray, loss: np.ndarray) -> None:
        f = self.flows
        packets = self.rate * dt / MSS
        p_event = 1.0 - (1.0 - loss) ** packets
        cut = active & (self.rng.random(len(p_event)) < p_event) & (t - self.last_cut >= f.rtt_s)
        grow = active & ~cut
        ss = grow & self.slow_start
        self.rate[ss] *= 2.0 ** (dt / f.rtt_s[ss])
        ca = grow & ~self.slow_start
        self.rate[ca] += MSS / f.rtt_s[ca] ** 2 * dt
        one_segment = MSS / f.rtt_s
        timeout = cut & (self.rate < 2.0 * one_segment)
        self._timeout(t, timeout)
        halve = cut & ~timeout
        self.rate[halve] *= 0.5
        self.last_cut[cut] = t
        self.backoff[grow] = 0.0
        capped = self.rate >= f.cap_Bps
        self.rate = np.clip(self.rate, one_segment, f.cap_Bps)
        self.slow_start &= ~(cut | capped)

    def _timeout(self, t: float, flows: np.ndarray) -> None:
        """RTO: silent for min(RTO_MIN * 2^backoff, RTO_MAX), then one segment per RTT."""
        self.silent_until[flows] = t + np.minimum(RTO_MIN_S * 2.0 ** self.backoff[flows], RTO_MAX_S)
        self.backoff[flows] += 1.0
        self.rate[flows] = MSS / self.flows.rtt_s[flows]

    # --- what the estimator reads ------------------------------------
    # Counters and flow columns as Python lists, converted once an interval for all limiters
    # (a numpy scalar read costs ~100 ns, and 1,000 limiters read a dozen each); int()
    # truncates as astype does, so the records are the same.
    def counters(self, i: int) -> CounterSample:
        if self._counts is None:
            self._counts = self.passed.astype(np.int64).tolist(), self.dropped.astype(np.int64).tolist()
        return CounterSample(self._counts[0][i], self._counts[1][i])

    def flow_records(self, i: int, now_s: float) -> list[FlowRecord]:
        if self._flows is None or self._flows[0] != now_s:
            f = self.flows
            self._flows = (now_s, self.flow_bytes.astype(np.int64).tolist(),
                           (np.minimum(now_s, f.stop_s) * 1e9).astype(np.int64).tolist(), (f.start_s < now_s).tolist())
        _, flow_bytes, last_ns, started = self._flows
        first_ns = self._first_ns
        return [FlowRecord(k, flow_bytes[k], first_ns[k], last_ns[k])
                for k in range(self.slices[i], self.slices[i + 1]) if started[k]]
