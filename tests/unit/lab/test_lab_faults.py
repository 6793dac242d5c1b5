"""[[fault]] in experiment files: reading, validation with file:line errors, the nftables rules,
and the per-fault metrics (worst 1-s window, recovery) and checks on synthetic series (no root)."""
import pytest

from drl.cli.lab import failed_checks, render_faults
from drl.lab.faults import gossip_loss_rules, partition_rules
from drl.lab.metrics import fault_impact, sliding_means
from drl.lab.reader import SpecError, loads
from drl.lab.registry import resolve
from drl.lab.results import demand_exceeds, evaluate_checks, fault_rows

BASE = """\
[experiment]
duration = "30s"
global = "30mbit"
allocators = ["fps"]

[checks]
max_window_ratio = 1.05
recovery_s = 3

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
from = "l3"
flows = 6
"""

FAULTS = """
[[fault]]
at = "5s"
action = "kill"
agent = "l3"

[[fault]]
at = "8s"
action = "restart"
agent = "l3"
checks = { recovery_s = 5 }

[[fault]]
at = "12s"
action = "loss"
percent = 30
on = "gossip"

[[fault]]
at = "14s"
action = "loss"
percent = 10
on = "data"
hosts = ["l1", "sw"]
horizon = "2s"

[[fault]]
at = "16s"
action = "heal"

[[fault]]
at = "18s"
action = "partition"
groups = [["l3"]]

[[fault]]
at = "20s"
action = "stop"
agent = "l1"

[[fault]]
at = "21s"
action = "cont"
agent = "l1"
"""


def test_faults_are_read_in_time_order_with_their_checks():
    exp = loads(BASE + FAULTS, "f.toml")
    assert [f.action for f in exp.faults] == ["kill", "restart", "loss", "loss", "heal", "partition", "stop", "cont"]
    kill, restart, gossip, data, heal, part, stop, cont = exp.faults
    assert (kill.at_s, kill.agent, kill.horizon_s) == (5.0, "l3", 5.0)
    assert kill.checks == {"max_window_ratio": 1.05, "recovery_s": 3.0}
    assert restart.checks == {"max_window_ratio": 1.05, "recovery_s": 5.0}    # its own overrides [checks]
    assert (gossip.percent, gossip.on, gossip.hosts) == (30, "gossip", ())
    assert (data.percent, data.on, data.hosts, data.horizon_s) == (10, "data", ("l1", "sw"), 2.0)
    assert part.groups == (("l3",), ("l1", "l2"))     # the limiters left out form the other group
    assert [f.label for f in exp.faults] == ["kill l3", "restart l3", "loss 30% gossip", "loss 10% data (l1,sw)",
                                             "heal", "partition l3|l1,l2", "stop l1", "cont l1"]


def test_file_order_does_not_matter_and_scaling_moves_faults():
    shuffled = FAULTS.split("\n[[fault]]")
    text = BASE + "\n[[fault]]".join([shuffled[0]] + shuffled[:0:-1])   # reversed
    exp = loads(text, "f.toml")
    assert [f.at_s for f in exp.faults] == [5, 8, 12, 14, 16, 18, 20, 21]
    half = exp.scaled(15.0)
    assert [f.at_s for f in half.faults] == [2.5, 4, 6, 7, 8, 9, 10, 10.5]
    assert half.faults[3].horizon_s == 2.0     # horizons are agent timescales: not scaled


def test_shipped_faults_experiment():
    exp = resolve("faults")
    assert exp.allocators == ("fps",) and exp.global_Bps == 30e6 / 8
    assert [t.flows for t in exp.traffic] == [1, 3, 6]
    actions = [f.action for f in exp.faults]
    assert actions == ["kill", "restart", "stop", "cont", "loss", "heal", "partition", "heal"]
    assert exp.faults[0].agent == "l3"     # the agent with the most flows
    # the gossip loss lasts until its heal (used again before it), a partition's side waits 2 s
    # for the other's fail-safe (lab/experiments/faults.toml says why)
    recovery = {"loss": 8.0, "partition": 4.0}
    assert all(f.checks == {"max_window_ratio": 1.05, "recovery_s": recovery.get(f.action, 3.0)} for f in exp.faults[:-1])
    # the partition's heal re-merges two FPS views (lab/experiments/faults.toml says why)
    assert exp.faults[-1].checks == {"max_window_ratio": 1.25, "recovery_s": 3.0}


def _bad(extra: str) -> str:
    with pytest.raises(SpecError) as err:
        loads(BASE + extra, "bad.toml")
    return str(err.value)


