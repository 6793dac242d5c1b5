"""``drl-sim run envelope`` (sim/envelope.py): the worst window of >= 1 s against G x T + D
while FPS limiters go busy, idle and busy again; and the envelope in the churn run's rows."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from drl.agent import burst
from drl.cli.sim import main
from drl.lab.metrics import envelope as lab_envelope
from drl.sim import envelope as env
from drl.sim.trace import envelope


def test_the_budget_and_the_buckets_are_the_agents_for_policing_hosts():
    for n in (30, 1000):
        d, depth = env.budget(n)
        assert d == burst.budget(env.GLOBAL_Bps, n, "police") == round(0.3 * env.GLOBAL_Bps)
        assert d - n <= n * depth <= d           # the hosts' buckets hold the budget, no more
    busy, restarting, idle = env.groups(1000, seed=1)
    assert len(busy) == len(idle) == 333 and len(restarting) == 334
    assert len(set(busy) | set(restarting) | set(idle)) == 1000


def test_the_sims_envelope_is_the_labs_on_the_run_clock():
    series = np.array([1.0] * 40 + [0.0] * 20 + [2.0] * 4 + [1.0] * 40)
    got = envelope(series, 0.05, 1.0, 0.1, start_s=10.0)
    ref = lab_envelope(series.tolist(), 0.05, 1.0, 0.1)
    assert got["ratio"] == pytest.approx(ref["ratio"]) and got["excess_bytes"] == round(ref["excess"])
    assert got["at_s"] == pytest.approx(10.0 + ref["ratio_at_s"]) and got["budget_bytes"] == 0.1


def test_busy_idle_busy_at_30_limiters_reports_the_envelope_per_phase(tmp_path):
    out = CliRunner().invoke(main, ["run", "envelope", "--limiters", "30", "--out", str(tmp_path), "-q"])
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "result.json").read_text())
    (row,) = result["rows"]
    assert (row["busy"], row["busy_idle_busy"], row["idle"]) == (10, 10, 10)
    phases = row["envelopes"]
    assert set(phases) == {"whole", "startup", "measured", "busy", "idle", "restart"}
    assert row["branching"] == env.BRANCHING and len(row["series"]["limit_sum_bps"]) == len(row["series"]["t_s"])
    assert row["envelope"] == phases["whole"] and row["envelope"]["budget_bytes"] == burst.budget(env.GLOBAL_Bps, 30)
    # every phase's windows are windows of the whole run
    assert all(p["ratio"] <= phases["whole"]["ratio"] + 1e-9 for p in phases.values())
    assert row["restart_s"] <= phases["restart"]["at_s"] < row["end_s"]
    assert phases["startup"]["at_s"] + phases["startup"]["window_s"] <= row["warm_s"] + 1e-9
    # two thirds silent: the idle phase is the one that cannot come near the envelope
    assert phases["idle"]["ratio"] < min(phases["busy"]["ratio"], phases["restart"]["ratio"])
    assert result["claims"]["envelope_ratio"] == phases["whole"]["ratio"]
    assert (tmp_path / "envelope.png").stat().st_size > 10_000

