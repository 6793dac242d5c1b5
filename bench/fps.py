"""FPS's estimate interval x EWMA, next to the central token bucket, on the lab's baseline.

    sudo .venv/bin/python bench/fps.py                     # 9 cells x cubic, bbr: ~35 minutes
    sudo .venv/bin/python bench/fps.py --duration 20 --intervals 100ms --ewmas 0.1 --cc bbr:shape

Every cell runs the lab's `baseline` (2 limiters, 10 Mbit/s, 3:7 TCP flows,
[Raghavan07] §5.1, 40 ms RTT) once with FPS at that interval and EWMA and
once with CTB (one bucket on the router every flow crosses), back to back, and
reports utilization (delivered / limit, L2 bytes at the sink) and Jain's index
over the 10 flows as FPS over CTB ratios measured side by side.  ``--cc``
names the senders' congestion controls to compare, each with the enforcement
both FPS and CTB use (``bbr:shape``: docs/lab.md "Real paths").
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from drl.lab.registry import resolve
from drl.lab.runner import run_experiment


def cell(interval: str, ewma: str, cc: str, enforce: str, duration_s: float) -> dict:
    base = resolve("baseline")
    exp = dataclasses.replace(base.scaled(duration_s), congestion_control=cc,
                              agent={**base.agent, "interval": interval, "ewma": ewma, "enforce": enforce})
    with tempfile.TemporaryDirectory() as out:
        summary = run_experiment(exp, Path(out), allocators=["fps", "ctb"], repeat=1,
                                 progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    rows = {row["allocator"]: row for row in summary["comparison"]}
    return {"interval": interval, "ewma": ewma, "senders": f"{cc}, {enforce}", "fps": rows["fps"], "ctb": rows["ctb"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="50ms,100ms,500ms")
    ap.add_argument("--ewmas", default="0,0.1,0.5")
    ap.add_argument("--cc", default="cubic:police,bbr:shape",
                    help="senders' congestion control:enforcement, comma-separated")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds per run, warm-up included")
    args = ap.parse_args()
    results = []
    for senders in args.cc.split(","):
        cc, _, enforce = senders.partition(":")
        for interval in args.intervals.split(","):
            for ewma in args.ewmas.split(","):
                print(f"{cc} ({enforce or 'police'}): interval {interval}, ewma {ewma}", file=sys.stderr, flush=True)
                results.append(cell(interval, ewma, cc, enforce or "police", args.duration))
    print("| senders | interval | EWMA | FPS util. | CTB util. | ratio | FPS Jain | CTB Jain | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        f, c = r["fps"], r["ctb"]
        print(f"| {r['senders']} | {r['interval']} | {r['ewma']} | {f['utilization']:.3f} | {c['utilization']:.3f} | "
              f"{f['utilization'] / c['utilization']:.3f} | {f['jain_index']:.3f} | {c['jain_index']:.3f} | "
              f"{f['jain_index'] / c['jain_index']:.3f} |")


if __name__ == "__main__":
    main()
