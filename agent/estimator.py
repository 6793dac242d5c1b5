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
(``agent.allocators.common.kept_share``; 0 = no filter).  Demand is arrivals, i.e.
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
follows it at the demand's speed (docs/datapath.md "TCP on veth" has the measurements).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_, is_not, mul
from typing import Iterable, Protocol

from drl.agent.model import Local, ewma as smooth, snap_zero

# A flow whose last packet is older than this many intervals, and at least
# IDLE_MIN_S, has ended: it no longer stands for demand.  The floor keeps a TCP
# flow waiting out a retransmission timeout (200 ms minimum, doubling) in the
# sample set, so it is not counted as new, at a bogus rate, when it resumes.
IDLE_INTERVALS = 3
IDLE_MIN_S = 1.0
# A tick that brings at least RESEED_MIN new flows, and at least RESEED_SHARE of the flows
# there were, restarts the older flows' smoothing (Estimator._reseed).
RESEED_MIN, RESEED_SHARE = 2, 0.5


class CounterSample(Protocol):
    passed_bytes: int
    dropped_bytes: int


class FlowRecord(Protocol):
    key: object
    bytes: int
    first_ns: int
    last_ns: int


_KEY, _LAST_NS = attrgetter("key"), attrgetter("last_ns")
_NEW = object()          # the previous record of a flow new to us


