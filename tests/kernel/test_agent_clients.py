"""Per-client throttle and ban in real agents, counted across hosts (docs/clients.md).

Topology (lab/topology.py's star): agents on h1..h3 limit their eth0 egress; h4 is the
clients' namespace, holding 20 client addresses besides its own.  Traffic from the
servers to a client address is that client's (``dst/32``): downloads, and the SYN-ACKs
of the connections it opens.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from drl.lab.agents import Agent, installed
from drl.lab.measure import RxMeter
from drl.lab.metrics import mean, sliding_means, within
from drl.lab.netns import Host
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

HEAVY = "10.0.0.100"
LIGHTS = [f"10.0.0.{101 + i}" for i in range(19)]
PORT = 8080                   # the servers' TCP listener for connection counting

# Accepts and closes connections until killed.
LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(512)
while True:
    s.accept()[0].close()
"""

# Connects from argv[1] to port argv[5] of each of argv[2] (comma-separated) in turn, one
# attempt per argv[3] seconds, for argv[4] seconds; a line per attempt: monotonic time,
# target, ok.
PROBE = """
import json, socket, sys, time
src, targets, every, seconds = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3]), float(sys.argv[4])
port = int(sys.argv[5])
end, i = time.monotonic() + seconds, 0
while time.monotonic() < end:
    t, dst = time.monotonic(), targets[i % len(targets)]
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(0.3)
    try:
        s.connect((dst, port))
        ok = True
    except OSError:
        ok = False
    s.close()
    print(json.dumps([t, dst, ok]), flush=True)
    i += 1
    time.sleep(max(0.0, t + every - time.monotonic()))
"""


def add_clients(host: Host) -> None:
    for addr in [HEAVY, *LIGHTS]:
        host.run("ip", "addr", "add", f"{addr}/24", "dev", "eth0")


def listen(hosts: list[Host]) -> None:
    for h in hosts:
        h.popen(sys.executable, "-c", LISTENER, str(PORT))
    deadline = time.monotonic() + 5
    while not all(h.listening(PORT) for h in hosts):
        assert time.monotonic() < deadline, "listeners did not start"
        time.sleep(0.05)


def probe(client: Host, targets: list[Host], every_s: float, seconds: float) -> list[tuple[float, str, bool]]:
    """Connection attempts from HEAVY to the targets in turn, one per ``every_s``."""
    proc = client.popen(sys.executable, "-c", PROBE, HEAVY, ",".join(h.addr4 for h in targets), str(every_s),
                        str(seconds), str(PORT), capture=True)
    out, _ = proc.communicate(timeout=seconds + 10)
    return [tuple(json.loads(line)) for line in out.splitlines()]


def clients(agent: Agent) -> dict[str, dict]:
    from drl.agent.service.control import request
    reply = request(agent.socket, "clients", limit=50)
    return {row["client"]: row for c in reply["classes"] for row in c["clients"]}


