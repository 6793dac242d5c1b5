"""From one run's measurements to its result.json document (docs/lab.md lists the keys).

    result = analyse(exp, "fps", run, k, groups, launched, meter, agents, out)
    rows = compare(runs)            # one row per allocator, means over its repeats

Means are taken over the measured window, after the warm-up; a flow's mean
over the part of the window it was active.  Rates in the document are bits/s.
"""
from __future__ import annotations

from pathlib import Path

from agent.fairness import jain
from agent.units import to_bps

from . import metrics
from .agents import Agent
from .collector import DT, Flow, SinkMeter, flow_series, web_transfers
from .spec import Experiment
from .traffic import Group


def analyse(exp: Experiment, allocator: str, run: str, k: int, groups: list[Group], launched: dict[int, float],
            meter: SinkMeter, agents: list[Agent], out: Path) -> dict:
    n = round(exp.duration_s / DT)
    aggregate = meter.series(n)
    flows = flow_series(groups, out, launched, n)
    per_limiter = {h: [sum(col) for col in zip(*[f.series for f in flows if f.limiter == h])] or [0.0] * n
                   for h in exp.limiters}
    agg_mean = _mean(exp, aggregate)
    flow_means = {f.label: _mean(exp, f.series, f.start_s, f.stop_s) for f in flows}
    lo, hi = exp.warmup_s, exp.duration_s
    bulk = [flow_means[f.label] for f in flows if f.kind == "tcp" and max(lo, f.start_s) < min(hi, f.stop_s)]
    result = {
        "experiment": exp.name, "allocator": allocator, "run": run, "repeat": k + 1,
        "global_limit_bps": to_bps(exp.global_Bps), "duration_s": exp.duration_s, "warmup_s": exp.warmup_s,
        "aggregate_bps": to_bps(agg_mean),
        "utilization": agg_mean / exp.global_Bps,
        "utilization_timescales": metrics.utilization(metrics.window(aggregate, DT, lo, hi), DT, exp.global_Bps),
        "jain_index": jain(bulk) if bulk else None,  # §4.1, across TCP flows
        "limiters": _limiters(exp, flows, per_limiter, agents),
        "flows": [{"label": f.label, "limiter": f.limiter, "kind": f.kind, "mean_bps": to_bps(flow_means[f.label])}
                  for f in flows],
        "convergence": metrics.convergence(per_limiter, DT, _changes(exp), exp.duration_s, exp.global_Bps),
        "series": {
            "dt_s": DT,
            "aggregate_bps": _bps(aggregate),
            "limiters_bps": {h: _bps(s) for h, s in per_limiter.items()},
            "flows_bps": {f.label: _bps(f.series) for f in flows},
            "local_limit_bps": {a.host: [[round(t, 2), s["local_limit_bps"]] for t, s in a.samples] for a in agents},
        },
    }
    if any(g.traffic.kind == "web" for g in groups):
        result["web"] = metrics.web_table(web_transfers(groups, out))
    return result


def _mean(exp: Experiment, series: list[float], start: float = 0.0, stop: float = float("inf")) -> float:
    return metrics.mean(metrics.window(series, DT, max(exp.warmup_s, start), min(exp.duration_s, stop)))


def _bps(series: list[float]) -> list[int]:
    return [round(to_bps(x)) for x in series]


def _changes(exp: Experiment) -> list[float]:
    """Times the demand or the network changes: where convergence is measured from."""
    times = [0.0] + [t.start_s for t in exp.traffic] + [t.stop_s for t in exp.traffic] + [e.at_s for e in exp.events]
    return [t for t in times if t < exp.duration_s]


def _limiters(exp: Experiment, flows: list[Flow], per_limiter: dict[str, list[float]], agents: list[Agent]) -> list[dict]:
    means = {h: _mean(exp, s) for h, s in per_limiter.items()}
    total = sum(means.values()) or 1.0
    rows = []
    for h, m in means.items():
        control = [s["gossip"]["control_bps"] for a in agents if a.host == h
                   for t, s in a.samples if exp.warmup_s <= t < exp.duration_s]
        rows.append({"name": h, "flows": sum(1 for f in flows if f.limiter == h and f.kind != "web"),
                     "mean_bps": to_bps(m), "share": m / total,
                     "control_bps": metrics.mean(control) if control else None})
    return rows


def compare(runs: list[dict]) -> list[dict]:
    """One row per allocator: means over its repeats."""
    rows = []
    for alloc in dict.fromkeys(r["allocator"] for r in runs):
        mine = [r for r in runs if r["allocator"] == alloc]
        jains = [r["jain_index"] for r in mine if r["jain_index"] is not None]
        names = [l["name"] for l in mine[0]["limiters"]]
        rows.append({"allocator": alloc, "runs": len(mine),
                     "aggregate_bps": metrics.mean([r["aggregate_bps"] for r in mine]),
                     "utilization": metrics.mean([r["utilization"] for r in mine]),
                     "jain_index": metrics.mean(jains) if jains else None,
                     "jain_indices": jains,
                     "shares": {n: metrics.mean([r["limiters"][i]["share"] for r in mine]) for i, n in enumerate(names)}})
    return rows
