"""Estimator.update's cost per tick with many flows, without a kernel; results go to bench/RESULTS.md.

    .venv/bin/python bench/estimator.py                       # ~1 minute
    PYTHONPATH=/tmp/ab .venv/bin/python bench/estimator.py    # the same for /tmp/ab/drl (a git worktree)

One class, `--flows` flows at first.  Each tick, `--visited` random flows get a new FlowSample in
their place (a tally visited their table entry) and `--new` flows come last, as
Datapath.read_flows hands them out; the passed bytes grow with them.  Reported: the median
process time of one update over the last `--ticks` ticks (the first third is warm-up), for
each number of new flows in `--new`.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from drl.agent.kernel.datapath import Counters, FlowKey, FlowSample
from drl.agent.estimator import Estimator

S = 1_000_000_000


def key(i: int) -> FlowKey:
    return FlowKey(4, 17, f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", "10.255.0.1", 1000, 80)


def measure(flows: int, visited: int, new: int, ticks: int, interval_s: float = 0.1) -> float:
    """Median seconds of process time per update."""
    rng = random.Random(1)
    table = [FlowSample(key(i), 0, 100, 1, 0, 0) for i in range(flows)]
    est, passed, now, took = Estimator(), 0, 1.0, []
    for tick in range(ticks + ticks // 2):
        now += interval_s
        ns = int(now * S)
        table = list(table)
        for i in rng.sample(range(len(table)), visited):
            f = table[i]
            table[i] = FlowSample(f.key, 0, f.bytes + 100, f.packets + 1, f.first_ns, ns)
        table += (FlowSample(key(len(table) + j), 0, 100, 1, ns, ns) for j in range(new))
        passed += 100 * (visited + new)
        t0 = time.process_time()
        est.update(now, Counters(passed, 0, tick), table, ns)
        if tick >= ticks // 2:
            took.append(time.process_time() - t0)
    return statistics.median(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=20_000)
    ap.add_argument("--visited", type=int, default=700, help="flows whose entry was visited, per tick")
    ap.add_argument("--new", default="0,50", help="new flows per tick, comma-separated")
    ap.add_argument("--ticks", type=int, default=200)
    args = ap.parse_args()
    print("| flows | visited a tick | new a tick | ms per update (median) |")
    print("| --- | --- | --- | --- |")
    for new in (int(n) for n in args.new.split(",")):
        ms = 1e3 * measure(args.flows, args.visited, new, args.ticks)
        print(f"| {args.flows:,} | {args.visited:,} | {new} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
