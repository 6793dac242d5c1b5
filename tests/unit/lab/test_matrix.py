"""The fairness matrix's pure parts (lab/matrix.py, the [matrix] table of lab/reader.py): cells,
scores, checks and the table drlctl-lab prints; the runs themselves are
tests/kernel/test_lab_fairness.py's."""
from __future__ import annotations

import pytest

from drl.cli.lab import failed_checks, render_matrix
from drl.lab import matrix
from drl.lab.reader import SpecError, loads
from drl.lab.registry import resolve
from drl.lab.spec import Matrix

BASE = '''
[experiment]
name = "m"
duration = "20s"
global = "12mbit"
allocators = ["fps"]
[agent]
enforce = "police"
interval = "50ms"
[hosts]
l1 = "limiter"
sw = "router"
sink = "sink"
[[link]]
ends = ["l1", "sw"]
[[link]]
ends = ["sw", "sink"]
delay = "20ms"
[[traffic]]
kind = "tcp"
from = "l1"
'''


def with_matrix(body: str) -> str:
    return BASE + "[matrix]\n" + body


def test_the_shipped_fairness_matrix_reads_and_makes_its_cells():
    exp = resolve("fairness")
    cells = matrix.cells(exp)
    m = exp.matrix
    assert len(cells) == len(m.splits) * len(m.congestion_control) * len(m.enforce) >= 8
    first = cells[0]
    assert first.label == "1:3:6 cubic default" and first.exp.matrix is None
    assert [(t.src, t.flows, t.congestion_control) for t in first.exp.traffic] == \
        [("l1", 1, "cubic"), ("l2", 3, "cubic"), ("l3", 6, "cubic")]
    four = next(c for c in cells if len(c.split) == 4)
    assert four.exp.limiters == ["l1", "l2", "l3", "l4"]
    assert {l.ends for l in four.exp.links} >= {("l4", "sw"), ("sw", "sink")}
    assert next(l for l in four.exp.links if l.ends == ("sw", "sink")).delay_s == 0.02   # the file's path


def test_a_cell_keeps_the_files_agent_options_but_its_enforcement():
    exp = loads(with_matrix('splits = ["2:1"]\ncongestion_control = ["bbr"]\nenforce = ["default", "shape"]\n'))
    default, shape = matrix.cells(exp)
    assert default.exp.agent == {"interval": "50ms"}                     # the agent's own choice
    assert shape.exp.agent == {"interval": "50ms", "enforce": "shape"}
    assert default.exp.congestion_control == "bbr" and default.exp.duration_s == 20.0


@pytest.mark.parametrize("body, said", [
    ('splits = ["1:0"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n', "'1:0'"),
    ('splits = ["1:2:3:4:5:6:7:8:9"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n', "1-8 limiters"),
    ('splits = ["1:65"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n', "1-64 flows"),
    ('splits = ["a:b"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n', "'a:b'"),
    ('splits = []\ncongestion_control = ["cubic"]\nenforce = ["default"]\n', "non-empty"),
    ('splits = ["1:1"]\ncongestion_control = ["cubic"]\nenforce = ["tbf"]\n', "default, shape, police"),
    ('splits = ["1:1"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\nmin_jain = 2\n', "out of range"),
    ('splits = ["1:1"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\nhosts = 3\n', "unknown field"),
])
def test_a_bad_matrix_is_one_line_naming_the_field(body, said):
    with pytest.raises(SpecError) as e:
        loads(with_matrix(body))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_matrix_needs_a_router():
    text = with_matrix('splits = ["1"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n')
    text = text.replace('sw = "router"', 'sw = "source"')
    with pytest.raises(SpecError, match="role 'router'"):
        loads(text)


def run(allocator: str, shares: list[float], jain: float | None, series: list[list[float]]) -> dict:
    names = [f"l{i + 1}" for i in range(max(len(shares), len(series)))]
    return {"allocator": allocator, "repeat": 1, "jain_index": jain,
            "limiters": [{"name": n, "share": s} for n, s in zip(names, shares or [0.0] * len(names))],
            "utilization": 0.99, "global_limit_bps": 12e6,
            # the series in another order than the limiters: matched by name
            "series": {"dt_s": 0.1, "limiters_bps": dict(reversed(list(zip(names, series))))}}


M = Matrix(((1, 3),), ("cubic",), ("default",), max_share_error=0.05, min_jain=0.95)


