"""[[attack]] in experiment files: reading, validation with file:line errors, and the per-attack
envelope rows and checks on synthetic series (no root; the run is tests/kernel/test_lab_attack.py)."""
import pytest

from drl.cli.lab import failed_checks, render_attacks
from drl.lab.collector import DT
from drl.lab.reader import SpecError, load, loads
from drl.lab.results import attack_checks, attack_rows, back_within

from test_lab_faults import BASE

ATTACKS = """
[[attack]]
kind = "flood"
at = "10s"
duration = "3s"
agent = "l2"
rate = 50000

[[attack]]
kind = "lying_summer"
at = "2s"
duration = "3s"
agent = "l1"
after = "4s"
"""
N = BASE.count("\n")


def test_attacks_are_read_in_time_order_and_scaled_alike():
    exp = loads(BASE + ATTACKS)
    assert [(a.kind, a.at_s, a.duration_s, a.after_s, a.agent) for a in sorted(exp.attacks, key=lambda a: a.at_s)] == \
        [("lying_summer", 2.0, 3.0, 4.0, "l1"), ("flood", 10.0, 3.0, 3.0, "l2")]
    assert exp.attacks[0].rate_pps == 50000 and exp.attacks[0].label == "flood l2"
    half = exp.scaled(15.0)
    assert [(a.at_s, a.duration_s, a.after_s) for a in half.attacks] == [(5.0, 1.5, 1.5), (1.0, 1.5, 2.0)]


def test_the_shipped_attack_experiment():
    exp = load("lab/experiments/attack.toml")
    assert [a.kind for a in exp.attacks] == ["lying_summer", "huge_partial", "forged_limit", "foreign_filter",
                                             "flood", "clients"]
    assert exp.agent["branching"] == "1" and len(exp.limiters) == 5 and exp.checks == {}   # each attack's span is checked


@pytest.mark.parametrize("extra, expect", [
    ('\n[[attack]]\nkind = "flood"\nat = "2s"\nduration = "3s"\nagent = "sw"\n',
     f"bad.toml:{N + 6}: [[attack]] #1: field 'agent': 'sw' is not a limiter (l1, l2, l3)"),
    ('\n[[attack]]\nkind = "smurf"\nat = "2s"\nduration = "3s"\nagent = "l1"\n',
     f"bad.toml:{N + 3}: [[attack]] #1: field 'kind': expected one of lying_summer"),
    ('\n[[attack]]\nkind = "flood"\nat = "28s"\nduration = "3s"\nagent = "l1"\n',
     f"bad.toml:{N + 4}: [[attack]] #1: field 'at': the attack and its 'after' must lie within"),
    ('\n[[attack]]\nkind = "flood"\nat = "2s"\nduration = "3s"\nagent = "l1"\n'
     '[[attack]]\nkind = "flood"\nat = "6s"\nduration = "3s"\nagent = "l1"\n',
     f"bad.toml:{N + 9}: [[attack]] #2: field 'at': 6 s is before the previous attack's aftermath ends (8 s)"),
    ('\n[[attack]]\nkind = "clients"\nat = "2s"\nduration = "3s"\nagent = "l1"\n',
     f"bad.toml:{N + 3}: [[attack]] #1: field 'kind': clients needs a per-client rule"),
    ('\n[[attack]]\nkind = "flood"\nat = "2s"\nduration = "3s"\nagent = "l1"\nspeed = 3\n',
     f"bad.toml:{N + 7}: [[attack]] #1: field 'speed': unknown field"),
])
def test_bad_attack_names_line_and_field(extra, expect):
    with pytest.raises(SpecError) as e:
        loads(BASE + extra, "bad.toml")
    assert expect in str(e.value)
    assert "\n" not in str(e.value)


def test_back_within_is_when_the_last_window_over_the_envelope_ended():
    w = round(1 / DT)
    assert back_within([1.0] * 50, 1.0, 1.0, 5.0) == 0.0
    burst = [1.0] * 10 + [3.0] * 5 + [1.0] * 35      # 100-ms bins: 1.5 s of 3x from t = 1 s
    # windows starting at 1.0 .. 1.4 s carry the burst's excess; from 1.5 s on (0.5 s after the stop) none
    assert back_within(burst, 1.0 * w * DT, 1.0, 5.0) == pytest.approx(0.5)
    assert back_within([3.0] * 50, 1.0, 1.0, 5.0) is None


def test_an_attack_over_the_envelope_or_with_a_dead_agent_fails_the_run():
    exp = loads(BASE + ATTACKS)
    budget = 10_000
    ok = {"at_s": 10.0, "started_at_s": 10.0, "kind": "flood", "label": "flood l2", "agent_alive": True,
          "check": {"name": "peers_alive", "value": True, "bound": True, "ok": True}}
    liar = {"at_s": 2.0, "started_at_s": 2.0, "kind": "lying_summer", "label": "lying_summer l1", "agent_alive": False,
            "check": {"name": "liar_passed_over", "value": True, "bound": True, "ok": True}}
    g = exp.global_Bps
    series = [g] * 100 + [3 * g] * 30 + [g] * 170      # 3x the limit from 10 to 13 s: the flood's span
    rows = attack_rows(exp, series, [ok, liar], budget)
    assert rows[0]["during"]["ratio"] > 2 and rows[0]["after"]["ratio"] <= 1 and rows[0]["back_s"] == 0.0
    checks = attack_checks(exp, rows)
    verdicts = {(c["fault"], c["check"]): c["result"] for c in checks}
    assert verdicts == {("flood l2", "envelope_during"): "fail", ("flood l2", "envelope_after"): "pass",
                        ("flood l2", "agent_alive"): "pass", ("flood l2", "peers_alive"): "pass",
                        ("lying_summer l1", "envelope_during"): "pass", ("lying_summer l1", "envelope_after"): "pass",
                        ("lying_summer l1", "agent_alive"): "fail", ("lying_summer l1", "liar_passed_over"): "pass"}
    run = {"allocator": "fps", "repeat": 1, "checks": checks, "attacks": rows}
    assert len(failed_checks({"runs": [run]})) == 2
    assert "flood l2" in render_attacks({"runs": [run]})


def test_an_attack_that_raised_fails_its_own_check():
    exp = loads(BASE + ATTACKS)
    rows = attack_rows(exp, [exp.global_Bps] * 300, [{"at_s": 10.0, "error": "OSError: no"}], 10_000)
    own = [c for c in attack_checks(exp, rows) if c["fault"] == "flood l2"][-1]
    assert own["result"] == "fail" and own["value"] == "OSError: no"
