"""``drl-sim run envelope`` at 1,000 limiters (about 60 s; the fast cases at 30 are in
tests/unit/sim/test_sim_envelope.py): the envelope of every phase, and that the promise
G x T + D holds while a third of the limiters go busy, idle and busy again, with gossip branching
3 and the agent's sum tree (agent/gossip/tree.py; per-peer gossip alone broke it: start-up 1.755,
restart 1.390, bench/RESULTS.md "envelope by gossip branching")."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from drl.agent import burst
from drl.cli.sim import main
from drl.sim import envelope as env



@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    """The 1,000-limiter run (about 60 s): a third busy, a third busy-idle-busy, a third idle."""
    out = tmp_path_factory.mktemp("envelope1000")
    res = CliRunner().invoke(main, ["run", "envelope", "--limiters", "1000", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((out / "result.json").read_text())["rows"]
    return row


@pytest.mark.slow
def test_1000_limiters_report_the_envelope_of_every_phase(thousand):
    phases = thousand["envelopes"]
    assert (thousand["busy"], thousand["busy_idle_busy"], thousand["idle"]) == (333, 334, 333)
    assert thousand["envelope"]["budget_bytes"] == burst.budget(env.GLOBAL_Bps, 1000, "police")
    assert all(p["ratio"] is not None and p["ratio"] <= phases["whole"]["ratio"] + 1e-9 for p in phases.values())
    assert phases["idle"]["ratio"] <= 1.0          # two thirds silent: nothing to exceed with


@pytest.mark.slow
def test_1000_limiters_keep_the_envelope(thousand):
    assert thousand["sum_tree"] and thousand["branching"] == 3
    assert thousand["envelope"]["ratio"] <= 1.0, thousand["envelopes"]
