"""Benchmark of the datapath (bpf/limiter.c); results go to bench/README.md.

    sudo .venv/bin/python bench/datapath.py            # all parts, ~8 minutes
    sudo .venv/bin/python bench/datapath.py --part goodput --seconds 8

Parts, each measured side by side in one run (never against an old number):
  overhead  veth TCP throughput with the program attached (limit far above
            line rate) over without it, alternating runs; goal >= 0.97.
  cost      mean ns per packet from kernel.bpf_stats_enabled (run_time_ns /
            run_cnt in /proc/self/fdinfo/<prog fd>); goal <= 150 ns.
  goodput   1, 4, 16 TCP flows at 10, 50, 200 Mbit/s: iperf3 goodput through
            our limiter (default depth and drop action) over the kernel's tbf
            qdisc at the same rate; goal >= 0.97 in every cell.
  depth     goodput at 50 Mbit/s, 4 flows, for bucket depths and both drop
            actions (how the defaults were chosen).
The limiter counts L2 frame bytes like tbf (skb wire length); see bpf/limiter.c.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from drl.agent.datapath import Datapath, default_burst
from drl.agent.model import Mode
from drl.lab.errors import LabError
from drl.lab.netns import Lab
from drl.lab.topology import new_run, pair
from drl.lab.traffic import iperf3, iperf3_server

RATES_MBIT = (10, 50, 200)
FLOWS = (1, 4, 16)


def say(msg: str) -> None:
    print(msg, flush=True)


CC = "cubic"  # --cc


def goodput(h1, srv, seconds: float, streams: int) -> float:
    return iperf3(h1, srv, seconds=seconds, streams=streams, cc=CC).received_bps


def with_limiter(net, srv, rate_bps: float, streams: int, seconds: float,
                 burst: int | None = None, action: str = "stolen") -> float:
    h1 = net.hosts[0]
    with Datapath("eth0", netns=h1.ns, drop_action=action) as dp:
        dp.set_class(0, Mode.BUCKET, rate_Bps=rate_bps / 8, burst_bytes=burst)
        return goodput(h1, srv, seconds, streams)


def with_tbf(net, srv, rate_bps: float, streams: int, seconds: float) -> float:
    """tbf at the same rate and depth as our default, 50 ms of queue."""
    h1 = net.hosts[0]
    tc = ["tc", "qdisc", "%s", "dev", "eth0", "root"]
    h1.run(*[c.replace("%s", "add") for c in tc], "tbf", "rate", f"{int(rate_bps)}bit",
           "burst", str(default_burst(rate_bps / 8)), "latency", "50ms")
    try:
        return goodput(h1, srv, seconds, streams)
    finally:
        h1.run(*[c.replace("%s", "del") for c in tc])


def part_overhead(net, srv, seconds: float, rounds: int = 3) -> dict:
    h1 = net.hosts[0]
    base, prog = [], []
    for i in range(rounds):
        base.append(goodput(h1, srv, seconds, 1))
        prog.append(with_limiter(net, srv, 400e9, 1, seconds))
        say(f"  overhead round {i + 1}/{rounds}: without {base[-1] / 1e9:.2f} Gbit/s, "
            f"with {prog[-1] / 1e9:.2f} Gbit/s")
    ratio = statistics.median(prog) / statistics.median(base)
    say(f"overhead: ratio {ratio:.3f} (goal >= 0.97)")
    return {"without_bps": base, "with_bps": prog, "ratio": ratio}


def part_cost(net, srv, seconds: float) -> dict:
    """ns/packet at line rate and at a 50 Mbit/s limit (policing path with drops)."""
    h1 = net.hosts[0]
    out = {}
    old = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    try:
        for name, rate, streams in (("unlimited", 400e9, 1), ("50mbit", 50e6, 4)):
            with Datapath("eth0", netns=h1.ns) as dp:
                dp.set_class(0, Mode.BUCKET, rate_Bps=rate / 8)
                goodput(h1, srv, seconds, streams)
                stats = prog_stats(dp.prog_fd)
            out[name] = stats["run_time_ns"] / max(1, stats["run_cnt"])
            say(f"cost: {out[name]:.0f} ns/packet ({name}, {stats['run_cnt']} runs; goal <= 150)")
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old)
    return out


def prog_stats(fd: int) -> dict:
    fields = dict(line.split(":\t") for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                  if ":\t" in line)
    return {k: int(fields[k]) for k in ("run_time_ns", "run_cnt")}


def part_goodput(net, srv, seconds: float) -> list[dict]:
    cells = []
    for rate in RATES_MBIT:
        for flows in FLOWS:
            ours = with_limiter(net, srv, rate * 1e6, flows, seconds)
            tbf = with_tbf(net, srv, rate * 1e6, flows, seconds)
            cells.append({"rate_mbit": rate, "flows": flows, "ours_bps": ours, "tbf_bps": tbf,
                          "ratio": ours / tbf})
            say(f"goodput {rate:>3} Mbit/s x {flows:>2} flows: ours {ours / 1e6:6.2f}  "
                f"tbf {tbf / 1e6:6.2f}  ratio {ours / tbf:.3f}")
    return cells


def part_depth(net, srv, seconds: float, rate_mbit: float = 50, flows: int = 4) -> list[dict]:
    rows = []
    for depth in (75_000, 128 * 1024, 256 * 1024, 625_000, 1_000_000):
        for action in ("stolen", "shot"):
            bps = with_limiter(net, srv, rate_mbit * 1e6, flows, seconds, burst=depth, action=action)
            rows.append({"depth": depth, "action": action, "bps": bps})
            say(f"depth {depth:>8} B {action:>6}: {bps / 1e6:6.2f} Mbit/s of {rate_mbit}")
    return rows


PARTS = {"overhead": part_overhead, "cost": part_cost, "goodput": part_goodput, "depth": part_depth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=list(PARTS), action="append", help="run only these parts")
    ap.add_argument("--seconds", type=float, default=6, help="iperf3 duration per measurement")
    ap.add_argument("--cc", default=CC, help="TCP congestion control of the senders (default cubic)")
    args = ap.parse_args()
    globals()["CC"] = args.cc
    started = time.monotonic()
    with Lab(pair(new_run("dp"))) as net:
        with iperf3_server(net.hosts[1]) as srv:
            for name in args.part or list(PARTS):
                say(f"== {name}")
                PARTS[name](net, srv, args.seconds)
    say(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except LabError as e:
        sys.exit(f"error: {e}")
