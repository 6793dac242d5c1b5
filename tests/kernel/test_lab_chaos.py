"""`drl-lab run chaos` as shipped: l3's data interface deleted and made again, all its incoming and
then all its outgoing gossip lost, a kill-loop, and gossip captured before its last start replayed
into it.  It exits 0 only when every fault's worst 1-s window is within its bound; and the evidence
that each fault did what it says is in result.json: the interface came back under a new index and
the agent moved there, the one-way rules dropped datagrams, the loop killed and restarted, and the
replayed datagrams went out and were refused as addressed to another life of l3."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drl.lab.netns import leftover_runs
from drl.lab.preflight import skip_reason

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
REASON = skip_reason() or (None if shutil.which("nft") else "needs nft (apt install nftables)")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRL_LAB = [sys.executable, "-c", "from drl.cli.lab import main; main()"]


def test_the_shipped_chaos_experiment_passes_its_own_checks(tmp_path):
    run = subprocess.run([*DRL_LAB, "run", "chaos", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=400)
    doc = json.loads((tmp_path / "result.json").read_text())
    worst = {f["label"]: f["worst_window_ratio"] for f in doc["faults"]}
    assert run.returncode == 0, f"{worst}\n" + run.stdout[-3000:] + run.stderr[-2000:]
    checks = doc["checks"]
    assert len(checks) == len(doc["faults"]) and all(c["result"] == "pass" for c in checks), checks

    faults = {f["action"] + (f" {f['label'].split()[3]}" if f["action"] == "loss" else ""): f for f in doc["faults"]}
    assert not any("error" in f or "skipped" in f for f in doc["faults"]), doc["faults"]
    for f in doc["faults"]:
        assert abs(f["applied_at_s"] - f["at_s"]) < 0.5, f

    recreate = faults["recreate"]
    assert recreate["iface"].endswith("l3-0") and recreate["reattached_at_s"] - recreate["at_s"] < 2.0
    log = "".join(p.read_text() for p in (tmp_path / "fps-1").glob("agent-l3*.log"))
    assert "iface_recreated" in log and f"new_ifindex={recreate['ifindex']}" in log

    assert faults["loss in"]["dropped_packets"] > 0 and faults["loss out"]["dropped_packets"] > 0
    assert any('oifname "' in r for r in faults["loss in"]["rules"])
    assert any('iifname "' in r for r in faults["loss out"]["rules"])

    loop = faults["kill-loop"]
    assert loop["kills"] == 10 and len(set(loop["pids"])) == 10 and loop["ready_at_s"] > 60

    replay = faults["replay"]
    assert replay["captured_from_life"] == "earlier" and replay["sent"] == replay["captured"] > 50
    assert set(replay["sent_by_source"]) == {"10.254.0.1", "10.254.0.2"}        # l1's and l2's datagrams
    # every one refused because it names an earlier life of l3 (the peers, long since hearing
    # the new life, add none of their own in that second)
    assert replay["rejected"].get("other_life", 0) >= replay["sent"], replay

    assert doc["run"] not in leftover_runs()     # nothing of the run is left: namespaces, state
