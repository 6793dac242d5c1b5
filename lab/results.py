"""From one run's measurements to its result.json document (docs/lab.md lists the keys).

    result = analyse(exp, "fps", run, k, groups, launched, meter, agents, out)
    rows = compare(runs)            # one row per allocator, means over its repeats

Means are taken over the measured window, after the warm-up; a flow's mean
over the part of the window it was active.  Rates in the document are bits/s.
"""
from __future__ import annotations

import math
from pathlib import Path

from drl.lab.fairness import jain
from drl.agent import burst
from drl.agent.units import parse_size, to_bps

from . import metrics
from .agents import Agent
from .collector import DT, Flow, SinkMeter, flow_series, web_transfers
from .spec import REFERENCE, Experiment
from .traffic import Group


def analyse(exp: Experiment, allocator: str, run: str, k: int, groups: list[Group], launched: dict[int, float],
            meter: SinkMeter, agents: list[Agent], out: Path, faults: list[dict] | None = None,
            attacks: list[dict] | None = None) -> dict:
    n = round(exp.duration_s / DT)
    aggregate = meter.series(n)
    # bins after the last sample are empty, not idle: windows stop at the last complete bin
    measured_s = min(exp.duration_s, math.floor(meter.samples[-1][0] / DT + 1e-9) * DT) if meter.samples else 0.0
    flows, hung = flow_series(groups, out, launched, n)
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
        "udp_groups_without_report": hung,      # hung at iperf3's setup: no flows of theirs above
        "convergence": metrics.convergence(per_limiter, DT, _changes(exp), exp.duration_s, exp.global_Bps),
        "window_ratios_1s": [round(x / exp.global_Bps, 4)
                             for x in metrics.rebin(aggregate[:round(measured_s / DT)], round(1.0 / DT))],
        "max_window_ratio": _max_window(exp, aggregate[:round(measured_s / DT)]),
        "envelope": envelope(aggregate[:round(measured_s / DT)], exp.global_Bps, budget_bytes(exp, allocator)),
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
    if exp.faults:
        result["faults"] = fault_rows(exp, aggregate, faults or [], measured_s, result["envelope"]["budget_bytes"])
        result["checks"] = evaluate_checks(exp, result["faults"])
    if exp.attacks:
        result["attacks"] = attack_rows(exp, aggregate[:round(measured_s / DT)], attacks or [],
                                        result["envelope"]["budget_bytes"])
        result["checks"] = result.get("checks", []) + attack_checks(exp, result["attacks"])
    if exp.checks:
        result["checks"] = result.get("checks", []) + run_checks(exp, result)
    return result


def attack_rows(exp: Experiment, aggregate: list[float], records: list[dict], budget: int) -> list[dict]:
    """One row per [[attack]]: the runner's record (lab/attacks.py: what was sent, the kind's
    ``check``, ``agent_alive``), the worst window of >= 1 s against G x T + D during it
    (``during``) and in its ``after_s`` after it (``after``), and ``back_s``: from how long
    after it stopped every 1-s window of its aftermath is within G x 1 s + D (0: none left it;
    None: the last did not come back)."""
    rows = []
    for i, a in enumerate(exp.attacks):
        rec = records[i] if i < len(records) else {"error": "not reached"}
        start = rec.get("started_at_s", a.at_s)
        stop, until = start + a.duration_s, start + a.duration_s + a.after_s
        row = {**rec, "duration_s": a.duration_s, "after_s": a.after_s,
               "during": _span_envelope(exp, aggregate, budget, start, stop),
               "after": _span_envelope(exp, aggregate, budget, stop, until),
               "back_s": back_within(aggregate, exp.global_Bps + budget, stop, until)}
        rows.append(row)
    return rows


def _span_envelope(exp: Experiment, aggregate: list[float], budget: int, start: float, stop: float) -> dict:
    lo = math.ceil(start / DT - 1e-9)
    return envelope(aggregate[lo:math.floor(stop / DT + 1e-9)], exp.global_Bps, budget, lo * DT)