N = BASE.count("\n")  # the first line of `extra` is N + 1


@pytest.mark.parametrize("extra, expect", [
    ('\n[[fault]]\nat = "40s"\naction = "kill"\nagent = "l1"\n',
     f"bad.toml:{N + 3}: [[fault]] #1: field 'at': must lie within the experiment (0 .. 30 s)"),
    ('\n[[fault]]\nat = "4s"\naction = "reboot"\n', f"bad.toml:{N + 4}: [[fault]] #1: field 'action': expected one of kill"),
    ('\n[[fault]]\nat = "4s"\naction = "kill"\nagent = "sw"\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'agent': 'sw' is not a limiter (agents run on l1, l2, l3)"),
    ('\n[[fault]]\nat = "4s"\naction = "kill"\n', f"bad.toml:{N + 2}: [[fault]] #1: missing field 'agent'"),
    ('\n[[fault]]\nat = "4s"\naction = "heal"\nagent = "l1"\n', f"bad.toml:{N + 5}: [[fault]] #1: field 'agent': unknown field"),
    ('\n[[fault]]\nat = "4s"\naction = "loss"\npercent = 130\non = "gossip"\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'percent': a whole percentage 1..100, got 130"),
    ('\n[[fault]]\nat = "4s"\naction = "loss"\npercent = 30\non = "disk"\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'on': expected one of gossip, data"),
    ('\n[[fault]]\nat = "4s"\naction = "loss"\npercent = 30\non = "gossip"\nhosts = ["sw"]\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'hosts': 'sw' is not one of l1, l2, l3 (gossip loss is on agents' links)"),
    ('\n[[fault]]\nat = "4s"\naction = "loss"\npercent = 30\non = "data"\nhosts = ["nope"]\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'hosts': 'nope' is not one of l1, l2, l3, sw, sink"),
    ('\n[[fault]]\nat = "4s"\naction = "partition"\ngroups = [["l1"], ["l1", "l2"]]\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'groups': the groups must be disjoint"),
    ('\n[[fault]]\nat = "4s"\naction = "partition"\ngroups = [["l1", "l2", "l3"]]\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'groups': a partition needs at least two groups"),
    ('\n[[fault]]\nat = "4s"\naction = "partition"\ngroups = "l1|l2"\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'groups': expected a list of lists of limiter names"),
    ('\n[[fault]]\nat = "4s"\naction = "restart"\nagent = "l1"\n',
     f"bad.toml:{N + 4}: [[fault]] #1: field 'action': cannot restart l1 at 4 s: it is running then"),
    ('\n[[fault]]\nat = "4s"\naction = "stop"\nagent = "l1"\n[[fault]]\nat = "2s"\naction = "cont"\nagent = "l1"\n',
     f"bad.toml:{N + 8}: [[fault]] #2: field 'action': cannot cont l1 at 2 s: it is running then"),
    ('\n[[fault]]\nat = "4s"\naction = "kill"\nagent = "l1"\n[[fault]]\nat = "6s"\naction = "kill"\nagent = "l1"\n',
     f"bad.toml:{N + 8}: [[fault]] #2: field 'action': cannot kill l1 at 6 s: it is dead then"),
    ('\n[[fault]]\nat = "4s"\naction = "kill"\nagent = "l1"\nchecks = { max_window = 1 }\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'checks': 'max_window': unknown check"),
    ('\n[[fault]]\nat = "4s"\naction = "kill"\nagent = "l1"\nhorizon = "0s"\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'horizon': must be positive"),
])
def test_bad_fault_names_line_and_field(extra, expect):
    assert expect in _bad(extra)


def test_bad_checks_table():
    text = BASE.replace("recovery_s = 3", 'recovery_s = "soon"')
    with pytest.raises(SpecError, match=r"bad.toml:8: \[checks\]: field 'recovery_s': expected a number"):
        loads(text, "bad.toml")


def test_control_network_faults_need_two_limiters():
    one = BASE.replace('l2 = "limiter"\nl3 = "limiter"\n', "").replace(
        '[[link]]\nends = ["l2", "sw"]\n[[link]]\nends = ["l3", "sw"]\n', "").replace('from = "l3"', 'from = "l1"')
    with pytest.raises(SpecError, match="needs at least two limiters"):
        loads(one + '\n[[fault]]\nat = "4s"\naction = "loss"\npercent = 30\non = "gossip"\n', "one.toml")


# -- the rules (pure) -------------------------------------------------------------------

def test_gossip_loss_rules_test_each_datagram_once():
    every = ["p1", "p2", "p3"]
    assert gossip_loss_rules(every, 30, every) == [
        'iifname { "p1", "p2", "p3" } udp dport 7470 numgen random mod 100 < 30 counter drop',
        'iifname { "p1", "p2", "p3" } udp sport 7470 udp dport != 7470 numgen random mod 100 < 30 counter drop']
    some = gossip_loss_rules(["p1"], 100, every)
    assert some[2:] == ['iifname != { "p1" } oifname { "p1" } udp dport 7470 counter drop',
                        'iifname != { "p1" } oifname { "p1" } udp sport 7470 udp dport != 7470 counter drop']


def test_partition_rules_cut_every_pair_both_ways():
    assert partition_rules([["a", "b"], ["c"]]) == ['iifname { "a", "b" } oifname { "c" } counter drop',
                                                    'iifname { "c" } oifname { "a", "b" } counter drop']


# -- metrics on synthetic series --------------------------------------------------------

DT, L = 0.1, 100.0


def series(*pieces):
    """(seconds, level) pieces -> a 100-ms series."""
    return [level for secs, level in pieces for _ in range(round(secs / DT))]


def test_sliding_means():
    assert sliding_means([1, 2, 3, 4], 1.0, 2.0) == [1.5, 2.5, 3.5]
    assert sliding_means([5.0] * 20, DT) == [5.0] * 11


def test_overshoot_after_a_kill():
    # at the limit, then 2 s at 125 % from 10.3 s (survivors grew, the orphan kept its rate), then back
    agg = series((10.3, L), (2.0, 1.25 * L), (7.7, L))
    out = fault_impact(agg, DT, L, at_s=10.0, until_s=15.0)
    assert out["worst_window_ratio"] == pytest.approx(1.25)
    assert 10.3 <= out["worst_window_at_s"] <= 11.3
    assert out["recovery_s"] == 0.0                   # never below 95 %


def test_recovery_after_a_dip():
    # a stall: 40 % for 1.5 s from 20.5 s, then back at the limit
    agg = series((20.5, L), (1.5, 0.4 * L), (8.0, L))
    out = fault_impact(agg, DT, L, at_s=20.0, until_s=25.0)
    assert out["worst_window_ratio"] == pytest.approx(1.0)
    # the window from 21.9 s holds 0.1 s of the stall (94 %); the one from 22.0 s is clear
    assert out["recovery_s"] == pytest.approx(2.0)


def test_no_recovery_is_none_and_no_demand_is_not_judged():
    agg = series((5.0, L), (5.0, 0.3 * L))
    assert fault_impact(agg, DT, L, at_s=5.0, until_s=9.0)["recovery_s"] is None
    assert fault_impact(agg, DT, L, at_s=5.0, until_s=9.0, demand_exceeds=False)["recovery_s"] is None
    # a dip that starts late in the horizon still counts, recovery is measured from the fault
    agg = series((5.0, L), (3.0, L), (1.0, 0.2 * L), (3.0, L))
    assert fault_impact(agg, DT, L, at_s=5.0, until_s=10.0)["recovery_s"] == pytest.approx(4.0)


def test_bins_after_the_last_sample_do_not_count_as_a_dip():
    agg = series((9.9, L), (0.1, 0.0))       # the meter's last sample came at 9.9 s
    assert fault_impact(agg, DT, L, at_s=7.0, until_s=10.0)["recovery_s"] is None
    assert fault_impact(agg, DT, L, at_s=7.0, until_s=10.0, end_s=9.9)["recovery_s"] == 0.0


def test_horizon_shorter_than_a_window_still_has_one():
    agg = series((10.0, L))
    out = fault_impact(agg, DT, L, at_s=3.0, until_s=3.5)
    assert out["worst_window_ratio"] == pytest.approx(1.0) and out["worst_window_at_s"] == 3.0


def test_fault_rows_and_checks():
    exp = loads(BASE + FAULTS, "f.toml")
    n = round(exp.duration_s / DT)
    limit = exp.global_Bps
    agg = [limit] * n
    for k in range(52, 72):            # 5.2-7.2 s: 120 % after the kill
        agg[k] = 1.2 * limit
    for k in range(85, 100):           # 8.5-10 s: 40 % after the restart
        agg[k] = 0.4 * limit
    records = [{"at_s": f.at_s, "action": f.action, "applied_at_s": f.at_s + 0.02} for f in exp.faults]
    records[6]["skipped"] = "no agent on l1 in this run"
    rows = fault_rows(exp, agg, records)
    kill, restart = rows[0], rows[1]
    assert kill["horizon_s"] == pytest.approx(2.98)          # cut at the restart
    assert kill["worst_window_ratio"] == pytest.approx(1.2) and kill["recovery_s"] == 0.0
    assert restart["worst_window_ratio"] == pytest.approx(1.0)
    assert restart["recovery_s"] == pytest.approx(10.0 - 8.02, abs=0.01)
    assert rows[6]["worst_window_ratio"] is None and rows[6]["skipped"]
    checks = evaluate_checks(exp, rows)
    verdict = {(c["fault"], c["check"]): c["result"] for c in checks}
    assert verdict[("kill l3", "max_window_ratio")] == "fail"
    assert verdict[("kill l3", "recovery_s")] == "pass"
    assert verdict[("restart l3", "recovery_s")] == "pass"    # its own 5 s
    assert verdict[("stop l1", "max_window_ratio")] == "skipped"
    summary = {"runs": [{"allocator": "fps", "repeat": 1, "faults": rows, "checks": checks}]}
    assert failed_checks(summary) == ["fps-1: kill l3 max_window_ratio 1.2 > 1.05"]
    text = render_faults(summary)
    assert "kill l3" in text and "worst  1.200" in text and "skipped: no agent" in text


def test_demand_exceeds_counts_tcp_and_udp_offers():
    exp = loads(BASE, "f.toml")
    assert demand_exceeds(exp, 3.0)
    udp = BASE.replace('kind = "tcp"\nfrom = "l3"\nflows = 6', 'kind = "udp"\nfrom = "l3"\nrate = "10mbit"\nflows = 2')
    assert not demand_exceeds(loads(udp, "u.toml"), 3.0)


def test_drl_lab_run_exits_1_when_a_check_fails(monkeypatch, tmp_path):
    from click.testing import CliRunner
    from drl.cli.lab import main

    def fake_run(exp, out, allocators, repeat, progress):
        row = {"at_s": 5.0, "action": "kill", "label": "kill l3", "applied_at_s": 5.0,
               "worst_window_ratio": 1.27, "recovery_s": 0.0}
        checks = [{"at_s": 5.0, "fault": "kill l3", "check": "max_window_ratio", "bound": 1.05, "value": 1.27,
                   "result": "fail"}]
        run = {"experiment": exp.name, "allocator": "fps", "repeat": 1, "global_limit_bps": 30e6,
               "aggregate_bps": 30e6, "utilization": 1.0, "jain_index": 0.9,
               "limiters": [{"name": "l3", "flows": 6, "share": 1.0}], "faults": [row], "checks": checks}
        return {**run, "runs": [run], "comparison": [{"allocator": "fps", "runs": 1, "jain_index": 0.9}]}

    monkeypatch.setattr("drl.lab.runner.run_experiment", fake_run)
    res = CliRunner().invoke(main, ["run", "faults", "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "kill l3" in res.output and "max_window_ratio fail" in res.output
    assert "1 check(s) failed: fps-1: kill l3 max_window_ratio 1.27 > 1.05" in res.output


def test_loss_without_nft_is_refused_before_the_run(monkeypatch, tmp_path):
    from drl.lab.preflight import check
    from drl.lab.reader import load
    path = tmp_path / "f.toml"
    path.write_text(BASE + FAULTS)
    exp = load(path)
    monkeypatch.setattr("drl.lab.preflight.shutil.which", lambda tool: None if tool == "nft" else "/bin/" + tool)
    with pytest.raises(SpecError) as err:
        check(exp)
    assert f"f.toml:{N + 15}: [[fault]] #3: field 'action': loss needs nftables' nft" in str(err.value)


def test_the_documented_fault_example_is_valid():
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "lab.md").read_text()
    example = next(b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if "[[fault]]" in b)
    base = BASE.replace('duration = "30s"', 'duration = "60s"').replace("[checks]\nmax_window_ratio = 1.05\nrecovery_s = 3\n", "")
    exp = loads(base + example, "docs/lab.md")
    assert [f.label for f in exp.faults] == ["kill l3", "restart l3", "stop l2", "loss 30% gossip (l1)",
                                             "partition l1,l2|l3", "heal"]
    assert exp.faults[0].checks == {"max_window_ratio": 1.25, "recovery_s": 3.0, "max_envelope_ratio": 1.0}
    assert exp.checks == {"max_envelope_ratio": 1.0}
