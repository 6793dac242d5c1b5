"""``drl-sim run churn`` (sim/churn.py) at a small N: 10 % leave, 10 % join, the limit holds."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from drl.agent.allocators.gdrl import PARTS
from drl.cli.sim import main
from drl.sim.churn import plan


def test_plan_has_ten_percent_leaves_and_joins_half_of_them_rejoins():
    churn = plan(1000, seed=1)
    assert len(churn.leaves) == 100 and len(churn.joins) == 100
    leavers = {i for _, i in churn.leaves}
    rejoins = [(t, i) for t, i in churn.joins if i < 1000]
    assert len(rejoins) == 50 and {i for _, i in rejoins} <= leavers
    left_at = {i: t for t, i in churn.leaves}
    assert all(t > left_at[i] for t, i in rejoins)               # back only after it left
    assert all(0 <= t <= 60 for t, _ in churn.leaves + churn.joins)
    assert churn.universe == 1050


@pytest.mark.slow
def test_churn_at_40_limiters_stays_within_5_percent(tmp_path):
    out = CliRunner().invoke(main, ["run", "churn", "--limiters", "40", "--out", str(tmp_path), "-q"])
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "result.json").read_text())
    rows = {r["allocator"]: r for r in result["rows"]}
    assert set(rows) == {"fps", "gdrl"}
    for row in rows.values():
        assert (row["leaves"], row["joins_new"], row["rejoins"]) == (4, 2, 2)
        assert row["members_min"] < 40 and row["within_5pct"], row["aggregate_over_limit"]
        assert len(row["series"]["aggregate_bps"]) == len(row["series"]["members"]) == 80
        assert row["envelope"]["ratio"] <= 1.0       # no window of >= 1 s beyond G x T + D
    assert result["claims"]["fps_within_5pct"] and result["claims"]["gdrl_within_5pct"]
    gdrl = rows["gdrl"]     # sum C_i <= C at every tick, and exactly C (with what is in flight) at the end
    assert gdrl["limit_sum_over_limit_max"] <= 1.0 and gdrl["accountable_sum_final_parts"] == PARTS
    assert (tmp_path / "churn.png").stat().st_size > 10_000
