"""The simulator's cost per interval: FPS at N limiters with branching 3 (the sum tree runs).

    .venv/bin/python bench/sim_speed.py                       # 1,000 limiters: ~20 s
    .venv/bin/python bench/sim_speed.py --limiters 300,1000 --ticks 100 --profile

Half the limiters carry two fluid TCP flows (40 ms RTT); the run warms up 40 intervals, then
times ``Simulation.run`` over ``--ticks`` more.  ``--profile``: cProfile's top 25 by
cumulative time of the timed part.  bench/RESULTS.md "Speed and memory" has the figures.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from drl.sim import envelope as env
from drl.sim.engine import Setup, Simulation
from drl.sim.tcp import Flows, TcpFluid


def per_interval_s(n: int, ticks: int, profile: bool) -> float:
    rng = np.random.default_rng(1)
    node = np.repeat(np.arange(0, n, 2), 2)
    tcp = TcpFluid(Flows.build(node, rtt_s=env.RTT_S, start_s=rng.uniform(0, 2, len(node))), n, rng,
                   bucket_bytes=env.budget(n)[1])
    sim = Simulation(Setup(allocator="fps", n_nodes=n, global_Bps=env.GLOBAL_Bps, interval_s=env.INTERVAL_S,
                           branching=env.BRANCHING, delay_s=env.RTT_S / 2, seed=1), tcp)
    sim.run(40)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    sim.run(ticks)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return (time.perf_counter() - t0) / ticks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limiters", default="1000", help="comma-separated N (default 1000)")
    ap.add_argument("--ticks", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for n in (int(x) for x in args.limiters.split(",")):
        print(f"N={n}: {per_interval_s(n, args.ticks, args.profile) * 1e3:.1f} ms an interval", flush=True)


if __name__ == "__main__":
    main()
