"""An idle cluster, then traffic on every host at once: the hosts still add up to one
bucket of the global limit.

Every node runs the agent's estimator on its counters (so an idle class's rates
decay as the agent's do) and reads its peers' values as float32, as the wire
carries them.  An FPS weight that decayed to 1e-49 used to reach the peers as
0.0 while its owner kept it, and line 10 then gave every idle node the whole
limit: traffic coming back on three hosts at once passed 2x the limit in its
first second.
"""
from __future__ import annotations


import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.allocators import create
from drl.agent.estimator import Estimator
from drl.agent.model import Mode, snap_zero

from netharness import Net

L = 1.25e6            # 10 Mbit/s
INTERVAL = 0.1
# Bucket allocators whose limits in force during the first busy tick (decided on the last
# idle one) and the first busy tick's own limits add up to at most L.
HOLD_FROM_FIRST_TICK = ["fps", "static", "lease", "gdrl", "fillratio"]
# GTB learns of the others' new arrivals one gossip round late (gtb.py): only the limits
# in force when the traffic comes back are bounded.
HOLD_WHILE_IDLE = ["gtb"]


class Host:
    """A node's offered load, the counters its datapath would keep, and the agent's estimator."""

    def __init__(self) -> None:
        self.estimator = Estimator()
        self.passed = self.dropped = 0
        self.offered_Bps = 0.0

    def tick(self, now: float, decision) -> object:
        arrived = self.offered_Bps * INTERVAL
        if decision is None or decision.mode == Mode.PASS:
            passed = arrived
        elif decision.mode == Mode.DROP:
            passed = arrived * (1.0 - decision.drop_probability)
        else:
            passed = min(arrived, decision.limit_Bps * INTERVAL)
        self.passed += int(passed)
        self.dropped += int(arrived) - int(passed)
        return self.estimator.update(now, _Counters(self.passed, self.dropped))


class _Counters:
    def __init__(self, passed: int, dropped: int) -> None:
        self.passed_bytes, self.dropped_bytes = passed, dropped


def _run(net: Net, hosts: dict[str, Host], seconds: float) -> None:
    for _ in range(round(seconds / INTERVAL)):
        now = net.tick_no * INTERVAL
        for m in net.live:
            net.local[m] = hosts[m].tick(now, net.decision.get(m))
        net.tick()


def _limits(net: Net) -> float:
    return sum(net.decision[m].limit_Bps for m in net.live)


def idle_then_busy(name: str, n: int, loads: list[float], idle_s: float) -> tuple[float, float, Net]:
    """Busy (``loads`` x L each) for 10 s, idle for ``idle_s``, then every node at 2 L at once:
    (limits in force during the first busy tick, the first busy tick's limits) / L."""
    members = [f"n{i}" for i in range(n)]
    net = Net(create(name), members, L, interval_s=INTERVAL)
    hosts = {m: Host() for m in members}
    for m, load in zip(members, loads):
        hosts[m].offered_Bps = load * L
    _run(net, hosts, 10.0)
    for h in hosts.values():
        h.offered_Bps = 0.0
    _run(net, hosts, idle_s)
    in_force = _limits(net)
    for h in hosts.values():
        h.offered_Bps = 2 * L
    _run(net, hosts, INTERVAL)
    return in_force / L, _limits(net) / L, net


@pytest.mark.parametrize("name", HOLD_FROM_FIRST_TICK + HOLD_WHILE_IDLE)
@settings(max_examples=8, deadline=None)
@given(n=st.integers(2, 6), loads=st.lists(st.floats(0.0, 2.0), min_size=6, max_size=6),
       idle_s=st.floats(60.0, 120.0))
def test_an_idle_cluster_holds_the_limit_when_traffic_comes_back_everywhere(name, n, loads, idle_s):
    in_force, first, net = idle_then_busy(name, n, loads[:n], idle_s)
    assert in_force <= 1.0 + 1e-9, (in_force, {m: net.decision[m].limit_Bps for m in net.live})
    if name in HOLD_FROM_FIRST_TICK:
        assert first <= 1.0 + 1e-9, first


def test_fps_three_idle_hosts_hold_a_third_each():
    """The measured case: three FPS hosts 60 s after their traffic stopped."""
    in_force, first, net = idle_then_busy("fps", 3, [1.0, 1.0, 1.0], 60.0)
    assert in_force == pytest.approx(1.0) and first == pytest.approx(1.0)
    for m in net.live:
        assert net.decision[m].limit_Bps == pytest.approx(L / 3)


def test_an_idle_estimate_and_weight_reach_exactly_zero():
    est = Estimator()
    est.update(0.0, _Counters(0, 0))
    est.update(1.0, _Counters(10**6, 0))
    local = None
    for k in range(2, 40):
        local = est.update(float(k), _Counters(10**6, 0))
    assert local.demand_Bps == 0.0 and local.sent_Bps == 0.0      # 1e6 * 0.1**38 without the snap
    assert snap_zero(1e-49) == 0.0 and snap_zero(-1e-300) == 0.0 and snap_zero(2e-6) == 2e-6
