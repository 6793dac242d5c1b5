"""agent/estimator.py: counters and flow table -> Local, with the paper's 1-second EWMA."""
from __future__ import annotations

import pytest

from drl.agent.kernel.datapath import Counters, FlowKey, FlowSample
from drl.agent.estimator import Estimator

S = 1_000_000_000   # ns per s


def key(port: int) -> FlowKey:
    return FlowKey(4, 6, "10.0.0.1", "10.0.0.2", port, 80)


def flow(port: int, nbytes: int, first_s: float, last_s: float) -> FlowSample:
    return FlowSample(key(port), 0, nbytes, nbytes // 1000, int(first_s * S), int(last_s * S))


def test_first_update_is_a_baseline_and_the_second_gives_rates():
    est = Estimator(ewma=0.0)
    assert est.update(10.0, Counters(1000, 1, 500, 1)).demand_Bps == 0.0
    local = est.update(10.5, Counters(1000 + 400_000, 400, 500 + 100_000, 100))
    assert local.demand_Bps == pytest.approx(1_000_000)      # (passed + dropped) / 0.5 s
    assert local.sent_Bps == pytest.approx(800_000)          # passed only
    assert local.sent_total_bytes == 401_000
    assert local.refused_share == pytest.approx(0.2)         # this interval's dropped / arrived, unsmoothed
    assert est.update(11.0, Counters(1000 + 400_000, 400, 500 + 100_000, 100)).refused_share == 0.0


def test_ewma_is_per_second_whatever_the_interval():
    """0.1 left after one second: two 0.5 s ticks keep sqrt(0.1) each."""
    est = Estimator(ewma=0.1)
    est.update(0.0, Counters())
    est.update(0.5, Counters(passed_bytes=500_000))           # 1 MB/s: the first sample is taken as is
    local = est.update(1.5, Counters(passed_bytes=500_000))   # then 0 B/s for one second
    assert local.demand_Bps == pytest.approx(0.1 * 1_000_000)


def test_flow_rates_come_from_byte_deltas_and_new_flows_are_counted():
    est = Estimator(ewma=0.0)
    est.update(1.0, Counters(10_000), [flow(1, 10_000, 0.5, 1.0)], now_ns=1 * S)
    local = est.update(1.1, Counters(35_000), [flow(1, 30_000, 0.5, 1.1), flow(2, 5_000, 1.05, 1.1)],
                       now_ns=int(1.1 * S))
    assert local.new_flows == 1
    assert sorted(local.flow_rates_Bps) == pytest.approx([100_000, 200_000])   # 5 kB / 0.05 s; 20 kB / 0.1 s


def test_a_flow_in_a_retransmission_timeout_is_not_new_when_it_resumes():
    est = Estimator(ewma=0.0)
    est.update(1.0, Counters(50_000), [flow(1, 50_000, 0.0, 1.0)], now_ns=1 * S)
    local = est.update(1.4, Counters(50_000), [flow(1, 50_000, 0.0, 1.0)], now_ns=int(1.4 * S))   # silent 400 ms
    assert local.flow_rates_Bps == () and local.new_flows == 0
    local = est.update(1.5, Counters(51_000), [flow(1, 51_000, 0.0, 1.5)], now_ns=int(1.5 * S))
    assert local.flow_rates_Bps == pytest.approx((10_000,)) and local.new_flows == 0


def test_an_idle_flow_leaves_the_rates_after_a_second():
    est = Estimator(ewma=0.5)
    est.update(1.0, Counters(50_000), [flow(1, 50_000, 0.0, 1.0)], now_ns=1 * S)
    est.update(1.1, Counters(60_000), [flow(1, 60_000, 0.0, 1.1)], now_ns=int(1.1 * S))
    assert est.update(2.0, Counters(60_000), [flow(1, 60_000, 0.0, 1.1)], now_ns=2 * S).flow_rates_Bps != ()
    assert est.update(2.2, Counters(60_000), [flow(1, 60_000, 0.0, 1.1)], now_ns=int(2.2 * S)).flow_rates_Bps == ()


def test_no_flow_counts_faster_than_its_class():
    """A flow sampled 2 ms after a 128 KiB bucket burst: 64 kB / 2 ms would be 32 MB/s,
    at a class whose smoothed demand is 200 kB/s (what starved a CI run's FPS newcomer)."""
    est = Estimator(ewma=0.1)
    est.update(1.0, Counters(0))
    est.update(1.05, Counters(10_000))                                              # 200 kB/s so far
    local = est.update(1.1, Counters(140_000), [flow(1, 64_000, 1.098, 1.1)], now_ns=int(1.1 * S))
    assert local.new_flows == 1
    assert max(local.flow_rates_Bps) <= local.demand_Bps < 1e6


def trading_flows(est: Estimator, seconds: float) -> float:
    """Two flows that trade 80 % / 20 % of a 1 MB/s class every 500 ms, as TCP
    flows inside one bucket do; the highest max-flow-rate / sent-rate of the
    last half."""
    est.update(0.0, Counters(0), [flow(1, 0, 0.0, 0.0), flow(2, 0, 0.0, 0.0)], now_ns=0)
    a = b = 0
    peak = 0.0
    ticks = int(seconds / 0.05)
    for tick in range(1, ticks + 1):
        now = tick * 0.05
        a, b = (a + 40_000, b + 10_000) if (tick // 10) % 2 else (a + 10_000, b + 40_000)
        local = est.update(now, Counters(a + b), [flow(1, a, 0.0, now), flow(2, b, 0.0, now)], now_ns=int(now * S))
        if tick > ticks / 2:
            peak = max(peak, max(local.flow_rates_Bps) / local.sent_Bps)
    return peak


def test_flows_that_trade_the_bucket_among_themselves_count_at_their_long_run_share():
    """The max of per-flow rates smoothed like the demand swings towards the
    80 % flow; smoothing the shares for longer keeps it near the 50 % both have."""
    assert trading_flows(Estimator(ewma=0.1, flow_ewma=0.1), 10.0) >= 0.62
    assert trading_flows(Estimator(ewma=0.1, flow_ewma=0.8), 10.0) <= 0.55


def test_a_lone_flow_follows_its_class_at_the_demands_speed():
    """The share is smoothed, not the rate: when the limit doubles, a lone flow's
    rate is the class's sent rate at once, not a second later."""
    est = Estimator(ewma=0.1, flow_ewma=0.9)
    sent = 0
    for tick in range(200):
        now = tick * 0.05
        sent += 10_000 if tick < 100 else 20_000
        local = est.update(now, Counters(sent), [flow(1, sent, 0.0, now)], now_ns=int(now * S))
    assert local.sent_Bps > 390_000 and local.flow_rates_Bps == pytest.approx((local.sent_Bps,))


def test_columns_match_a_flow_by_flow_reference():
    """The column form (agent/estimator.py) gives what the plain per-flow loop it replaced
    gave (reference below, the code before the single-pass rewrite), on random tables: flows entering,
    leaving, reordered, touched or not, the same record object handed out again."""
    import random

    rng = random.Random(20)
    for run in range(30):
        est, ref = Estimator(ewma=0.1, flow_ewma=rng.choice([0.0, 0.5, 0.8])), _Reference(0.1, 0.8)
        ref.flow_ewma = est.flow_ewma
        table: dict[int, FlowSample] = {}
        now, passed = 1.0, 0
        for tick in range(60):
            now += rng.choice([0.05, 0.1, 0.1, 0.3])
            for port in rng.sample(range(200), rng.randrange(0, 30)):
                nbytes = rng.choice([0, 500, 20_000])
                old = table.get(port)
                if old is None:
                    table[port] = flow(port, nbytes, now - 0.01, now)
                elif rng.random() < 0.1:
                    del table[port]
                else:
                    table[port] = flow(port, old.bytes + nbytes, old.first_ns / S, now)
                passed += nbytes
            flows = list(table.values())
            if rng.random() < 0.2:
                rng.shuffle(flows)
            counters = Counters(passed, 0, rng.randrange(0, 1000) * tick)
            ns = int(now * S) if run % 3 else None
            got, want = est.update(now, counters, flows, ns), ref.update(now, counters, flows, ns)
            got_rates, want_rates = sorted(got.flow_rates_Bps), sorted(want.flow_rates_Bps)
            assert got_rates == pytest.approx(want_rates, rel=1e-12)
            assert (got.new_flows, got.demand_Bps, got.sent_Bps) == (want.new_flows, want.demand_Bps, want.sent_Bps)


class _Reference:
    """agent/estimator.py's flow loop before the column form (commit 5122534)."""

    def __init__(self, ewma: float, flow_ewma: float):
        from drl.agent.allocators.common import kept_share
        from drl.agent.model import ewma as smooth
        self.kept_share, self.smooth = kept_share, smooth
        self.ewma, self.flow_ewma = ewma, flow_ewma
        self.last_s = self.demand = self.sent = None
        self.last_arrived = self.last_passed = 0
        self.flows: dict = {}

    def update(self, now_s, counters, flows, now_ns):
        from drl.agent.estimator import IDLE_INTERVALS, IDLE_MIN_S, RESEED_MIN, RESEED_SHARE
        from drl.agent.model import Local
        arrived = counters.passed_bytes + counters.dropped_bytes
        if self.last_s is None or now_s <= self.last_s:
            self.last_s, self.last_arrived, self.last_passed = now_s, arrived, counters.passed_bytes
            self.flows = {f.key: [f.bytes, None, 0, True] for f in flows}
            return Local(demand_Bps=0.0, sent_Bps=0.0, sent_total_bytes=counters.passed_bytes)
        dt = now_s - self.last_s
        kept = self.kept_share(self.ewma, dt)
        passed = counters.passed_bytes - self.last_passed
        self.demand = self.smooth(self.demand, (arrived - self.last_arrived) / dt, kept)
        self.sent = self.smooth(self.sent, passed / dt, kept)
        kept = self.kept_share(self.flow_ewma, dt)
        idle_ns = int(max(IDLE_INTERVALS * dt, IDLE_MIN_S) * 1e9)
        seen, new = {}, 0
        for f in flows:
            flow = self.flows.get(f.key)       # [bytes, share, samples, active]
            if flow is None:
                new += 1
                span = dt if now_ns is None else max((now_ns - f.first_ns) / 1e9, 1e-3)
                flow, sample = [f.bytes, None, 0, True], (f.bytes / span / self.sent if self.sent else 1.0)
            else:
                sample = (f.bytes - flow[0]) / passed if passed > 0 else None
            if sample is not None:
                n = flow[2]
                flow[1] = self.smooth(flow[1], min(1.0, max(0.0, sample)), min(kept, n / (n + 1)))
                flow[2] = n + 1
            flow[0] = f.bytes
            flow[3] = now_ns is None or now_ns - f.last_ns <= idle_ns
            seen[f.key] = flow
        if new >= RESEED_MIN and new >= RESEED_SHARE * (len(seen) - new):   # the one change since
            for flow in seen.values():
                flow[2] = min(flow[2], 1)
        self.flows = seen
        self.last_s, self.last_arrived, self.last_passed = now_s, arrived, counters.passed_bytes
        rates = sorted((f[1] * self.sent for f in self.flows.values() if f[3] and f[1]), reverse=True)
        return Local(demand_Bps=self.demand, sent_Bps=self.sent, flow_rates_Bps=tuple(rates),
                     new_flows=new, sent_total_bytes=counters.passed_bytes)


def test_ten_flows_joining_one_restart_its_smoothing():
    """A lone flow holds its class; 10 flows join and from then on all 11 get the same.  Half
    a second later the old flow's rate is near the newcomers' (Estimator._reseed): at
    flow_ewma's pace it would still read ~6 times theirs, and FPS would take the newcomers
    for flows bottlenecked elsewhere (the fastest is what fair_band measures against)."""
    est = Estimator(ewma=0.1, flow_ewma=0.8)
    sizes = {1: 0}
    for tick in range(1, 61):                        # 3 s alone, then 10 more at tick 40
        now = tick * 0.05
        if tick == 40:
            sizes.update({port: 0 for port in range(2, 12)})
        for port in sizes:
            sizes[port] += 11_000 // len(sizes)
        flows = [flow(port, n, 1.9 if port > 1 else 0.0, now) for port, n in sizes.items()]
        local = est.update(now, Counters(sum(sizes.values())), flows, now_ns=int(now * S))
    rates = local.flow_rates_Bps
    assert len(rates) == 11 and max(rates) <= 1.5 * min(rates), rates