def back_within(aggregate: list[float], one_second_Bytes: float, stop: float, until: float) -> float | None:
    """Seconds after ``stop`` from which every 1-s window (100-ms steps) starting before
    ``until`` - 1 s carries at most ``one_second_Bytes``; None when the last does not."""
    w = round(1.0 / DT)
    lo, hi = math.ceil(stop / DT - 1e-9), min(len(aggregate), math.floor(until / DT + 1e-9))
    over = [j for j in range(lo, hi - w + 1) if sum(aggregate[j:j + w]) * DT > one_second_Bytes * (1 + 1e-9)]
    if not over:
        return 0.0
    return None if over[-1] == hi - w else round((over[-1] + 1 - lo) * DT, 3)


def attack_checks(exp: Experiment, rows: list[dict]) -> list[dict]:
    """Each attack's checks: the worst window against G x T + D during and after it at most
    ``max_envelope_ratio`` ([checks], 1.0 if unset), its agent alive at the end, and the
    kind's own check (lab/attacks.py); an attack that raised fails them all."""
    bound = exp.checks.get("max_envelope_ratio", 1.0)
    out = []
    for a, row in zip(exp.attacks, rows):
        own = row.get("check") or {"name": "check", "value": row.get("error"), "bound": None, "ok": False}
        values = [("envelope_during", row["during"]["ratio"], bound, None),
                  ("envelope_after", row["after"]["ratio"], bound, None),
                  ("agent_alive", row.get("agent_alive"), True, bool(row.get("agent_alive"))),
                  (own["name"], own["value"], own["bound"], own["ok"] and "error" not in row)]
        for name, value, limit, ok in values:
            if ok is None:
                ok = value is not None and value <= limit + 1e-9
            out.append({"at_s": a.at_s, "fault": a.label, "check": name, "bound": limit, "value": value,
                        "result": "pass" if ok else "fail"})
    return out


def enforce_mode(exp: Experiment, allocator: str) -> str:
    """How the agents enforce the run's class: the [agent] (or [params]) ``enforce``, else the
    agent's default for a class that matches all traffic, as the lab's does (agent/config/build.py
    default_enforce: shape, except grd's random drop, which only a policer can do)."""
    return exp.agent_options(allocator).get("enforce") or ("police" if allocator == "grd" else "shape")


def budget_bytes(exp: Experiment, allocator: str) -> int:
    """D, the class's burst budget as the agents compute it (agent/burst.py) from the global
    limit, the number of agents (one in the reference run), the mode and ``burst_budget``."""
    opts = exp.agent_options(allocator)
    configured = parse_size(opts["burst_budget"]) if "burst_budget" in opts else None
    n = 1 if allocator == REFERENCE else len(exp.limiters)
    return burst.budget(exp.global_Bps, n, enforce_mode(exp, allocator), configured)


def envelope(aggregate: list[float], limit_Bps: float, budget: int, start_s: float = 0.0) -> dict:
    """The worst window of >= 1 s against G x T + D (lab/metrics.py's envelope): ``ratio`` its
    bytes over G x T + D (<= 1: the promise held) at ``at_s`` for ``window_s``, and the most any
    window carried beyond G x T, ``excess_bytes``, at ``excess_at_s`` for ``excess_window_s``.
    Over the whole measurement, warm-up included: the promise holds from the agents' start."""
    e = metrics.envelope(aggregate, DT, limit_Bps, budget)
    shift = lambda t: None if t is None else round(t + start_s, 3)   # noqa: E731
    return {"budget_bytes": budget, "ratio": None if e["ratio"] is None else round(e["ratio"], 4),
            "at_s": shift(e["ratio_at_s"]), "window_s": e["ratio_window_s"],
            "excess_bytes": round(e["excess"]), "excess_at_s": shift(e["at_s"]), "excess_window_s": e["window_s"]}


