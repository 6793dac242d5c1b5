"""Each allocator through real agents: FPS flow join and bottlenecks, GDRL,
fill-ratio, DQMP volume quotas and lease modes ([Raghavan07], [Stanojevic09], [Ramsden], [Behl12], [RLDesign]).

Hosts h1..h3 run agents (node ids h1..h3); the last host is the sink.
Rates at the sink are L2 bytes, what the limiter counts.
"""
from __future__ import annotations

import signal
import time

import pytest

from drl.lab.agents import Cluster, ready
from drl.lab.measure import rx_bytes, sink_rate_bps
from drl.lab.metrics import within
from drl.lab.netns import stop
from drl.lab.topology import new_run, star
from drl.lab.traffic import iperf3_server, iperf3_start, udp_blast

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


def newcomers_third_seconds(net, tmp_path, cc: str) -> list[float]:
    """Three single-flow limiters under FPS, 12 Mbit/s, one iperf3 flow (``cc``) joining
    every 6 s at a limiter that had none: each newcomer's passed bits in its third second."""
    limiters, sink = net.hosts[:3], net.hosts[3]
    # the paper's FPS polices: its newcomer logic reads the bucket's refusals (fps.py refused_share),
    # which a shaped class does not make
    running = Cluster(net, tmp_path).start_mesh(limiters, "fps", "12mbit", "--interval", "50ms",
                                                "--enforce", "police")
    clients, rates = [], []
    for k, (host, agent) in enumerate(zip(limiters, running), 1):
        if k > 1:
            time.sleep(3)                   # 6 s after the one before
        srv = iperf3_server(sink)
        clients.append(iperf3_start(host, srv, seconds=30 - 6 * k, streams=1, cc=cc))
        time.sleep(2)
        before = agent.status()["passed_bytes"]
        time.sleep(1)
        rates.append((agent.status()["passed_bytes"] - before) * 8)
    for c in clients:                       # every flow ran through the last newcomer's third second
        c.stop()
    return rates


def test_fps_newcomer_flow_at_an_unused_limiter_gets_its_share_within_3s(make_star, tmp_path):
    rates = newcomers_third_seconds(make_star(4), tmp_path, "cubic")
    # fair share with k single-flow limiters; measured 0.95-1.16 of it
    assert all(rate >= 0.7 * 12e6 / k for k, rate in enumerate(rates, 1)), rates


def test_fps_newcomer_with_bbr_on_a_40ms_path_gets_its_share_within_3s(make_lab, tmp_path):
    """BBR meets the newcomer's small first limit, takes it for a policer and paces at it for
    48 round trips: FPS must not read that as demand bottlenecked elsewhere (fps.py
    refused_share).  10 ms each way on every host's link: 40 ms between a limiter and the sink,
    the kernel's default RTO."""
    rates = newcomers_third_seconds(make_lab(star(4, new_run("nb"), delay="10ms")), tmp_path, "bbr")
    # measured 0.99-1.06 of the fair share (5 runs); 0.62-1.02 without the hold (0.65-0.71
    # for the third newcomer), so the bar is above 0.7
    assert all(rate >= 0.85 * 12e6 / k for k, rate in enumerate(rates, 1)), rates


def test_fps_moves_capacity_away_from_flows_bottlenecked_elsewhere(make_star, tmp_path):
    net = make_star(4)
    h1, h2, sink1, sink2 = net.hosts
    agents = Cluster(net, tmp_path)
    a1, a2 = agents.start_mesh([h1, h2], "fps", "10mbit", "--interval", "50ms", "--enforce", "police")
    with iperf3_server(sink1) as s1, iperf3_server(sink2) as s2:
        c1 = iperf3_start(h1, s1, seconds=20, streams=5)
        c2 = iperf3_start(h2, s2, seconds=20, streams=5)
        time.sleep(6)
        # h1's flows now cross a 2 Mbit/s link downstream of their limiter (the switch's port to sink1)
        net.host("sw").run("tc", "qdisc", "add", "dev", "h3", "root", "tbf",
                           "rate", "2mbit", "burst", "20kb", "latency", "50ms")
        capped = time.monotonic()
        st = a2.wait_for(lambda st: st["local_limit_bps"] >= 7e6, 8)
        moved_s = time.monotonic() - capped
        rate2 = sink_rate_bps(sink2, 3)
        c1.stop(), c2.stop()
    # measured 1.73-2.00 s over 6 runs; 1.81 s in 3 with FPS's refusal hold (ended by hold_rate_share);
    # the hold that never ended took 3.8 s
    assert st["local_limit_bps"] >= 7e6 and moved_s <= 3.3, (st["local_limit_bps"], moved_s)   # ~8 Mbit/s freed
    assert rate2 >= 6.5e6, rate2


