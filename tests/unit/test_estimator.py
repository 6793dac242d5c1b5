"""agent/estimator.py: counters and flow table -> Local, with the paper's 1-second EWMA."""
from __future__ import annotations

import pytest

from drl.agent.datapath import Counters, FlowKey, FlowSample
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
    assert local.flow_rates_Bps == pytest.approx((200_000, 100_000))   # 20 kB / 0.1 s; 5 kB / 0.05 s


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
    assert local.flow_rates_Bps[0] <= local.demand_Bps < 1e6


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
            peak = max(peak, local.flow_rates_Bps[0] / local.sent_Bps)
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
