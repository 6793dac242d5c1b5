"""A fairness matrix: one experiment run over splits of TCP flows x congestion control x
enforcement, each cell scored against the share it should get.

    [matrix]                      # in an experiment file (lab/experiments/fairness.toml)
    splits = ["1:3:6", "3:7"]     # flows per limiter: one limiter per number, l1, l2, ...
    congestion_control = ["cubic", "bbr"]
    enforce = ["default", "police"]
    max_share_error = 0.05        # checks, per cell
    min_jain = 0.9

    summary = run_matrix(resolve("fairness"), Path("results/fairness"))

A cell is the file's experiment with its limiters replaced: ``l1..lN`` each linked to the
file's first router, N = the split's length, each sending its number of unpaced bulk TCP
flows (iperf3) for the whole run; the rest of the graph (the router, the sink and the delay
of their link) and every other setting is the file's.  ``enforce = "default"`` leaves the
agent's own choice (shape, for a class that matches everything).

What a cell should get: under ``fps`` a limiter's share of the delivered rate is its share of
the flows (the allocator's purpose: every flow the same rate, wherever it enters); under any
other allocator every limiter is backlogged, so the even split.  Scored after the warm-up:
``max_share_error`` (the largest |share - ideal| over the limiters), Jain's index over the
flows (checked under ``fps`` only), and ``time_to_share_s``, the first second by which every limiter has had a 1-s window
at >= 0.9 of its ideal rate.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, NamedTuple

from . import plots
from .spec import Experiment, Link, Matrix, Traffic

TO_SHARE = 0.9       # time_to_share_s: a 1-s window at this share of the ideal rate


class Cell(NamedTuple):
    split: tuple[int, ...]
    congestion_control: str
    enforce: str
    exp: Experiment

    @property
    def label(self) -> str:
        return f"{':'.join(map(str, self.split))} {self.congestion_control} {self.enforce}"


def cells(exp: Experiment) -> list[Cell]:
    """Every cell of ``exp.matrix``, in the file's order."""
    m = exp.matrix
    assert m is not None
    return [Cell(split, cc, enforce, cell(exp, split, cc, enforce))
            for split in m.splits for cc in m.congestion_control for enforce in m.enforce]


def cell(exp: Experiment, split: tuple[int, ...], cc: str, enforce: str) -> Experiment:
    """The file's experiment with limiters l1..lN sending ``split`` flows (module docstring)."""
    router = exp.of_role("router")[0]
    others = {h: r for h, r in exp.hosts.items() if r != "limiter"}
    limiters = [f"l{i + 1}" for i in range(len(split))]
    links = tuple(Link(h, router) for h in limiters) + tuple(
        l for l in exp.links if not any(exp.hosts[e] == "limiter" for e in l.ends))
    traffic = tuple(Traffic("tcp", h, 0.0, exp.duration_s, flows=n, congestion_control=cc)
                    for h, n in zip(limiters, split))
    agent = {k: v for k, v in exp.agent.items() if k != "enforce"}
    if enforce != "default":
        agent["enforce"] = enforce
    return dataclasses.replace(exp, name=f"{exp.name}-{'-'.join(map(str, split))}-{cc}-{enforce}",
                               hosts={**{h: "limiter" for h in limiters}, **others}, links=links,
                               traffic=traffic, agent=agent, congestion_control=cc, matrix=None)


def ideal_shares(split: tuple[int, ...], allocator: str) -> list[float]:
    if allocator == "fps":
        return [n / sum(split) for n in split]
    return [1 / len(split)] * len(split)


def score(run: dict, split: tuple[int, ...], m: Matrix) -> dict:
    """The cell's row: shares against ideal, Jain over flows, time to share, and its checks."""
    ideal = ideal_shares(split, run["allocator"])
    shares = [lim["share"] for lim in run["limiters"]]
    error = max(abs(s - i) for s, i in zip(shares, ideal))
    row = {"shares": shares, "ideal": ideal, "max_share_error": error, "jain_index": run["jain_index"],
           "time_to_share_s": time_to_share(run, ideal), "utilization": run["utilization"]}
    # Jain over the flows is FPS's promise; another allocator splits by limiter, not by flow
    jain_bound = m.min_jain if run["allocator"] == "fps" else None
    checks = [("max_share_error", error, m.max_share_error, ">", error <= (m.max_share_error or 0)),
              ("min_jain", run["jain_index"], jain_bound, "<",
               run["jain_index"] is not None and run["jain_index"] >= (jain_bound or 0))]
    row["checks"] = [{"check": name, "value": value, "bound": bound, "op": op, "result": "pass" if ok else "fail"}
                     for name, value, bound, op, ok in checks if bound is not None]
    return row


def time_to_share(run: dict, ideal: list[float]) -> float | None:
    """Seconds from the start until every limiter has had a 1-s window at >= TO_SHARE of its
    ideal rate; None if one never did."""
    series = run["series"]
    per_s = max(1, round(1.0 / series["dt_s"]))
    worst = 0.0
    for lim, share in zip(run["limiters"], ideal):
        rates = series["limiters_bps"][lim["name"]]
        want = TO_SHARE * share * run["global_limit_bps"]
        first = next((i + per_s for i in range(len(rates) - per_s + 1)
                      if sum(rates[i:i + per_s]) / per_s >= want), None)
        if first is None:
            return None
        worst = max(worst, first * series["dt_s"])
    return round(worst, 1)


def run_matrix(exp: Experiment, out: Path, allocators: list[str] | None, repeat: int | None,
               progress: Callable[[str], None], run_cell: Callable[..., dict]) -> dict:
    """Every cell with every allocator (``run_cell``: lab/runner.py run_experiment); writes
    DIR/result.json with ``matrix`` (one row a cell and allocator) and DIR/matrix.png."""
    rows, runs = [], []
    grid = cells(exp)
    for i, c in enumerate(grid):
        progress(f"== {exp.name}: cell {i + 1}/{len(grid)}: {c.label}")
        summary = run_cell(c.exp, out / c.exp.name, allocators, repeat, progress)
        for run in summary["runs"]:
            row = {"cell": c.label, "split": ":".join(map(str, c.split)), "congestion_control": c.congestion_control,
                   "enforce": c.enforce, "hosts": len(c.split), "allocator": run["allocator"],
                   "repeat": run["repeat"], **score(run, c.split, exp.matrix)}
            rows.append(row)
            # failed_checks (cli/lab.py) reads a run's checks, named by "fault"
            mine = [{**k, "fault": c.label, "at_s": 0.0} for k in row["checks"]]
            runs.append({**run, "checks": run.get("checks", []) + mine})
    doc = {"experiment": exp.name, "global_limit_bps": exp.global_Bps * 8, "duration_s": exp.duration_s,
           "warmup_s": exp.warmup_s, "matrix": rows, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(doc, indent=1))
    plots.matrix(rows, out / "matrix.png")
    return doc
