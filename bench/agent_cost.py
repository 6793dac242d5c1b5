"""Benchmark of the agent process: CPU, RSS and control bandwidth, per class count.

    sudo .venv/bin/python bench/agent_cost.py                # 1, 100, 1,000 classes; 8 peers; 100 ms
    sudo .venv/bin/python bench/agent_cost.py --classes 1 --intervals 50ms,100ms,500ms --peers 2,8

For each class count, interval and peer count, 1 + peers real agents (FPS,
gossip with the default branching of 3, HMAC) run in namespaces on one
bridge.  The measured agent's config file has the classes: class i limits
traffic to 10.1.x.y/32 (host i), and its host sends one small UDP datagram to
every class's address every 50 ms, so every class has demand, a flow and a
changing published value (an active class).  Each peer's config has the first
class only: the peers hear every class's updates (and drop those of classes
they do not have), and send heartbeats, as peers whose classes are idle do
once they have said so; nine agents with a thousand classes each would not
fit on a two-core machine and would be measuring the machine.  The
measured agent's CPU comes from psutil (user + system over the window, as a
share of one core; also per tick, over ticks x interval, since a loaded
machine delays ticks), RSS at the end, control traffic from its own gossip
counters: wire bytes (UDP payload + 28 bytes of IPv4 and UDP header) per
active class per peer per round, where a round sends to min(branching, peers)
peers.  The paper's figure to compare with: 48-byte updates at br = 3 every
50 ms, 2.88 kbit/s per limiter ([Raghavan07] §5.6).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

from drl.agent.units import parse_duration
from drl.lab.agents import Cluster, write_key
from drl.lab.netns import Lab
from drl.lab.topology import new_run, star

BRANCHING = 3          # drl-agent's default
IP_UDP_BYTES = 28

_SWEEP = """
import socket, sys, time
n, period = int(sys.argv[1]), float(sys.argv[2])
dsts = [(f"10.1.{i // 256}.{i % 256}", 9) for i in range(n)]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
while True:
    start = time.monotonic()
    for d in dsts:
        s.sendto(b"x" * 36, d)
    time.sleep(max(0.0, period - (time.monotonic() - start)))
"""


def config(n: int, interval: str) -> str:
    text = f'[agent]\nallocator = "fps"\ninterval = "{interval}"\n'
    return text + "".join(f'\n[[class]]\nname = "c{i}"\nglobal = "10mbit"\nmatch = ["dst=10.1.{i // 256}.{i % 256}/32"]\n'
                          for i in range(n))


def measure(classes: int, interval: str, peers: int, seconds: float) -> dict:
    with Lab(star(peers + 2, new_run("ba"))) as net, tempfile.TemporaryDirectory() as tmp:
        limiters, sink = net.hosts[:-1], net.hosts[-1]
        key, conf, peer_conf = Path(tmp) / "key", Path(tmp) / "drl.toml", Path(tmp) / "peer.toml"
        write_key(key)
        conf.write_text(config(classes, interval))
        peer_conf.write_text(config(1, interval))
        agents = Cluster(net, Path(tmp), str(key))
        me, here = agents.start(limiters[0], limiters[1:], None, None, "--config", str(conf)), limiters[0]
        for h in limiters[1:]:
            agents.start(h, [p for p in limiters if p is not h], None, None, "--config", str(peer_conf))
        here.run("ip", "route", "add", "10.1.0.0/16", "via", sink.addr4)
        here.popen(sys.executable, "-c", _SWEEP, str(classes), "0.05")
        proc = _agent_process(me.proc.pid)
        time.sleep(3)
        before, cpu0, t0 = me.status(), sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu, wall, after = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - t0, me.status()
        ticks = after["ticks"] - before["ticks"]
        g0, g1 = before["gossip"], after["gossip"]
        wire = g1["bytes_sent"] - g0["bytes_sent"] + IP_UDP_BYTES * (g1["sent"] - g0["sent"])
        active = sum(c["demand_bps"] > 0 for c in after["classes"])
        return {"classes": classes, "active": active, "interval": interval, "peers": peers,
                "cpu_pct": 100 * cpu / wall, "cpu_tick_pct": 100 * cpu / (ticks * parse_duration(interval)),
                "rss_mib": proc.memory_info().rss / 2**20, "ticks_late": 1 - ticks * parse_duration(interval) / wall,
                "per_class": wire / (ticks * min(BRANCHING, peers) * max(1, active)),
                "datagram": (g1["bytes_sent"] - g0["bytes_sent"]) / max(1, g1["sent"] - g0["sent"]),
                "load": psutil.getloadavg()[0]}


def _agent_process(pid: int) -> psutil.Process:
    """`ip netns exec` execs the agent, so the session leader is the agent's Python."""
    proc = psutil.Process(pid)
    return next((c for c in proc.children(recursive=True) if "drl-agent" in " ".join(c.cmdline())), proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="1,100,1000")
    ap.add_argument("--intervals", default="100ms")
    ap.add_argument("--peers", default="8")
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    rows = []
    for classes in (int(c) for c in args.classes.split(",")):
        for peers in (int(p) for p in args.peers.split(",")):
            for interval in args.intervals.split(","):
                parse_duration(interval)
                print(f"measuring {classes} classes, interval {interval}, {peers} peers ...", file=sys.stderr, flush=True)
                rows.append(measure(classes, interval, peers, args.seconds))
    print("| classes (active) | interval | peers | agent CPU (% of a core) | per tick (% of the interval) | "
          "RSS (MiB) | control per class, peer, round (B) | datagram payload (B) | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['classes']} ({r['active']}) | {r['interval']} | {r['peers']} | {r['cpu_pct']:.1f} | "
              f"{r['cpu_tick_pct']:.1f} | {r['rss_mib']:.0f} | {r['per_class']:.1f} | {r['datagram']:.0f} | "
              f"{r['load']:.1f} |")


if __name__ == "__main__":
    main()
