"""FPS's 3:7 split (the kernel test's setting), repeated across TCP RTO floors and --flow-ewma.

    sudo .venv/bin/python bench/split.py --runs 4 --rto-min 10ms,default --flow-ewma 0.8,0.1
    sudo .venv/bin/python bench/split.py --runs 3 --rto-min 10ms --flow-ewma 0.8 --enforce police,shape

Two agents share 10 Mbit/s at a 50 ms interval; 3 cubic flows leave one, 7 the
other, for 38 s towards a sink on the same bridge (lab/topology.py's star).
After 6 s of warm-up the 3-flow limiter's share of the local limits is read
every 0.25 s for 30 s (0.30 is ideal, static gives 0.50); Jain's index is over
the 10 flows' iperf3 bytes.  The settings alternate run by run, so every row
of the summary was measured side by side with the others.  `default` keeps
the kernel's 200 ms RTO floor.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

from drl.lab.fairness import jain
from drl.lab.agents import Cluster
from drl.lab.measure import three_to_seven
from drl.lab.netns import Lab
from drl.lab.topology import new_run, star


def one_run(rto_min: str | None, flow_ewma: str, enforce: str = "police") -> tuple[float, float, float]:
    """(split, Jain, aggregate bits/s at the sink) of one 38-s run."""
    with tempfile.TemporaryDirectory() as tmp, Lab(star(3, new_run("bs"), rto_min=rto_min)) as net:
        h1, h2, h3 = net.hosts
        agents = Cluster(net, Path(tmp))
        opts = ("fps", "10mbit", "--interval", "50ms", "--flow-ewma", flow_ewma, "--enforce", enforce)
        run = three_to_seven(net, agents.start(h1, [h2], *opts), agents.start(h2, [h1], *opts), h3, poll_s=0.25)
    return run.share, jain(run.stream_bytes), run.sink_bps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs per setting")
    ap.add_argument("--rto-min", default="10ms,default", help="TCP RTO floors to compare (ip-route syntax)")
    ap.add_argument("--flow-ewma", default="0.8,0.1", help="drl-agent --flow-ewma values to compare")
    ap.add_argument("--enforce", default="police", help="drl-agent --enforce values to compare (police,shape)")
    args = ap.parse_args()
    settings = list(itertools.product(args.rto_min.split(","), args.flow_ewma.split(","), args.enforce.split(",")))
    results: dict = {s: [] for s in settings}
    for k in range(args.runs):
        for rto, fe, enf in settings:
            split, fairness, sink_bps = one_run(None if rto == "default" else rto, fe, enf)
            results[(rto, fe, enf)].append((split, fairness, sink_bps))
            print(f"run {k + 1}/{args.runs} rto_min {rto} flow-ewma {fe} enforce {enf}: split {split:.3f} "
                  f"Jain {fairness:.3f} aggregate {sink_bps / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
    print("| RTO floor | --flow-ewma | --enforce | split (min-max) | Jain (min-max) | aggregate Mbit/s (min-max) | runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (rto, fe, enf), rows in results.items():
        splits, fair, agg = ([r[i] for r in rows] for i in range(3))
        print(f"| {rto} | {fe} | {enf} | {min(splits):.3f}-{max(splits):.3f} | {min(fair):.3f}-{max(fair):.3f} "
              f"| {min(agg) / 1e6:.2f}-{max(agg) / 1e6:.2f} | {len(rows)} |")


if __name__ == "__main__":
    main()
