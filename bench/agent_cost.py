"""Benchmark of the agent process: CPU, RSS and control bandwidth per limiter.

    sudo .venv/bin/python bench/agent_cost.py            # 3 intervals x 2 group sizes, ~4 minutes
    sudo .venv/bin/python bench/agent_cost.py --seconds 10 --intervals 100ms --peers 2

For each estimate interval and peer count, 1 + peers real agents (FPS, full
mesh gossip, HMAC) run in namespaces on one bridge, and one TCP flow crosses
the measured agent's limiter so its flow table and estimator have work.  The
measured agent's CPU comes from psutil (user + system over the window, as a
share of one core), RSS at the end, control bandwidth from its own gossip
counters (IP + UDP headers included, comparable to the paper's 2.88 kbit/s
per limiter for 48-byte updates at br = 3 every 50 ms, 000_efbf5459a9d12355.txt §5.6).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

from agent.units import parse_duration
from lab.agents import Cluster, write_key
from lab.netns import Lab
from lab.topology import new_run, star
from lab.traffic import iperf3_server, iperf3_start


def measure(interval: str, peers: int, seconds: float) -> dict:
    with Lab(star(peers + 2, new_run("ba"))) as net, tempfile.TemporaryDirectory() as tmp:
        limiters, sink = net.hosts[:-1], net.hosts[-1]
        key = Path(tmp) / "key"
        write_key(key)
        agents = Cluster(net, Path(tmp), str(key))
        running = [agents.start(h, [p for p in limiters if p is not h], "fps", "50mbit", "--interval", interval,
                                "--branching", str(peers)) for h in limiters]
        me = running[0]
        proc = _agent_process(me.proc.pid)
        with iperf3_server(sink) as srv:
            client = iperf3_start(limiters[0], srv, seconds=int(seconds) + 3, streams=1)
            time.sleep(2)
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            time.sleep(seconds)
            cpu = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
            st = me.status()
            client.wait()
        return {"interval": interval, "peers": peers, "cpu_pct": 100 * cpu,
                "rss_mib": proc.memory_info().rss / 2**20, "control_kbps": st["gossip"]["control_bps"] / 1e3,
                "update_bytes": st["gossip"]["bytes_sent"] / max(1, st["gossip"]["sent"])}


def _agent_process(pid: int) -> psutil.Process:
    """`ip netns exec` execs the agent, so the session leader is the agent's Python."""
    proc = psutil.Process(pid)
    return next((c for c in proc.children(recursive=True) if "drl-agent" in " ".join(c.cmdline())), proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="50ms,100ms,500ms")
    ap.add_argument("--peers", default="2,8")
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    rows = []
    for peers in (int(p) for p in args.peers.split(",")):
        for interval in args.intervals.split(","):
            parse_duration(interval)
            print(f"measuring interval {interval} with {peers} peers ...", file=sys.stderr, flush=True)
            rows.append(measure(interval, peers, args.seconds))
    print("| interval | peers | agent CPU (% of a core) | RSS (MiB) | control (kbit/s) | datagram (B) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['interval']} | {r['peers']} | {r['cpu_pct']:.1f} | {r['rss_mib']:.0f} | "
              f"{r['control_kbps']:.2f} | {r['update_bytes']:.0f} |")


if __name__ == "__main__":
    main()