@dataclass(slots=True)
class Estimator:
    """Per-flow state is kept in columns (lists) in the order of the last
    update's flow records, not an object per flow: with thousands of flows
    the per-flow work of a tick is what the agent spends its CPU on
    (bench/HISTORY.md "Agent cost with many flows").  A record that is the same
    object as the last update's at its place (Datapath.read_flows hands out
    the same FlowSample while a flow's table entry does not change; most
    flows' entries are not visited between two ticks) only decays, done
    for all of them in one pass; the others take the per-flow path."""
    ewma: float = 0.1
    flow_ewma: float = 0.8
    _last_s: float | None = None
    _last_arrived: int = 0
    _last_passed: int = 0
    _demand: float | None = None
    _sent: float | None = None
    _records: list = field(default_factory=list)     # the last update's flow records, in its order
    _shares: list = field(default_factory=list)      # per record: smoothed share of the class's passed bytes, None before a sample
    _born: list = field(default_factory=list)        # per record: _rounds - its samples (every flow samples in a round)
    _last_ns: list = field(default_factory=list)     # per record: its last_ns
    _rounds: int = 0                                 # updates in which the class passed bytes: every flow took a sample
    _youngest: int = 0                               # max(_born) or more: min(samples) = _rounds - max(_born)
    _unsampled: bool = False                         # a share may be None (no round since the first update)

    def update(self, now_s: float, counters: CounterSample,
               flows: Iterable[FlowRecord] = (), now_ns: int | None = None) -> Local:
        arrived = counters.passed_bytes + counters.dropped_bytes
        if self._last_s is None or now_s <= self._last_s:
            self._last_s, self._last_arrived, self._last_passed = now_s, arrived, counters.passed_bytes
            self._records = list({f.key: f for f in flows}.values())
            self._shares, self._born = [None] * len(self._records), [self._rounds] * len(self._records)
            self._last_ns = list(map(_LAST_NS, self._records))
            self._youngest, self._unsampled = self._rounds, bool(self._records)
            return Local(demand_Bps=0.0, sent_Bps=0.0, sent_total_bytes=counters.passed_bytes)
        dt = now_s - self._last_s
        kept = self.ewma ** dt          # kept_share(ewma, dt) inlined (dt > 0 here): a tick updates every class
        passed = counters.passed_bytes - self._last_passed
        arrived_now = arrived - self._last_arrived
        # snapped: an idle class decays to exactly 0, not to denormals (model.ZERO_BELOW)
        self._demand = snap_zero(smooth(self._demand, arrived_now / dt, kept))
        self._sent = sent = snap_zero(smooth(self._sent, passed / dt, kept))
        new_flows = self._update_flows(flows if isinstance(flows, list) else list(flows), dt, passed, now_ns)
        self._last_s, self._last_arrived, self._last_passed = now_s, arrived, counters.passed_bytes
        shares = self._shares
        if now_ns is not None:
            shares = compress(shares, map((now_ns - _idle_ns(dt)).__le__, self._last_ns))
        # active flows with a share, in the flow table's order: sorting them cost 1-2 ms a tick at 20,000
        rates = [share * sent for share in shares if share] if sent else []
        # positional: a NamedTuple made with keywords costs twice as much (model.py)
        refused = (arrived_now - passed) / arrived_now if arrived_now > 0 else 0.0
        return Local(self._demand, sent, tuple(rates), new_flows, counters.passed_bytes, refused)

    def _update_flows(self, flows: list, dt: float, passed: int, now_ns: int | None) -> int:
        """Smooth every flow's share of the bytes its class passed (module
        docstring); returns how many flows are new.

        Until a flow has been seen for as many intervals as ``flow_ewma``
        remembers, its share is the plain mean of its samples, so its first
        interval does not linger for seconds.  A flow is part of its class,
        so a sample is at most 1: a flow sampled just after a bucket burst
        (its bytes over a few ms) would otherwise start at many times the
        limit, and FPS would divide the limit by that rate and starve the
        newcomer (a CI run measured 1.2 of 4 Mbit/s in a new limiter's third
        second).  A flow the table did not update since the last interval
        (the same record) has a sample of 0: its share decays.
        """
        kept = self.flow_ewma ** dt     # kept_share inlined, as in update
        old = self._records
        changed = list(compress(range(len(flows)), map(is_not, flows, old)))
        if len(flows) >= len(old) and all(flows[i].key == old[i].key for i in changed):
            # the same flows in the same places, new ones after them (Datapath.read_flows)
            prev, shares_before, born, last_ns = old, self._shares, self._born, self._last_ns
            if len(flows) > len(old):
                fresh = len(flows) - len(old)
                prev, shares_before = old + [_NEW] * fresh, shares_before + [0.0] * fresh
                born, last_ns = born + [self._rounds] * fresh, last_ns + [0] * fresh
                changed += range(len(old), len(flows))     # _youngest: the loop below
        else:
            prev, shares_before, born, last_ns, changed = self._align(flows)
        rounds_before = self._rounds
        shares = shares_before
        if passed > 0:     # a round: every flow takes a sample; the unchanged ones 0
            # n samples weigh the past n / (n + 1) until that reaches kept: n / (n + 1) grows
            # with n, so "mature" (weighs kept) is n / (n + 1) >= kept
            oldest = rounds_before - self._youngest         # the fewest samples of any flow
            if not self._unsampled and oldest / (oldest + 1) >= kept:
                shares = list(map(mul, shares, repeat(kept)))     # smooth(s, 0.0, kept), exactly
            else:
                shares = [0.0 if s is None else s * min(kept, (rounds_before - b) / (rounds_before - b + 1))
                          for s, b in zip(shares, born)]
            self._rounds, self._unsampled = rounds_before + 1, False
        new = 0
        for i in changed:
            f, before = flows[i], prev[i]
            if before is _NEW:
                new += 1
                # A flow new to us: its bytes since it entered the flow table against the class's rate.
                span = dt if now_ns is None else max((now_ns - f.first_ns) / 1e9, 1e-3)
                share, n, sample = None, 0, (f.bytes / span / self._sent if self._sent else 1.0)
            else:
                share, n = shares_before[i], rounds_before - born[i]
                sample = (f.bytes - before.bytes) / passed if passed > 0 else None
            if sample is not None:
                share = smooth(share, min(1.0, max(0.0, sample)), min(kept, n / (n + 1)))
                n += 1
            # (read above: in place is safe)
            shares[i], born[i], last_ns[i] = share, self._rounds - n, f.last_ns
            if self._rounds - n > self._youngest:
                self._youngest = self._rounds - n
        if new >= RESEED_MIN and new >= RESEED_SHARE * (len(flows) - new):
            self._reseed(prev, born)
        self._records, self._shares, self._born, self._last_ns = flows, shares, born, last_ns
        return new

    def _reseed(self, prev: list, born: list) -> None:
        """Many flows joined (RESEED_*): every older flow's share counts as one sample from now
        on, as if it were young.  Their shares are about to fall to a fraction of what they
        were, and at flow_ewma's pace (0.8 left after a second) the fastest of them stood far
        above the newcomers for seconds, so FPS took the newcomers for flows bottlenecked
        elsewhere: a host whose 1 flow was joined by 10 was at 0.73 of its share 8 s later,
        0.92 after 4 s with this (docs/datapath.md "TCP on veth")."""
        one = self._rounds - 1
        for i, before in enumerate(prev):
            if before is not _NEW and born[i] < one:
                born[i] = one
        self._youngest = max(self._youngest, one)

    def _align(self, flows: list) -> tuple[list, list, list, list, list]:
        """The last update's record, share, _born and last_ns of each flow in ``flows``, in
        its order (_NEW, 0.0, _rounds, 0 for a flow new to us; the columns are this
        update's to change), and the places whose record is not the last update's, when
        the flows do not come in the same order as last time: Datapath.read_flows keeps a
        flow's place and puts new flows last (_update_flows takes the columns as they are
        then), so this happens when flows left (its full read of the table, a flow back in
        another class) or with a caller that reorders.  Each flow is found by its record,
        or by its key."""
        old = self._records
        # A record handed out again (read_flows does so for an entry that did not change) is
        # found by its identity, an int hash; only the others by key, a tuple hash each.
        at = list(map(dict(zip(map(id, old), range(len(old)))).get, map(id, flows), repeat(None)))
        missing = list(compress(range(len(flows)), map(is_, at, repeat(None))))
        if missing:
            index = {old[j].key: j for j in set(range(len(old))).difference(at)}
            for i in missing:
                at[i] = index.pop(flows[i].key, len(old))
        prev = list(map([*old, _NEW].__getitem__, at))
        born = list(map([*self._born, self._rounds].__getitem__, at))
        self._youngest = max(born, default=self._rounds)
        return (prev, list(map([*self._shares, 0.0].__getitem__, at)), born,
                list(map([*self._last_ns, 0].__getitem__, at)), list(compress(range(len(flows)), map(is_not, flows, prev))))


def _idle_ns(dt: float) -> int:
    return int(max(IDLE_INTERVALS * dt, IDLE_MIN_S) * 1e9)
