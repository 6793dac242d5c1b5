"""Never over the limit when an agent dies, hangs or restarts (real agents, TCP).

Topology (lab/topology.py's star): agents on h1..h3 limit their eth0 egress
to the sink h4, FPS, 30 Mbit/s, with 1, 3 and 6 TCP flows.  The sink's
received L2 bytes are sampled every 100 ms over netlink (lab/measure.py RxMeter);
every 1-s window (sliding by 100 ms) must stay within 105 % of the limit after
each fault, and the limit must be used again (a window at >= 95 %) within 3 s of it.  Last, with h3
killed again, the limit is lowered to 15 Mbit/s: h3's kernel keeps the fail-safe
of 30 (10 Mbit/s), which the others must leave it.
"""
from __future__ import annotations

import signal
import time

import pytest

from drl.agent.service.control import request
from drl.lab.measure import DT, RxMeter
from drl.lab.metrics import sliding_means
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

LIMIT_BPS = 30e6


def check(meter: RxMeter, fault_at: float, what: str, settle_s: float = 6.0, limit_bps: float = LIMIT_BPS,
          after_s: float = 0.0) -> dict:
    """The worst 1-s window from ``after_s`` past the fault and how soon the limit was used again."""
    time.sleep(max(0.0, fault_at + settle_s + DT - time.monotonic()))    # the last bin's sample too
    windows = [8 * w for w in sliding_means(meter.series(fault_at + after_s, fault_at + settle_s), DT)]
    worst = max(windows) / limit_bps
    used = next((i * 0.1 for i, w in enumerate(windows) if w >= 0.95 * limit_bps), None)
    assert worst <= 1.05, f"{what}: a 1-s window at {worst:.3f} of the limit"
    assert used is not None and used <= 3.0, f"{what}: limit not used again within 3 s ({used})"
    return {"worst": worst, "used_again_s": used}


@pytest.mark.slow
def test_kill_restart_stop_and_cont_never_take_the_hosts_over_the_limit(net4, cluster):
    h1, h2, h3, sink = net4.hosts
    limiters = (h1, h2, h3)
    agents_on = cluster(net4)
    # shaped, the default for this catch-all class: the fail-safe's bucket is its share of the
    # burst budget and starts empty beside what HTB holds (bpf/police.h shape)
    agents = {a.host: a for a in agents_on.start_mesh(limiters, "fps", "30mbit")}
    servers = [iperf3_server(sink) for _ in limiters]
    try:
        # long enough for any machine: stopped once the last check has its samples
        clients = [iperf3_start(h, srv, seconds=90, streams=n) for h, srv, n in zip(limiters, servers, (1, 3, 6))]
        with RxMeter(sink) as meter:
            time.sleep(8)
            agents["h3"].kill(signal.SIGKILL)                  # the most flows, the largest share
            killed = check(meter, time.monotonic(), "kill")
            agents["h3"] = agents_on.start(h3, [h1, h2], "fps", "30mbit")
            restarted = check(meter, time.monotonic(), "restart")
            stopped_at = time.monotonic()
            agents["h2"].proc.send_signal(signal.SIGSTOP)
            stopped = check(meter, stopped_at, "stop")
            agents["h2"].proc.send_signal(signal.SIGCONT)
            cont = check(meter, time.monotonic(), "cont")
            agents["h3"].kill(signal.SIGKILL)
            check(meter, time.monotonic(), "kill again")        # its fail-safe on: 10 Mbit/s
            lowered_at = time.monotonic()
            request(agents["h1"].socket, "set", **{"class": "default", "global": "15mbit"})
            # a tick at the old limit, then never over the new one with the dead host at its old share
            lowered = check(meter, lowered_at, "lowered", limit_bps=15e6, after_s=1.0)
        for c in clients:
            c.stop()
    finally:
        for s in servers:
            s.__exit__()
    print("faults:", killed, restarted, stopped, cont, lowered)
