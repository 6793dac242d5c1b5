"""FPS, flow proportional share ([Raghavan07] §3.2.2, Fig. 2).

    >>> from drl.agent.allocators import create
    >>> alloc = create("fps", ewma=0.1, regime_threshold=0.95)

Each node enforces a token bucket whose rate is its share of the global limit L
in proportion to a *weight*, the number of unbottlenecked TCP flows its demand
is worth.  Every estimate interval (paper: 50 ms, 100 ms on PlanetLab; FPS is
insensitive to it, §5.2) FPS-ESTIMATE runs:

* regime 1, local demand meets the local limit (Fig. 2 lines 4-6): some flow is
  unbottlenecked, the fastest sampled flow stands for one (here: the flows near
  it, ``fair_band``), and weight = local limit / max flow rate;
* regime 2, demand below the limit (lines 8-9): every flow is bottlenecked
  elsewhere, and the weight is the one that makes line 10 give limit = demand:
  weight = demand * remoteweights / (L - demand)  (the OCR of line 9 is garbled);
* line 10: local limit = weight * L / (remoteweights + weight);
* line 11: the weight is published to the peers.

Choices where the paper leaves room, each explained at its code:

* ``regime_threshold`` (0.95): regime 1 when demand >= 0.95 x the local limit.
  A policed TCP aggregate's arrival rate hovers just *under* its limit (the
  sawtooth, EWMA lag), so the paper's strict ">=" would misread unbottlenecked
  aggregates as bottlenecked and cut their limit to their demand, again and
  again.  The price: a bottlenecked aggregate whose limit comes within 5 % of
  its demand re-enters regime 1 and probes for more, the oscillation §3.2.2
  calls necessary (tests/unit/allocators/test_alloc_fps.py measures it on Fig. 7's case).
* ``fair_band`` (0.4): the rate of an unbottlenecked flow (line 6's "max
  flow rate") is the mean rate of the sampled flows within this share of the
  fastest, not the fastest alone.  Flows sharing one bucket do not share it
  evenly: BBR flows behind a policer settle at rates a few times apart, and in
  shape mode TCP Small Queues leave each flow one or two packets in the
  class's FIFO, so flows run at exactly 1x or 2x of each other (a 40 ms run:
  five at 0.64, two at 1.28 Mbit/s).  Dividing by the fastest then counted 7
  flows as 5 and gave the 3-flow limiter 0.40 of the limit instead of 0.30.
  Flows slower than 0.4 x the fastest are taken as bottlenecked elsewhere and
  count for their rate, as in the paper; with even sharing the mean is the
  fastest, so Fig. 2 is unchanged.
* ``refused_share`` (0.05) and ``refused_hold_s`` (3.0): an interval in
  which the bucket refused at least 5 % of the arriving bytes makes the
  limiter a bottleneck (regime 1) for the next 3 s, whatever its demand.
  Demand alone misses senders that pace instead of pushing until loss: BBR,
  having met a policer (20 % loss over a few round trips), sends at what it
  got for 48 round trips (~2 s at a 40 ms RTT) and shows no unmet demand, so
  line 4 read it as bottlenecked elsewhere and cut its limit to that rate,
  where its next probe met the policer again (a newcomer stayed at 0.5 of
  2 Mbit/s for seconds; docs/lab.md "Real paths").  While held without
  meeting line 4's test, the flows count for what they send, not the limit
  they leave unused: weight = sent rate / the per-flow rate (fair_band).
  An aggregate bottlenecked elsewhere is refused next to nothing (its limit
  covers its demand), so the hold does not start there.
* ``hold_rate_share`` (0.7): the hold counts only while demand stays at or
  above 0.7 x the rate the aggregate sent when it was last refused.  A paced sender
  keeps sending what it got; an aggregate whose flows became bottlenecked
  downstream of a limiter it was filling drops well below (5 Mbit/s to 2 in
  tests/kernel/test_allocators.py), and for 3 s the hold would count its
  flows as unbottlenecked and keep the capacity it no longer uses (the freed
  capacity moved in 3.8 s instead of 2).
* ``refused_quiet_max_s`` (60): a hold is a probe, and one that did not pay
  is not repeated at once.  Open-loop demand just under its fair share,
  whose limit line 9 set to that demand, is refused by its own bursts, and
  the hold handed it the fair share it did not use: in the simulator's
  churn run (1,000 limiters, Poisson arrivals) the aggregate fell to 0.935
  of the limit, against 0.976 with no hold (bench/RESULTS.md "churn").  So
  refusals renew a hold only once it has paid, i.e. demand grew past 1.5 x what it
  was when the hold began (a sender took the room: a BBR newcomer grows
  several times); a hold that ran out unpaid allows none for 3 s x 4^k
  after the k-th such hold in a row, at most 60 s (churn: 0.970), times a factor
  between 0.5 and 1 drawn from the node id and k: limiters that started
  together otherwise probe together, and with the sum tree's exact sums the
  churn run's 1,000 limiters all held at once 17 s and 68 s after their
  start, taking the aggregate to 0.924 of the limit for a second.
* ``ewma`` (0.1): the paper's "1-second EWMA parameter" (§5.1, footnote 4),
  applied to the weight ("we apply an EWMA to smooth this oscillation",
  §3.2.2): the share of the old weight left after one second; a tick of
  ``dt`` seconds keeps ewma**dt (0.891 at 50 ms).  0 = no smoothing.
* ``min_flow_fraction`` (1e-4): sampled flows slower than this share of L are
  discarded (the paper "discard[s] small flows from our set"), so a sample set
  holding only trickles cannot claim a huge weight; it caps a node's weight at
  1/min_flow_fraction flows (10,000; the paper's largest case is 3,500 flows at
  one limiter, §5.6).  A limit below that same rate counts as zero for slow
  start, which is why it must be above 0: a limit of exactly 0 would give
  weight 0 / max flow rate = 0 for ever.
* ``sample_probability`` (0.1): Fig. 2 FPS-HANDLE-PACKET's resampleprob, the
  chance a packet of an untracked flow enters the datapath's flow table.  The
  daemon hands it to the datapath; the allocator only reads the flow rates.
* Line 10 is evaluated on the weights every node has seen: its own weight as
  published last tick and the peers' as received.  Then the local limits sum
  to L exactly whenever the nodes' views agree; with the freshly computed weight,
  as Fig. 2 writes it, they would overshoot or undershoot by the change in
  weights during every transient.  The cost is one interval of delay.
* Slow start (§3.2.2, last paragraph): demand at a limiter whose limit is
  (near) zero is one bottlenecked flow for its first interval: its limit is its
  demand (at most L/N) and it publishes the line-9 weight for that demand,
  unsmoothed, so the peers make room.  The datapath's zero-rate burst lets the
  first packets through.  Only then do local limits sum to more than L.
* Idle: the paper does not say what a node with no demand holds.  Line 10 gives a
  node with any weight at all, next to peers with none, the whole limit, and the
  weights of an idle cluster decay towards 0 together; so an idle node whose
  peers have no weight holds L/N (common.idle_split) and weights reach exactly 0
  (model.snap_zero), and an idle cluster holds the static split.
* Stale peers follow §5.6 through the view: their weights count as zero
  (``view.remote_sum``) and L shrinks by 1/N each (``effective_limit``).

The bucket depth is the datapath's (paper: 75,000 bytes, a little above the
bandwidth-delay product, §5.1).  Local fields read: ``demand_Bps`` (arrivals,
passed + dropped) and ``flow_rates_Bps`` (the sampled flows' rates).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from drl.agent.model import SLOW_START_Bps, Decision, Mode, Snapshot, Step, effective_limit, ewma, snap_zero
from .common import check_range, idle_split, kept_share

UNBOTTLENECKED = "unbottlenecked"
BOTTLENECKED = "bottlenecked"
SLOW_START = "slow-start"
PAID_GROWTH = 1.5     # a hold paid off: demand grew past 1.5 x the demand when it began
UNPAID_MAX = 16       # unpaid holds counted in a row, at most: 3 s x 4^16 is 400 years, and 4^k stays a float


class Hold(NamedTuple):
    """The refusal hold (module docstring): regime 1 until ``until`` while demand stays near
    ``sent_Bps``, what went out when the bucket last refused; ``paid``: demand grew past
    PAID_GROWTH x ``demand_Bps``, the demand when the hold began, so a sender took the room.  After
    ``unpaid`` holds in a row that did not pay, none before ``quiet_until``."""
    until: float = float("-inf")
    sent_Bps: float = 0.0
    demand_Bps: float = 0.0
    paid: bool = False
    quiet_until: float = float("-inf")
    unpaid: int = 0


class FpsState(NamedTuple):
    weight: float | None = None       # the weight published last tick; None before the first
    limit_Bps: float | None = None    # the local limit enforced since last tick
    now: float | None = None          # when that was decided (for the per-second EWMA)
    hold: Hold = Hold()


def _spread(node_id: str, k: int) -> float:
    """A factor in [0.5, 1) for the k-th quiet period, the same for a node every time (the
    allocator is pure) and different between nodes: limiters that started together must not
    probe together (``refused_quiet_max_s`` in the module docstring)."""
    return 0.5 + (zlib.crc32(f"{node_id}/{k}".encode()) % 4096) / 8192


def proportional_share(weight: float, remote_weights: float, limit_Bps: float, n_sharing: int) -> float:
    """FPS-ESTIMATE line 10: weight * L / (remoteweights + weight).

    When nobody has any weight (an idle cluster) every node takes L / n_sharing,
    the static split, which still sums to L across the nodes sharing it.
    """
    total = weight + remote_weights
    if total <= 0.0:
        return limit_Bps / n_sharing
    return limit_Bps * (weight / total)     # this order: no underflow for tiny weights


def bottlenecked_weight(demand_Bps: float, remote_weights: float, limit_Bps: float) -> float:
    """FPS-ESTIMATE line 9: the weight for which line 10 gives local limit = demand.

    Needs demand < L (regime 2 guarantees it, but for no demand at all).  With no
    remote weight any positive weight would take all of L, so the bottlenecked
    demand claims none and the limit comes from the idle split of
    ``proportional_share``.  Nor is there anything to claim when L is 0: silent
    peers' datapaths may still pass all of it (effective_limit).
    """
    if remote_weights <= 0.0 or demand_Bps >= limit_Bps:
        return 0.0
    return demand_Bps * remote_weights / (limit_Bps - demand_Bps)


@dataclass(frozen=True)
class FlowProportionalShare:
    name: ClassVar[str] = "fps"
    reads_sum: ClassVar[bool] = True     # reads only the peers' sum: the sum tree may supply it
    ewma: float = 0.1
    sample_probability: float = 0.1
    min_flow_fraction: float = 1e-4
    regime_threshold: float = 0.95
    fair_band: float = 0.4
    refused_share: float = 0.05
    refused_hold_s: float = 3.0
    hold_rate_share: float = 0.7
    refused_quiet_max_s: float = 60.0

    def __post_init__(self) -> None:
        check_range("ewma", self.ewma, 0.0, 1.0, high_open=True)
        check_range("sample_probability", self.sample_probability, 0.0, 1.0, low_open=True)
        check_range("min_flow_fraction", self.min_flow_fraction, 0.0, 1.0,
                    low_open=True, high_open=True)
        check_range("regime_threshold", self.regime_threshold, 0.0, 1.0, low_open=True)
        check_range("fair_band", self.fair_band, 0.0, 1.0, low_open=True)
        check_range("refused_share", self.refused_share, 0.0, 1.0, low_open=True)
        check_range("refused_hold_s", self.refused_hold_s, 0.0, float("inf"))
        check_range("hold_rate_share", self.hold_rate_share, 0.0, 1.0)
        check_range("refused_quiet_max_s", self.refused_quiet_max_s, 0.0, float("inf"))

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> FpsState:
        return FpsState()

    def step(self, state: FpsState, snap: Snapshot) -> Step:
        limit_Bps = effective_limit(snap)                    # §5.6: L less 1/N per stale peer
        remote = max(0.0, snap.view.remote_sum)              # line 8 (stale peers count 0)
        n_sharing = 1 + snap.view.n_alive
        demand = snap.local.demand_Bps                       # line 3
        # Line 10 on the weights everyone has seen (own as published last tick); an idle
        # node whose peers have no weight holds L/N, not all of L (common.idle_split).
        share_Bps = idle = idle_split(demand, remote, limit_Bps, n_sharing)
        if idle is None:
            share_Bps = proportional_share(state.weight or 0.0, remote, limit_Bps, n_sharing)
        current = share_Bps if state.limit_Bps is None else state.limit_Bps
        hold = self._hold(state.hold, snap)
        held = snap.now < hold.until and demand >= self.hold_rate_share * hold.sent_Bps

        if demand > 0.0 and current < self.min_flow_fraction * limit_Bps:
            # Slow start: new demand at a zero limit is one bottlenecked flow.
            regime = SLOW_START
            local_Bps = min(demand, limit_Bps / n_sharing)
            ideal = bottlenecked_weight(local_Bps, remote, limit_Bps)
            weight = snap_zero(ideal)                        # nothing to smooth it with
        else:
            regime, ideal = self._estimate(demand, current, snap, limit_Bps, remote, held)
            keep = kept_share(self.ewma, self._elapsed(state, snap))
            weight = snap_zero(ewma(state.weight, ideal, keep))   # decays to exactly 0 (model.ZERO_BELOW)
            local_Bps = share_Bps

        # mode, limit, drop probability, publish (line 11), quota, info: positional (model.py)
        decision = Decision(Mode.BUCKET, local_Bps, 0.0, weight, None,
                            {"regime": regime, "weight": weight, "ideal_weight": ideal,
                             "remote_weights": remote, "share_Bps": share_Bps, "idle_split": idle is not None})
        return Step(FpsState(weight, local_Bps, snap.now, hold), decision)

    def _hold(self, hold: Hold, snap: Snapshot) -> Hold:
        """The hold after this interval: begun by a refusing interval, renewed by one once
        it paid, ended by time (refused_quiet_max_s in the module docstring)."""
        now, local = snap.now, snap.local
        if float("-inf") < hold.until <= now:            # it ran out
            unpaid = 0 if hold.paid else min(hold.unpaid + 1, UNPAID_MAX)
            quiet_s = (min(self.refused_quiet_max_s, self.refused_hold_s * 4 ** unpaid) * _spread(snap.node_id, unpaid)
                       if unpaid else 0.0)
            hold = Hold(quiet_until=now + quiet_s, unpaid=unpaid)
        if now < hold.until and local.demand_Bps >= PAID_GROWTH * hold.demand_Bps:
            hold = hold._replace(paid=True)
        if local.refused_share >= self.refused_share:
            if now >= max(hold.until, hold.quiet_until):
                hold = hold._replace(until=now + self.refused_hold_s, sent_Bps=local.sent_Bps,
                                     demand_Bps=local.demand_Bps)
            elif hold.paid:
                hold = hold._replace(until=now + self.refused_hold_s, sent_Bps=local.sent_Bps)
        return hold

    def _estimate(self, demand: float, current: float, snap: Snapshot,
                  limit_Bps: float, remote: float, held: bool) -> tuple[str, float]:
        """FPS-ESTIMATE lines 1-9: the regime and the ideal weight; ``held``: the
        bucket refused enough lately to be the bottleneck (module docstring)."""
        # Line 4, with the tolerance explained in the module docstring.  A limit
        # above L (a peer just went stale) is judged against L.
        limited = demand >= self.regime_threshold * min(current, limit_Bps)
        if demand <= 0.0 or not (limited or held):
            return BOTTLENECKED, bottlenecked_weight(demand, remote, limit_Bps)   # lines 8-9
        # Lines 5-6: the flows near the fastest stand for unbottlenecked ones
        # (fair_band); flows below min_flow_fraction of L are discarded (§3.2.2).
        # An aggregate with no flow sampled yet counts as one flow.
        rates, floor = snap.local.flow_rates_Bps, self.min_flow_fraction * limit_Bps
        fastest = max(rates, default=0.0)
        if fastest <= 0.0 or fastest < floor:
            return UNBOTTLENECKED, 1.0
        # Line 6.  Below the datapath's slow-start floor more goes out than the
        # limit says; dividing the limit would keep a starved limiter's weight
        # near 0 for good, so there what went out is the numerator, as it is
        # when only the hold makes this regime 1.
        sent = snap.local.sent_Bps
        local_Bps = sent if not limited else current if current >= SLOW_START_Bps else max(current, sent)
        near = max(self.fair_band * fastest, floor)      # one pass: thousands of flows
        unbottlenecked = [rate for rate in rates if rate >= near]
        return UNBOTTLENECKED, local_Bps * len(unbottlenecked) / sum(unbottlenecked)

    @staticmethod
    def _elapsed(state: FpsState, snap: Snapshot) -> float:
        """Seconds since the last step (the configured interval on the first)."""
        return snap.interval_s if state.now is None else snap.now - state.now