@pytest.mark.parametrize("allocator", ["gdrl", "fillratio"])
def test_diffusion_holds_the_limit_and_shifts_capacity_to_the_loaded_limiter(make_star, tmp_path, allocator):
    net = make_star(4)
    limiters, sink = net.hosts[:3], net.hosts[3]
    agents = Cluster(net, tmp_path)
    running = agents.start_mesh(limiters, allocator, "12mbit")
    with iperf3_server(sink) as srv:
        client = iperf3_start(limiters[0], srv, seconds=16, streams=4)
        time.sleep(8)                     # diffusion: ~80 rounds of pairwise transfers at 100 ms
        rate = sink_rate_bps(sink, 6)
        limits = [a.status()["local_limit_bps"] for a in running]
        client.stop()
    assert within(rate, 12e6, 0.10), rate
    # transfers conserve the total exactly; the three statuses are read ~0.1 s apart, so a
    # transfer made between two reads can show on both sides (or on neither)
    assert within(sum(limits), 12e6, 0.03), limits
    assert limits[0] >= 0.6 * 12e6, limits                    # from 1/3 towards the load


def test_dqmp_stops_the_class_when_the_volume_quota_is_used_up(make_star, tmp_path):
    net = make_star(3)
    h1, h2, sink = net.hosts
    agents = Cluster(net, tmp_path)
    quota = 30_000_000
    running = agents.start_mesh([h1, h2], "dqmp", "1gbit", "--quota", f"{quota}B/1d")
    before = rx_bytes(sink)
    blasts = [udp_blast(h, sink.addr4, 25e6, 9) for h in (h1, h2)]   # 50 Mbit/s asked: 30 MB last 5 s
    for b in blasts:
        b.wait()
    received = rx_bytes(sink) - before
    passed = sum(a.status()["passed_bytes"] for a in running)
    # Each tick reloads the allowance as granted - passed, with "passed" read at the tick's
    # start, so what passes between that read and the write (~1 ms) is allowed once more;
    # it does not accumulate (the next tick reads the true total).  Per limiter: one frame
    # plus 5 ms at 25 Mbit/s (a CI run overdrew 3,244 bytes in all).
    burst = 2 * (1514 + int(25e6 / 8 * 0.005))
    assert passed <= quota + burst, passed
    assert received <= quota + burst + 1_000_000, received     # + the sink's own ARP/handshakes
    assert passed >= 0.9 * quota, passed                       # and the quota was usable
    for b in [udp_blast(h, sink.addr4, 25e6, 2) for h in (h1, h2)]:   # more demand: still nothing passes
        b.wait()
    assert sum(a.status()["passed_bytes"] for a in running) <= quota + burst


def test_lease_clients_apply_their_loss_mode_when_the_server_dies(make_star, tmp_path):
    """One lease server and three clients, one per loss mode, each loaded with 2.8 Mbit/s: the
    server is killed and, once each lease has expired, pessimistic holds 0, optimistic what it
    last asked for (~3 Mbit/s), safe global/N (12 Mbit/s over the 4 limiters)."""
    net = make_star(5)
    limiters, sink = net.hosts[:4], net.hosts[4]
    cluster = Cluster(net, tmp_path)
    modes = {"pessimistic": 0.0, "optimistic": 3e6, "safe": 3e6}
    # proto=udp: a pessimistic client drops its whole class, and iperf3's TCP control
    # connection must still deliver the report after the test has read the states
    server, *clients = ready([cluster.spawn(h, [p for p in limiters if p is not h], "lease", "12mbit",
                                            "--on-lease-loss", mode, "--class", "proto=udp")
                              for h, mode in zip(limiters, ["safe", *modes])])
    servers = [iperf3_server(sink) for _ in clients]
    try:
        loads = [iperf3_start(h, s, seconds=16, udp_bps=2.8e6, length=1200) for h, s in zip(limiters[1:], servers)]
        time.sleep(4)
        assert all(c.status()["allocator_state"]["lease_state"] == "valid" for c in clients)
        server.kill(signal.SIGKILL)
        killed = time.monotonic()
        # until each lease has expired: ttl 5 s, and a margin, from the kill
        states = [c.wait_for(_expired, max(0.0, killed + 5 + 2 - time.monotonic())) for c in clients]
        for load in loads:
            load.stop()
    finally:
        for s in servers:
            s.__exit__()
    for (mode, expected_bps), st in zip(modes.items(), states):
        assert st["allocator_state"]["lease_state"] == "expired", (mode, st["allocator_state"])
        assert st["allocator_state"]["on_lease_loss"] == mode
        if expected_bps == 0.0:
            assert st["local_limit_bps"] == 0.0, mode
        else:
            assert within(st["local_limit_bps"], expected_bps, 0.15), (mode, st["local_limit_bps"])


