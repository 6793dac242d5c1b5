"""The promise after idle: in every window of T >= 1 s a class passes on all hosts together at
most G x T + D (agent/burst.py's budget D), the first second after a long pause included.

Topology (lab/topology.py's star): agents on h1..h3 limit their eth0 egress to the sink h4,
FPS, the agents' default enforcement (shape: the one class matches all traffic).  The sink's
received L2 bytes (what the limiter counts) are sampled every 100 ms (lab/measure.py RxMeter)
and judged with lab/metrics.py's envelope over every window of 1 s or longer.
"""
from __future__ import annotations

import time

import pytest

from drl.agent.burst import budget
from drl.lab.measure import RxMeter
from drl.lab.metrics import envelope, mean, rebin
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

LIMIT_BPS = 30e6
IDLE_S = 10      # buckets refill in under a second, FPS's weights reach exactly 0 in ~6 s (model.ZERO_BELOW)


@pytest.mark.slow
def test_all_hosts_starting_together_after_a_long_idle_stay_within_the_envelope(net4, cluster):
    """Every host's bucket (its HTB burst) is full after a pause, and FPS has left its local limits
    wherever the idle hosts put them: the first second of traffic everywhere at once carries the
    global rate plus every host's depth, which the budget D must cover."""
    *limiters, sink = net4.hosts
    agents = cluster(net4).start_mesh(limiters, "fps", "30mbit")
    assert all(c["enforce"] == "shape" for a in agents for c in a.status()["classes"]), "not the default mode"
    servers = [iperf3_server(sink) for _ in limiters]
    limit_Bps, d = LIMIT_BPS / 8, budget(LIMIT_BPS / 8, len(limiters), "shape")
    try:
        with RxMeter(sink) as meter:
            for c in [iperf3_start(h, s, seconds=8, streams=2) for h, s in zip(limiters, servers)]:
                c.wait()
            time.sleep(IDLE_S)
            idle_limits = [a.status()["local_limit_bps"] for a in agents]
            start = time.monotonic()
            clients = [iperf3_start(h, s, seconds=12, streams=2) for h, s in zip(limiters, servers)]
            for c in clients:
                c.wait()
            end = time.monotonic()
        # up to 0.2 s before the start: a meter sample spans 100 ms, spread over the bins it covers
        idle = meter.series(start - IDLE_S + 5, start - 0.2)
        series = meter.series(start - 0.5, end)     # from before the start: nothing may hide in the first bin
    finally:
        for s in servers:
            s.__exit__()
    env = envelope(series, 0.1, limit_Bps, d)
    first = sum(series[5:15]) * 0.1                 # the first second of the second start, bytes
    used = mean(series[5 + 30:5 + 110]) / limit_Bps      # from 3 s in: the limit is used
    seconds = [round(x / limit_Bps, 3) for x in rebin(series[5:], 10)]
    print(f"measured: budget {d} B; first 1-s window {first / (limit_Bps + d):.3f} of G x 1 s + D "
          f"({first * 8 / 1e6:.2f} Mbit); envelope ratio {env['ratio']:.3f} at {env['ratio_at_s']} s "
          f"over {env['ratio_window_s']} s, excess {env['excess']:.0f} B; used {used:.3f} of G; "
          f"idle {max(idle) * 8 / 1e3:.1f} kbit/s at most, local limits then "
          f"{[round(x / 1e6, 2) for x in idle_limits]} Mbit/s; 1-s windows from the start {seconds}")
    # measured (4 runs): the first 1-s window 0.47-0.58 of G x 1 s + D (TCP is still ramping: the
    # shaped FPS newcomer, README "Known limits"), the worst window 0.952-0.953 of its envelope,
    # the limit used at 0.955-0.956 from 3 s on (0.885 in one run of a busier CI machine: the
    # check below is that the limit is used at all, not how well TCP fills it there)
    assert max(idle) * 8 < 100e3, "the hosts were not idle"
    assert first <= limit_Bps * 1.0 + d, (first, d)
    assert env["ratio"] <= 1.0, env
    assert 0.8 <= used <= 1.02, used
