"""drl-sim: list, run, and one-line errors."""
from __future__ import annotations

import json

from click.testing import CliRunner

from drl.cli.sim import main


def test_list_names_every_reproduction():
    out = CliRunner().invoke(main, ["list"])
    assert out.exit_code == 0
    for name in ("scale", "gdrl-graphs", "dqmp-crash", "dqmp-1000", "churn"):
        assert name in out.output


def test_run_writes_result_json_and_a_plot(tmp_path):
    out = CliRunner().invoke(main, ["run", "gdrl-graphs", "--limiters", "10", "--out", str(tmp_path), "-q"])
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["experiment"] == "gdrl-graphs"
    assert [(r["limiters"], r["degree"]) for r in result["rows"]] == [(10, 2), (10, 4), (10, 8)]
    assert min(r["jfi_final"] for r in result["rows"]) > 0.99
    assert (tmp_path / "fig7_gdrl.png").stat().st_size > 10_000


def test_unknown_experiment_is_one_line_and_exit_1(tmp_path):
    out = CliRunner().invoke(main, ["run", "nope", "--out", str(tmp_path)])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == ["error: unknown experiment 'nope' (choose from scale, "
                                               "gdrl-graphs, dqmp-crash, dqmp-1000, churn, envelope)"]


def test_bad_output_directory_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = CliRunner().invoke(main, ["run", "gdrl-graphs", "-n", "10", "--out", str(blocker / "sub"), "-q"])
    assert out.exit_code == 1
    assert out.output.startswith("error: cannot create output directory") and out.output.count("\n") == 1


def test_too_few_limiters_for_an_experiment_is_one_line(tmp_path):
    """gdrl-graphs' smallest graph is 2-regular: N = 2 had no graph, and plotting none crashed."""
    out = CliRunner().invoke(main, ["run", "gdrl-graphs", "-n", "2", "--out", str(tmp_path / "o"), "-q"])
    assert out.exit_code == 1 and out.output == "error: --limiters must be at least 3 for gdrl-graphs, got 2\n"
    assert not (tmp_path / "o").exists()