def _expired(status: dict) -> bool:
    return status["allocator_state"]["lease_state"] == "expired"


def test_gdrl_gives_identical_tcp_loads_equal_limits(make_star, tmp_path):
    """Three limiters with the same TCP load (4 cubic streams paced at 10 Mbit/s together)
    under one 12 Mbit/s gdrl limit: after 20 s their local limits are within 10 % of one
    another and the sink sees at most the limit.  A closed-loop load's arrivals follow the
    limit it is given, which the spare-bandwidth indicator read as the holder needing more
    (gdrl.py, "Indicators"): one limiter took the whole limit and starved the two others."""
    net = make_star(4)
    limiters, sink = net.hosts[:3], net.hosts[3]
    running = Cluster(net, tmp_path).start_mesh(limiters, "gdrl", "12mbit")
    servers = [iperf3_server(sink) for _ in limiters]
    try:
        clients = [iperf3_start(h, s, seconds=32, streams=4, bitrate_bps=2.5e6)
                   for h, s in zip(limiters, servers)]
        time.sleep(20)
        reads, rates = [], []
        for _ in range(4):                 # a lasting split, not one tick's transfer: 4 reads over 6 s
            reads.append([a.status()["local_limit_bps"] for a in running])
            rates.append(sink_rate_bps(sink, 1.5))
        for c in clients:
            c.stop()
    finally:
        for s in servers:
            s.__exit__()
    held = [sum(r[k] for r in reads) / len(reads) for k in range(3)]     # each limiter's mean
    mean = sum(held) / 3
    # measured: within 0.4-1.6 % of each other (5 runs); the spare indicator gave 0/0/12 Mbit/s
    assert all(within(x, mean, 0.10) for x in held), reads
    # transfers conserve the sum; reads ~0.1 s apart can count one in flight twice or not at all
    assert all(sum(r) <= 12e6 * 1.03 for r in reads), reads
    assert all(rate <= 12e6 * 1.05 for rate in rates), rates


def test_gdrl_cluster_restarted_as_a_whole_gets_its_limit_back(make_star, tmp_path):
    """Every agent stopped, then started again on the state files of its earlier life: each is
    a rejoiner whose share nobody inherited (gdrl.py _whole_restart).  They passed 0.12 Mbit/s
    together, the slow-start floor, for the whole run; now the limit is back within seconds."""
    net = make_star(4)
    limiters, sink = net.hosts[:3], net.hosts[3]
    cluster = Cluster(net, tmp_path)
    for agent in cluster.start_mesh(limiters, "gdrl", "12mbit"):
        agent.kill(signal.SIGTERM)
    assert len(list(tmp_path.glob("gdrl-h*.json"))) == 3
    running = cluster.start_mesh(limiters, "gdrl", "12mbit")
    blasts = [udp_blast(h, sink.addr4, rate, 8) for h, rate in zip(limiters, (2e6, 8e6, 6e6))]
    time.sleep(4)                     # measured: the whole limit within 2 s
    states = [a.status() for a in running]
    for b in blasts:
        assert b.poll() is None             # the demand was there when the states were read
        stop(b)
    assert all(st["allocator_state"]["rejoined"] for st in states), states
    limits = [st["local_limit_bps"] for st in states]
    assert within(sum(limits), 12e6, 0.03), limits
