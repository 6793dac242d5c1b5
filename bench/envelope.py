"""Where the promise G x T + D breaks at scale: the simulator's `envelope` run by N x gossip branching,
with and without the sum tree (agent/gossip/tree.py).

    .venv/bin/python bench/envelope.py                                   # 300, 1000 x 3, 16 x tree, none: ~20 minutes
    .venv/bin/python bench/envelope.py --limiters 1000 --branching 3,16,64 --sum-tree off --out out/envelope-bench

Every cell is `drl-sim run envelope` (sim/envelope.py: a third of the FPS limiters busy, a
third idle, a third busy, idle 8 s and busy again, all at once) at one N and one branching,
the gossip targets each limiter updates per interval (3 is [Raghavan07]'s, 16 the agent's
default, which is a full mesh up to 17 hosts).  Per cell: the worst window against G x T + D
in the start-up (the warm-up), the busy phase and the restart, the most the local limits
summed to in the start-up and the restart (1-s means, x G), and the gossip cycle, the time in
which every limiter has heard every other once.  ``--sum-tree on`` is what the agent runs when the
branching is below the peers; ``off`` is per-peer gossip alone.  Same seed, same flows in every cell.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from drl.sim import envelope as env
from drl.sim.experiments import Options
from drl.sim.progress import Progress


def cell(n: int, branching: int, tree: bool, seed: int, quiet: bool) -> dict:
    progress = Progress(enabled=not quiet)
    row = env.simulate(n, Options(out=Path("."), limiters=n, seed=seed, progress=progress), branching, tree)
    sums = row["series"]["limit_sum_bps"]
    warm, restart = round(row["warm_s"]), round(row["restart_s"])
    ratio = lambda phase: row["envelopes"][phase]["ratio"]       # noqa: E731
    return {"limiters": n, "branching": branching, "sum_tree": row["sum_tree"],
            "cycle_s": env.cycle_s(n, branching),
            "startup": ratio("startup"), "busy": ratio("busy"), "restart": ratio("restart"),
            "startup_limit_sum": max(sums[:warm]) / (env.GLOBAL_Bps * 8),
            "restart_limit_sum": max(sums[restart:]) / (env.GLOBAL_Bps * 8),
            "row": row}


def _ints(low: int):
    """An argparse type: comma-separated integers, each >= low (a bad one is argparse's one-line error)."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
        if min(values) < low:
            raise argparse.ArgumentTypeError(f"every value must be >= {low}, got {text!r}")
        return values
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limiters", type=_ints(3), default="300,1000", help="Ns, comma-separated (>= 3)")
    ap.add_argument("--branching", type=_ints(1), default="3,16", help="gossip branchings, comma-separated")
    ap.add_argument("--sum-tree", choices=("on", "off", "both"), default="both",
                    help="the sum tree where the agent runs it (on), never (off), or both side by side")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write every cell's rows as cells.json here")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    args = ap.parse_args()
    trees = {"on": (True,), "off": (False,), "both": (False, True)}[args.sum_tree]
    cells = [cell(n, b, t, args.seed, args.quiet) for n in args.limiters for b in args.branching for t in trees]
    print("| N | branching | sum tree | gossip cycle | start-up | busy | restart | limits' sum: start-up | restart |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in cells:
        print(f"| {c['limiters']:,} | {c['branching']} | {'yes' if c['sum_tree'] else 'no'} | {c['cycle_s']:.2f} s | "
              f"{c['startup']:.3f} | {c['busy']:.3f} | {c['restart']:.3f} | {c['startup_limit_sum']:.2f} G | "
              f"{c['restart_limit_sum']:.2f} G |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cells.json").write_text(json.dumps(cells, indent=1))
        print(f"wrote {args.out / 'cells.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
