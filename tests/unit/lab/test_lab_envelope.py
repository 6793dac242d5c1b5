"""The promise in every lab run: the worst window of >= 1 s against G x T + D (D from
agent/burst.py for the run's agents), per run and per fault, the ``max_envelope_ratio``
check, its place in the CLI's table and the plot; on synthetic series (no root)."""
import pytest

from drl.agent import burst
from drl.cli.lab import failed_checks, render
from drl.lab import plots
from drl.lab.collector import DT
from drl.lab.reader import SpecError, loads
from drl.lab.registry import resolve
from drl.lab.results import budget_bytes, enforce_mode, envelope, evaluate_checks, fault_rows, run_checks

BASE = """\
[experiment]
duration = "30s"
global = "30mbit"
allocators = ["fps", "ctb"]

[hosts]
l1 = "limiter"
l2 = "limiter"
l3 = "limiter"
sw = "router"
sink = "sink"

[[link]]
ends = ["l1", "sw"]
[[link]]
ends = ["l2", "sw"]
[[link]]
ends = ["l3", "sw"]
[[link]]
ends = ["sw", "sink"]

[[traffic]]
kind = "tcp"
from = "l1"
"""
G = 30e6 / 8


def test_the_budget_is_the_agents_for_the_mode_the_hosts_and_the_option():
    exp = loads(BASE, "e.toml")
    # no enforce: a class matching all traffic is shaped; 100 ms of G (375,000) > 3 floors
    assert enforce_mode(exp, "fps") == "shape"
    assert budget_bytes(exp, "fps") == burst.budget(G, 3, "shape") == round(0.1 * G)
    assert budget_bytes(exp, "ctb") == round(0.1 * G)          # one agent: the 100 ms rule
    assert enforce_mode(exp, "grd") == "police"                 # random drop only polices
    police = loads(BASE + '[agent]\nenforce = "police"\n', "e.toml")
    assert budget_bytes(police, "fps") == round(0.3 * G)
    given = loads(BASE + '[agent]\nburst_budget = "1MB"\n', "e.toml")
    assert budget_bytes(given, "fps") == 1_000_000
    per_allocator = loads(BASE + '[params.fps]\nenforce = "police"\nburst_budget = 100000\n', "e.toml")
    assert budget_bytes(per_allocator, "fps") == 3 * burst.POLICE_FLOOR     # raised to a floor per host
    assert budget_bytes(per_allocator, "ctb") == round(0.1 * G)


def test_max_envelope_ratio_bounds_the_run_and_every_fault():
    text = BASE.replace("[hosts]", "[checks]\nmax_envelope_ratio = 1.0\nmax_window_ratio = 1.1\n\n[hosts]")
    exp = loads(text + '[[fault]]\nat = "5s"\naction = "kill"\nagent = "l1"\n'
                       '[[fault]]\nat = "9s"\naction = "restart"\nagent = "l1"\nchecks = { max_envelope_ratio = 1.2 }\n',
                "e.toml")
    assert exp.checks == {"max_envelope_ratio": 1.0}            # per-fault checks stay with the faults
    assert exp.faults[0].checks == {"max_envelope_ratio": 1.0, "max_window_ratio": 1.1}
    assert exp.faults[1].checks["max_envelope_ratio"] == 1.2
    assert loads(BASE, "e.toml").checks == {}
    with pytest.raises(SpecError, match="max_envelope_ratio.*out of range"):
        loads(BASE.replace("[hosts]", "[checks]\nmax_envelope_ratio = 0\n\n[hosts]"), "e.toml")


def _restart_burst(exp, seconds=30.0, at=12.0, burst_s=0.3, level=2.0):
    """The aggregate at the limit, idle 8-12 s, then ``level`` x the limit for ``burst_s``."""
    agg = [exp.global_Bps] * round(seconds / DT)
    for k in range(80, 120):
        agg[k] = 0.0
    for k in range(round(at / DT), round((at + burst_s) / DT)):
        agg[k] = level * exp.global_Bps
    return agg