def test_fps_is_scored_against_the_flows_and_another_allocator_against_the_even_split():
    series = [[3e6] * 50, [9e6] * 50]
    fps = matrix.score(run("fps", [0.26, 0.74], 0.97, series), (1, 3), M)
    assert fps["ideal"] == [0.25, 0.75] and fps["max_share_error"] == pytest.approx(0.01)
    assert [c["result"] for c in fps["checks"]] == ["pass", "pass"]
    gdrl = matrix.score(run("gdrl", [0.26, 0.74], 0.80, series), (1, 3), M)
    assert gdrl["ideal"] == [0.5, 0.5] and gdrl["max_share_error"] == pytest.approx(0.24)
    assert [(c["check"], c["result"]) for c in gdrl["checks"]] == [("max_share_error", "fail")]   # no Jain bound


def test_time_to_share_is_when_the_slowest_limiter_first_had_its_second_at_090():
    ideal = [0.25, 0.75]
    ramp = [0.0] * 20 + [3e6] * 30                          # l1 at its 3 Mbit/s from 2.0 s
    late = [0.0] * 30 + [8.2e6] * 20                        # l2 at 0.91 of its 9 Mbit/s from 3.0 s
    assert matrix.time_to_share(run("fps", [], 1.0, [ramp, late]), ideal) == 4.0
    never = [8.0e6] * 50                                    # 0.89 of 9 Mbit/s: never
    assert matrix.time_to_share(run("fps", [], 1.0, [ramp, never]), ideal) is None


def test_a_matrix_is_refused_on_vagrant_in_one_line():
    from click.testing import CliRunner
    from drl.cli.lab import main
    res = CliRunner().invoke(main, ["run", "fairness", "--on", "vagrant"])
    assert res.exit_code == 2 and "run it with --on netns" in res.output and "Traceback" not in res.output


def test_the_table_and_the_failed_checks_read_as_bounds():
    row = {"cell": "1:3 cubic default", "allocator": "fps", "repeat": 1,
           **matrix.score(run("fps", [0.35, 0.65], 0.83, [[3e6] * 20, [9e6] * 20]), (1, 3), M)}
    table = render_matrix({"matrix": [row]})
    assert "0.35(0.25) 0.65(0.75)" in table and "0.100" in table and "0.830" in table
    failed = failed_checks({"runs": [{"allocator": "fps", "repeat": 1,
                                      "checks": [{**c, "fault": row["cell"]} for c in row["checks"]]}]})
    assert failed == [f"fps-1: 1:3 cubic default max_share_error {row['max_share_error']} > 0.05",
                      "fps-1: 1:3 cubic default min_jain 0.83 < 0.95"]


def test_run_matrix_keeps_a_cells_own_checks_and_writes_its_table_and_plot(tmp_path):
    exp = loads(with_matrix('splits = ["1:3", "1:1"]\ncongestion_control = ["cubic"]\nenforce = ["default"]\n'
                            'max_share_error = 0.05\n'))
    seen = []

    def run_cell(cexp, out, allocators, repeat, progress):
        seen.append((cexp.name, cexp.limiters, out.name))
        own = {"check": "max_envelope_ratio", "value": 0.9, "bound": 1.0, "result": "pass", "fault": "run"}
        shares = [0.25, 0.75] if cexp.name.endswith("1-3-cubic-default") else [0.4, 0.6]
        return {"runs": [{**run("fps", shares, 0.99, [[3e6] * 20, [9e6] * 20]), "checks": [own]}]}

    doc = matrix.run_matrix(exp, tmp_path, None, None, lambda line: None, run_cell)
    assert seen == [("m-1-3-cubic-default", ["l1", "l2"], "m-1-3-cubic-default"),
                    ("m-1-1-cubic-default", ["l1", "l2"], "m-1-1-cubic-default")]
    assert [r["cell"] for r in doc["matrix"]] == ["1:3 cubic default", "1:1 cubic default"]
    assert [c["check"] for c in doc["runs"][1]["checks"]] == ["max_envelope_ratio", "max_share_error"]
    assert failed_checks(doc) == [f"fps-1: 1:1 cubic default max_share_error {doc['matrix'][1]['max_share_error']} > 0.05"]
    assert (tmp_path / "result.json").exists() and (tmp_path / "matrix.png").stat().st_size > 0