def drlctl(agent: Agent, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([installed("drlctl"), "--socket", agent.socket, *args], capture_output=True, text=True,
                          timeout=10)


def counted_bytes(client: Host, addr: str) -> int:
    """IP bytes h4 received for ``addr`` (an nftables counter, made on first use)."""
    table = "drltest"
    if table not in client.run("nft", "list", "tables"):
        client.run("nft", "add", "table", "inet", table)
        client.run("nft", "add", "chain", "inet", table, "in", "{ type filter hook input priority 0 ; }")
        client.run("nft", "add", "rule", "inet", table, "in", "ip", "daddr", addr, "counter")
    out = client.run("nft", "-j", "list", "chain", "inet", table, "in")
    rules = [e["rule"] for e in json.loads(out)["nftables"] if "rule" in e]
    return next(x["counter"]["bytes"] for x in rules[0]["expr"] if "counter" in x)


@pytest.mark.slow
def test_a_heavy_client_of_three_hosts_gets_its_threshold_and_light_ones_are_untouched(net4, cluster):
    *servers, client = net4.hosts
    add_clients(client)
    agents = cluster(net4).start_mesh(servers, "fps", "400mbit", "--client-key", "dst/32",
                                      "--client-threshold", "6mbit")
    iperfs = [iperf3_server(client, 5201 + i) for i in range(3 + len(LIGHTS))]
    try:
        heavy = [iperf3_start(h, s, seconds=16, dst=HEAVY) for h, s in zip(servers, iperfs)]
        # 1000-byte writes: iperf3 paces in whole writes (128 KB by default: 0.437 Mbit/s for 0.4)
        light = [iperf3_start(servers[i % 3], s, seconds=14, bitrate_bps=0.4e6, length=1000, dst=addr)
                 for i, (s, addr) in enumerate(zip(iperfs[3:], LIGHTS))]
        time.sleep(4)
        before, t0 = counted_bytes(client, HEAVY), time.monotonic()
        time.sleep(10)
        rate_bps = (counted_bytes(client, HEAVY) - before) * 8 / (time.monotonic() - t0)
        rows = [clients(a) for a in agents]
        for run in heavy:
            run.wait()
        light_bps = [run.wait().received_bps for run in light]
        statuses = [a.status() for a in agents]
    finally:
        for s in iperfs:
            s.__exit__()
    # three per-host limiters would give it 18 Mbit/s; IP bytes are ~1 % below the L2 bytes counted
    assert within(rate_bps, 6e6, 0.10), rate_bps
    assert all(r[f"{HEAVY}/32"]["state"] == "throttled" for r in rows), rows
    assert all(r.get(f"{addr}/32", {"state": "ok"})["state"] == "ok" for r in rows for addr in LIGHTS)
    assert all(within(bps, 0.4e6, 0.10) for bps in light_bps), light_bps
    assert all(st["throttled_bytes"] > 0 and st["clients"]["throttled"] == 1 for st in statuses)


@pytest.mark.slow
def test_a_ban_on_connections_cuts_a_client_off_on_every_host_and_ends_on_time(net4, cluster):
    *servers, client = net4.hosts
    add_clients(client)
    listen(servers)
    agents = cluster(net4).start_mesh(servers, "fps", "400mbit", "--client-key", "dst/32", "--client-measure",
                                      "conns", "--client-threshold", "30/2s", "--client-action", "ban",
                                      "--ban-duration", "3s")
    # 20 connections a second over the three hosts: over 30 in 2 s after ~1.5 s; then, banned,
    # an attempt every 0.3 s (its timeout) until the ban (3 s at least) is surely still on
    flood = probe(client, servers, 0.05, 4.0)
    ok = [t for t, _, good in flood if good]
    crossed = ok[29]                                       # the 30th connection
    assert all(not good for t, _, good in flood if t > crossed + 1.0), "a host let the banned client in"
    assert {dst for t, dst, good in flood if t > crossed + 1.0} == {h.addr4 for h in servers}
    # then slowly (5 a second, under the threshold): back once the window and 3 s are over
    slow = probe(client, servers, 0.2, 6.0)
    back = next(t for t, _, good in slow if good)
    assert crossed + 3.0 - 0.3 <= back <= crossed + 2.0 + 3.0 + 0.8, (crossed, back)
    assert all(good for t, _, good in slow if t > back + 0.5)
    st = agents[0].status()
    assert st["banned_packets"] > 0 and st["clients"]["action"] == "ban"

    # banned again, then `drlctl unban` on one agent lets it in everywhere within a tick and a
    # gossip round (1.5 s allowed: ticks come late on a busy machine)
    flood = probe(client, servers, 0.05, 3.0)
    assert not flood[-1][2]
    ctl = drlctl(agents[1], "unban", HEAVY)
    assert ctl.returncode == 0 and f"unbanned {HEAVY}/32" in ctl.stdout, ctl.stdout + ctl.stderr
    unbanned = time.monotonic()
    after = probe(client, servers, 0.1, 2.0)
    late = [good for t, _, good in after if t > unbanned + 1.5]
    assert late and all(late), after
    again = drlctl(agents[1], "unban", HEAVY)
    assert again.returncode == 1 and "no ban on" in again.stderr


@pytest.mark.slow
def test_a_ban_outlives_a_killed_agent_and_ends_on_time(net, cluster):
    server, client = net.hosts
    client.run("ip", "addr", "add", f"{HEAVY}/24", "dev", "eth0")
    listen([server])
    agent = cluster(net).start(server, [], "fps", "400mbit", "--client-key", "dst/32", "--client-measure", "conns",
                               "--client-threshold", "10/2s", "--client-action", "ban", "--ban-duration", "4s")
    flood = probe(client, [server], 0.05, 1.5)
    crossed = [t for t, _, good in flood if good][9]
    assert not flood[-1][2]
    agent.kill(signal.SIGKILL)
    slow = probe(client, [server], 0.2, 7.0)
    back = next(t for t, _, good in slow if good)
    # banned until its window (2 s) is over, plus 4 s: the kernel ends it by itself
    assert crossed + 4.0 - 0.3 <= back <= crossed + 2.0 + 4.0 + 0.8, (crossed, back)
    assert "drl" in server.run("tc", "filter", "show", "dev", "eth0", "egress")   # the filter stayed


@pytest.mark.slow
def test_a_client_throttled_on_its_only_host_stays_at_its_threshold(net, cluster):
    """A throttled BBR flow dips under its share now and then: released at 90 % of the
    threshold, it came back at full speed each time (5.99 Mbit/s against 4; cubic held at
    4.01).  A throttled client is released below half the threshold (agent/clients/table.py)."""
    server, client = net.hosts
    cluster(net).start(server, [], "fps", "100mbit", "--client-key", "dst/32", "--client-threshold", "4mbit")
    with iperf3_server(client) as srv, RxMeter(client) as meter:
        start = time.monotonic()
        run = iperf3_start(server, srv, seconds=16, cc="bbr").wait()
        held = mean(meter.series(start + 3, start + 15)) * 8      # L2 bits/s, as the agent counts
    # The whole run: 3.75-3.86 since the kernel holds the client from a quarter of its
    # threshold on (docs/clients.md "Held at the line"); 4.10-4.57 when it ran at the class's
    # 100 Mbit/s for the first tick or two, until the agent saw it over its threshold.
    print(f"measured: {held / 1e6:.2f} Mbit/s held from 3 s on, {run.received_bps / 1e6:.2f} over the "
          f"run, through a 4 Mbit/s client threshold (BBR)")
    assert 0.8 * 4e6 <= held <= 1.1 * 4e6, held
    assert run.received_bps <= 1.5 * 4e6, run.received_bps


# Held at the line (docs/clients.md): each host's kernel holds the client at T/N from the packet
# that takes its count to the line T/(4N), in debt for that packet's part beyond it, so the three
# hosts pass at most T/4 before the hold and T a second after.  Waiting for the summed count to
# reach T (the agent's decision, a tick or two later) let 2.3-2.4 T through the first second;
# with the hold 1.06-1.17 T (eight runs), 30 s at 1.001-1.005 T.
@pytest.mark.slow
def test_a_new_heavy_client_of_three_hosts_is_held_from_its_first_second(net4, cluster):
    """After idle, one client starts downloads from all three hosts at once in a class whose
    local limits let it have 40 Mbit/s: over 20 s it gets at most 1.05x its threshold, and every
    1-s window at most 1.5x."""
    *servers, client = net4.hosts
    add_clients(client)
    agents = cluster(net4).start_mesh(servers, "fps", "40mbit", "--client-key", "dst/32", "--client-threshold", "6mbit")
    iperfs = [iperf3_server(client, 5201 + i) for i in range(3)]
    threshold_Bps = 6e6 / 8
    try:
        with RxMeter(client) as meter:
            for a in agents:                # idle (the client's sliding window is empty) until the mesh is whole
                st = a.wait_for(lambda s: sum(p["state"] == "alive" for p in s["peers"]) == 2, 5)
                assert sum(p["state"] == "alive" for p in st["peers"]) == 2, (a.host, st["peers"])
            time.sleep(1)                   # a few of the agents' ticks with every peer heard
            start = time.monotonic()
            for run in [iperf3_start(h, s, seconds=20, dst=HEAVY) for h, s in zip(servers, iperfs)]:
                run.wait()
            end = time.monotonic()
    finally:
        for s in iperfs:
            s.__exit__()
    series = meter.series(start, end)       # L2 bytes/s at the client (what the throttle counts)
    windows = sliding_means(series, 0.1)
    worst, at = max(windows), windows.index(max(windows)) * 0.1
    whole, held = mean(series[:200]), mean(series[20:200])
    later = max(windows[10:])
    print(f"measured: first 1-s window {windows[0] / threshold_Bps:.2f}x the threshold, worst {worst / threshold_Bps:.2f}x "
          f"at {at:.1f} s, worst from 1 s on {later / threshold_Bps:.3f}x; 20 s {whole / threshold_Bps:.3f}x, "
          f"from 2 s on {held / threshold_Bps:.3f}x; "
          f"first second per 100 ms {[round(x * 8 / 1e6, 1) for x in series[:10]]} Mbit/s")
    assert 0.9 * threshold_Bps <= held <= 1.05 * threshold_Bps, held / threshold_Bps
    assert worst <= 1.5 * threshold_Bps, f"{worst / threshold_Bps:.2f}x the threshold in the 1-s window at {at:.1f} s"
    assert whole <= 1.05 * threshold_Bps, whole / threshold_Bps
