"""`drl-lab run envelope` as shipped: three FPS limiters at the agent's default (shaped), cubic
and BBR on each, busy, all stopped, 10 s idle, all started at once, a kill and restart, a
partition and its heal.  It exits 0 only when no window of >= 1 s carried more than G x T + D,
D the class's burst budget (agent/burst.py), over the whole run and within every fault's horizon."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drl.agent import burst
from drl.lab.preflight import skip_reason

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
REASON = skip_reason() or (None if shutil.which("nft") else "needs nft (apt install nftables)")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRL_LAB = [sys.executable, "-c", "from drl.cli.lab import main; main()"]


def test_the_shipped_envelope_experiment_keeps_the_promise(tmp_path):
    run = subprocess.run([*DRL_LAB, "run", "envelope", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=400)
    doc = json.loads((tmp_path / "result.json").read_text())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert doc["envelope"]["budget_bytes"] == burst.budget(30e6 / 8, 3, "shape")
    whole = [c for c in doc["checks"] if c["fault"] == "whole run"]
    assert [c["check"] for c in whole] == ["max_envelope_ratio"] and whole[0]["value"] <= 1.0
    assert len(doc["checks"]) == 5 and all(c["result"] in ("pass", "skipped") for c in doc["checks"]), doc["checks"]
    # the measurement itself: the sink's counter was read on time nearly always
    assert doc["sink_reads"]["dropped_slow"] < 0.05 * doc["sink_reads"]["count"], doc["sink_reads"]
