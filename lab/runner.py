"""Run an experiment: build, start agents, play the schedule, measure, tear down, analyse.

    from drl.lab.registry import resolve
    summary = run_experiment(resolve("baseline"), Path("results/baseline"),
                             allocators=["fps", "ctb"], repeat=3)

Each run gets a fresh run prefix and its own namespaces, and is torn down
before the next starts.  Every run writes ``DIR/<allocator>-<k>/result.json``;
``DIR/result.json`` holds the first run's fields at the top level plus
``runs`` (every run) and ``comparison`` (one row per allocator), and the PNG
plots sit next to it (lab/plots.py).
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

from drl.agent.allocators import names as available_allocators
from drl.agent.units import to_bps

from . import plots, preflight
from .agents import Agent, StatusPoller, start_agents
from .attacks import Attacks
from .collector import DT, MAX_READ_S, SinkMeter
from .delay import drops_summary, link_rows
from .errors import LabError
from .faults import Faults
from .netns import Lab, poll, stop
from .results import analyse, compare
from .spec import REFERENCE, Experiment
from .topology import plan as make_plan
from .traffic import Group, place

Progress = Callable[[str], None]
SERVER_WAIT_S = 5.0


def run_experiment(exp: Experiment, out: Path, allocators: list[str] | None = None, repeat: int | None = None,
                   progress: Progress = print) -> dict:
    if exp.matrix:     # one run of this function a cell (lab/matrix.py)
        from .matrix import run_matrix
        return run_matrix(exp, out, allocators, repeat, progress, run_experiment)
    allocators = allocators or list(exp.allocators)
    missing = [a for a in allocators if a not in available_allocators()]
    if missing:
        raise LabError(f"unknown allocator {', '.join(missing)} (choose from {', '.join(available_allocators())})")
    preflight.check(exp)
    runs = []
    for alloc in allocators:
        for k in range(repeat or exp.repeat):
            progress(f"== {exp.name}: {alloc} run {k + 1}/{repeat or exp.repeat}")
            runs.append(run_once(exp, alloc, out / f"{alloc}-{k + 1}", k, progress))
    summary = {**runs[0], "runs": runs, "comparison": compare(runs)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(summary, indent=1))
    plots.draw_all(summary, exp, out)
    return summary


def run_once(exp: Experiment, allocator: str, out: Path, k: int, progress: Progress) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(exp, central=allocator == REFERENCE)
    groups = place(plan, seed=k)
    with Lab(plan) as lab:
        progress(f"   built {len(lab.plan.namespaces)} namespaces (run {plan.run}); starting {len(plan.agent_ifaces())} agent(s)")
        if lab.relays:
            progress(f"   {len(lab.relays)} link(s) delayed by the delay line (no sch_netem; lab/delay.py)")
        agents = start_agents(lab, allocator, out)
        receivers = _start_servers(lab, groups, out)
        t0 = time.monotonic()
        with StatusPoller(agents, t0), SinkMeter(plan) as meter, Faults(lab, agents, out, t0) as faults, \
                Attacks(lab, agents, out, t0) as attacks:
            launched, clients = _play(lab, agents, groups, out, meter, t0, progress, faults, attacks)
        _finish(clients + receivers)  # every receiver writes its report when its client is done
    result = analyse(exp, allocator, plan.run, k, groups, launched, meter, agents, out, faults.records, attacks.records)
    result["links"] = link_rows(lab.plan, lab.delay_stats())   # after teardown: the relays' final counts
    slow = [r for r in meter.reads if r[1] > MAX_READ_S]
    result["sink_reads"] = {"count": len(meter.reads), "dropped_slow": len(slow),
                            "slowest_s": max((r[1] for r in meter.reads), default=None), "slow": slow[:50]}
    for line in drops_summary(result["links"]):
        progress(f"   {line}")
    for label in result["udp_groups_without_report"]:
        progress(f"   warning: {label} left no report (iperf3 hung at UDP setup on a lossy link); its flows are left out")
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _start_servers(lab: Lab, groups: list[Group], out: Path) -> list[subprocess.Popen]:
    """Start every group's server; returns the iperf3 ones (they exit, with their report, after one test)."""
    receivers = []
    for g in groups:
        log = g.report(out) if g.traffic.kind != "web" else out / f"web-server{g.index}.log"
        proc = lab.spawn(g.server_host, g.server_argv(out), log=log)
        if g.traffic.kind != "web":
            receivers.append(proc)
    deadline = time.monotonic() + SERVER_WAIT_S
    for g in groups:
        host = lab.host(g.server_host)
        if not poll(lambda: host.listening(g.port), max(0.0, deadline - time.monotonic())):
            raise LabError(f"the server for {g.label} did not start listening on port {g.port}")
    return receivers


def _finish(procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + SERVER_WAIT_S
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(proc)


def _play(lab: Lab, agents: list[Agent], groups: list[Group], out: Path, meter: SinkMeter, t0: float,
          progress: Progress, faults: Faults | None = None, attacks: Attacks | None = None):
    """The schedule: every 100 ms fire what is due (flows, link events, faults), then sample the sink.
    An agent that exits on its own voids the run: the others would go on as if nothing had
    happened, and its host at its fail-safe rate looks like a plausible result."""
    exp = lab.plan.exp
    actions = sorted([(g.traffic.start_s, "start", g) for g in groups]
                     + [(e.at_s, "event", e) for e in exp.events]
                     + [(f.at_s, "fault", f) for f in (exp.faults if faults else ())]
                     + [(a.at_s, "attack", a) for a in (exp.attacks if attacks else ())], key=lambda a: a[0])
    launched, clients, tick = {}, [], 0
    while (now := time.monotonic() - t0) < exp.duration_s:
        while actions and actions[0][0] <= now:
            _, what, item = actions.pop(0)
            if what == "start":
                launched[item.index] = time.monotonic() - t0
                clients.append(lab.spawn(item.client_host, item.client_argv(out), log=out / f"client{item.index}.log"))
            elif what == "attack":
                attacks.start(item, time.monotonic() - t0)
                progress(f"   t={now:5.1f}s  attack: {item.label} for {item.duration_s:g}s")
            elif what == "fault":
                rec = faults.apply(item, time.monotonic() - t0)
                pid = f" (pid {rec['pid']})" if "pid" in rec else ""
                progress(f"   t={now:5.1f}s  fault: {item.label}{pid}" + (f": skipped, {rec['skipped']}" if "skipped" in rec else ""))
            else:
                link = next(l for l in exp.links if set(l.ends) == set(item.link))
                lab.apply(lab.plan.shaping_commands(link, item.rate_Bps))
                progress(f"   t={now:5.1f}s  link {'-'.join(item.link)} now {to_bps(item.rate_Bps) / 1e6:g} Mbit/s")
        meter.sample(time.monotonic() - t0)     # not ``now``: the actions above may have taken a while
        if tick % 10 == 0:
            progress(f"   t={now:5.1f}/{exp.duration_s:g}s  delivered {to_bps(meter.rate()) / 1e6:6.2f} Mbit/s")
            dead = next(filter(None, (a.exit_note() for a in agents)), None)
            if dead:
                raise LabError(f"{dead}; the run is void")
        tick += 1
        time.sleep(max(0.0, t0 + tick * DT - time.monotonic()))
    return launched, clients
