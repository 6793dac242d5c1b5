"""The shipped fairness matrix (lab/experiments/fairness.toml), cut to what CI has time for:
unpaced iperf3 cubic in the agent's default mode (shape), 20 s a cell, on the file's 40-ms
path.  FPS with 1:3:6 flows on three hosts: every host within 0.05 of its share of the flows
and Jain over the flows >= 0.9; GDRL with identical loads on three hosts: every host within
0.05 of a third (10 % of it is 0.033; a run measured 0.322/0.316/0.361 over 20 s).  The full
matrix is a bench (bench/RESULTS.md "Fairness matrix")."""
from __future__ import annotations

import dataclasses

import pytest

from drl.lab.preflight import skip_reason
from drl.lab.registry import resolve
from drl.lab.runner import run_experiment

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
REASON = skip_reason()
if REASON:
    pytest.skip(REASON, allow_module_level=True)


@pytest.mark.parametrize("allocator, split", [("fps", "1:3:6"), ("gdrl", "1:1:1")])
def test_unpaced_cubic_in_the_default_mode_shares_as_the_allocator_promises(tmp_path, allocator, split):
    shipped = resolve("fairness").scaled(20.0)
    cut = dataclasses.replace(shipped.matrix, splits=(tuple(map(int, split.split(":"))),),
                              congestion_control=("cubic",), enforce=("default",))
    doc = run_experiment(dataclasses.replace(shipped, matrix=cut), tmp_path, allocators=[allocator], repeat=1)
    (row,) = doc["matrix"]
    print(row["cell"], allocator, row["shares"], row["jain_index"], row["time_to_share_s"])
    assert [c["result"] for c in row["checks"]] == ["pass"] * len(row["checks"]), row["checks"]
    assert len(row["checks"]) == (2 if allocator == "fps" else 1)
    assert (tmp_path / "matrix.png").stat().st_size > 0
    assert row["utilization"] >= 0.9, row["utilization"]