def run_checks(exp: Experiment, result: dict) -> list[dict]:
    """The whole run's checks ([checks] of spec.RUN_CHECKS): the worst envelope ratio."""
    out = []
    for name, bound in exp.checks.items():
        value = result["envelope"]["ratio"]
        out.append({"at_s": None, "fault": "whole run", "check": name, "bound": bound, "value": value,
                    "result": "fail" if value is None or value > bound + 1e-9 else "pass"})
    return out


def _max_window(exp: Experiment, aggregate: list[float]) -> float | None:
    """The highest 1-s mean (sliding by 100 ms) after the warm-up, over the limit."""
    means = metrics.sliding_means(metrics.window(aggregate, DT, exp.warmup_s, exp.duration_s), DT)
    return max(means) / exp.global_Bps if means else None


def demand_exceeds(exp: Experiment, t: float) -> bool:
    """Whether what is offered at ``t`` can use the whole limit: a TCP group is active, or the
    active UDP groups offer more than it (web traffic is not counted)."""
    active = [g for g in exp.traffic if g.start_s <= t < g.stop_s]
    udp = sum(g.rate_Bps * g.flows for g in active if g.kind == "udp")
    return any(g.kind == "tcp" for g in active) or udp > exp.global_Bps


def fault_rows(exp: Experiment, aggregate: list[float], records: list[dict], measured_s: float | None = None,
               budget: int | None = None) -> list[dict]:
    """One row per fault of the file: what was done (the runner's record) and what it did to the
    aggregate: the worst 1-s window in its horizon (cut at the next fault's time), the time
    until the limit is used again (lab/metrics.py's fault_impact) and, given the budget D, the
    worst window of >= 1 s within the horizon against G x T + D (``envelope``)."""
    rows = []
    for i, f in enumerate(exp.faults):
        rec = records[i] if i < len(records) else {"skipped": "not reached"}
        at = rec.get("applied_at_s", f.at_s)
        later = [g.at_s for g in exp.faults if g.at_s > f.at_s]
        end = exp.duration_s if measured_s is None else measured_s
        until = min([at + f.horizon_s, end] + later)
        row = {"at_s": f.at_s, "action": f.action, "label": f.label, "horizon_s": round(until - at, 3),
               **{k: v for k, v in rec.items() if k not in ("at_s", "action", "label")}}
        if f.agent:
            row["agent"] = f.agent
        if "skipped" in rec:
            row.update(worst_window_ratio=None, worst_window_at_s=None, recovery_s=None)
        else:
            row.update(metrics.fault_impact(aggregate, DT, exp.global_Bps, at, until, demand_exceeds(exp, at),
                                            end_s=end))
            if budget is not None:
                lo = math.ceil(at / DT - 1e-9)
                row["envelope"] = envelope(aggregate[lo:math.floor(until / DT + 1e-9)], exp.global_Bps, budget, lo * DT)
        rows.append(row)
    return rows


def evaluate_checks(exp: Experiment, rows: list[dict]) -> list[dict]:
    """Each fault's checks against its row: ``max_window_ratio`` (worst window <= it),
    ``max_envelope_ratio`` (worst window of >= 1 s in the horizon over G x T + D <= it) and
    ``recovery_s`` (limit used again within it; a skipped fault or one without excess demand
    is not checked, a fault whose aggregate never recovers fails)."""
    out = []
    for f, row in zip(exp.faults, rows):
        for name, bound in f.checks.items():
            value = {"max_window_ratio": row.get("worst_window_ratio"), "recovery_s": row.get("recovery_s"),
                     "max_envelope_ratio": (row.get("envelope") or {}).get("ratio")}[name]
            if "skipped" in row:
                verdict = "skipped"
            elif name == "recovery_s" and not demand_exceeds(exp, row["applied_at_s"]):
                verdict = "skipped"
            elif name == "max_envelope_ratio" and value is None:
                verdict = "skipped"     # a horizon shorter than one window: the whole run's check covers it
            elif value is None:
                verdict = "fail"
            else:
                verdict = "pass" if value <= bound + 1e-9 else "fail"
            out.append({"at_s": f.at_s, "fault": f.label, "check": name, "bound": bound,
                        "value": None if value is None else round(value, 4), "result": verdict})
    return out


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