def test_a_restart_burst_beyond_the_budget_is_found_where_it_is():
    exp = loads(BASE, "e.toml")
    D = budget_bytes(exp, "fps")
    agg = _restart_burst(exp)
    e = envelope(agg, exp.global_Bps, D)
    # 0.3 s at 2 G: 0.3 G = 1.125 MB beyond G, six times D, in the shortest window (1 s) that holds
    # it; the idle before it cannot pay for it
    assert e["excess_bytes"] == round(0.3 * G) and e["excess_at_s"] == 12.0 and e["excess_window_s"] == 1.0
    assert e["ratio"] == pytest.approx(1.3 * G / (G + D), rel=1e-3)
    assert e["at_s"] == 12.0 and e["window_s"] == 1.0 and e["budget_bytes"] == D
    small = envelope(_restart_burst(exp, burst_s=0.1, level=1.05), exp.global_Bps, D)   # 0.5 % of G: within D
    assert small["ratio"] <= 1.0 and 0 < small["excess_bytes"] <= D


def test_fault_rows_carry_their_envelope_and_the_run_its_check():
    text = BASE.replace("[hosts]", "[checks]\nmax_envelope_ratio = 1.0\n\n[hosts]")
    exp = loads(text + '[[fault]]\nat = "11s"\naction = "kill"\nagent = "l1"\nhorizon = "4s"\n'
                       '[[fault]]\nat = "20s"\naction = "restart"\nagent = "l1"\n'
                       '[[fault]]\nat = "29.5s"\naction = "kill"\nagent = "l1"\n', "e.toml")
    D = budget_bytes(exp, "fps")
    agg = _restart_burst(exp)
    rows = fault_rows(exp, agg, [{"applied_at_s": f.at_s} for f in exp.faults], 30.0, D)
    kill, restart, late = rows
    assert kill["envelope"]["ratio"] > 1.0 and kill["envelope"]["at_s"] == 12.0    # on the run's clock
    assert restart["envelope"]["ratio"] < 1.0
    assert late["envelope"]["ratio"] is None                    # half a second: no window fits
    checks = evaluate_checks(exp, rows)
    assert [c["result"] for c in checks] == ["fail", "pass", "skipped"]
    result = {"envelope": envelope(agg, exp.global_Bps, D)}
    (whole,) = run_checks(exp, result)
    assert whole["result"] == "fail" and whole["value"] == result["envelope"]["ratio"]
    summary = {"runs": [{"allocator": "fps", "repeat": 1, "checks": checks + [whole]}]}
    assert failed_checks(summary) == [f"fps-1: kill l3 max_envelope_ratio {checks[0]['value']} > 1".replace("l3", "l1"),
                                      f"fps-1: whole run max_envelope_ratio {whole['value']} > 1"]
    flat = {"envelope": envelope([exp.global_Bps] * 300, exp.global_Bps, D)}
    assert run_checks(exp, flat)[0]["result"] == "pass"


def test_the_table_and_the_plot_show_the_worst_window(tmp_path):
    exp = loads(BASE, "e.toml")
    agg = _restart_burst(exp)
    e = envelope(agg, exp.global_Bps, budget_bytes(exp, "fps"))
    run = {"experiment": "e", "allocator": "fps", "repeat": 1, "global_limit_bps": 30e6, "aggregate_bps": 29e6,
           "utilization": 0.97, "jain_index": 0.9, "limiters": [{"name": "l1", "flows": 1, "share": 1.0}],
           "envelope": e, "series": {"dt_s": DT, "aggregate_bps": [x * 8 for x in agg],
                                     "limiters_bps": {"l1": [x * 8 for x in agg]}}}
    table = render({"experiment": "e", "runs": [run], "comparison": [{"runs": 1}]})
    assert f"{e['ratio']:.3f} (1 s)" in table and "envelope (G T + D)" in table
    assert plots.envelope_label(e) == f"; envelope {e['ratio']:.3f} over 1 s at 12 s"
    assert plots.envelope_label({"ratio": None}) == ""
    path = plots.timeseries([run], exp, tmp_path / "t.png")
    assert path.stat().st_size > 10_000


def test_shipped_envelope_experiment():
    exp = resolve("envelope")
    assert len(exp.limiters) == 3 and exp.allocators == ("fps",) and exp.duration_s <= 100
    assert "enforce" not in exp.agent_options("fps")             # the agent's default: shape
    assert {t.congestion_control for t in exp.traffic} == {"cubic", "bbr"}
    assert {t.src for t in exp.traffic if t.stop_s == 20.0} == set(exp.limiters)    # all busy, all stop
    restart = {t.start_s for t in exp.traffic if t.start_s > 0}
    assert restart == {30.0} and {t.src for t in exp.traffic if t.start_s == 30.0} == set(exp.limiters)
    assert [f.action for f in exp.faults] == ["kill", "restart", "partition", "heal"]
    assert exp.checks == {"max_envelope_ratio": 1.0}
