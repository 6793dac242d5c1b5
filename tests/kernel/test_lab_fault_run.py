"""[[fault]] through the real runner: a short experiment (2 limiters, 20 s) kills an agent and
restarts it, puts 30 % loss on gossip and 20 % on one limiter's data link, then heals.  Watched from
outside while it runs: the killed pid is gone, the restarted one is a drl-agent, the nft rules are
in the run's namespaces while the loss lasts and gone after heal; result.json has the faults."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drl.lab.netns import leftover_runs, poll
from drl.lab.preflight import skip_reason

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
REASON = skip_reason() or (None if shutil.which("nft") else "needs nft (apt install nftables)")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRL_LAB = [sys.executable, "-c", "from drl.cli.lab import main; main()"]

EXPERIMENT = """\
[experiment]
name = "faults-short"
duration = "20s"
warmup = "3s"
global = "20mbit"
rto_min = "10ms"
congestion_control = "cubic"
allocators = ["fps"]

[agent]
interval = "50ms"

[checks]
max_window_ratio = 3      # loose: this test is about the machinery, not the agent's numbers

[hosts]
l1 = "limiter"
l2 = "limiter"
sw = "router"
sink = "sink"

[[link]]
ends = ["l1", "sw"]
[[link]]
ends = ["l2", "sw"]
[[link]]
ends = ["sw", "sink"]

[[traffic]]
kind = "tcp"
from = "l1"
flows = 1
[[traffic]]
kind = "tcp"
from = "l2"
flows = 3

[[fault]]
at = "4s"
action = "kill"
agent = "l2"
[[fault]]
at = "7s"
action = "restart"
agent = "l2"
[[fault]]
at = "12s"
action = "loss"
percent = 30
on = "gossip"
[[fault]]
at = "14s"
action = "loss"
percent = 20
on = "data"
hosts = ["l1"]
[[fault]]
at = "17s"
action = "heal"
"""


def is_agent(pid: int, node: bytes) -> bool:
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return any(b"drl-agent" in a for a in cmdline) and node in cmdline


def nft_tables(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True).stdout


def nft_table(ns: str, family: str, table: str) -> str:
    res = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", family, table],
                         capture_output=True, text=True)
    return res.stdout


def test_faults_are_applied_and_removed(tmp_path):
    exp = tmp_path / "faults-short.toml"
    exp.write_text(EXPERIMENT)
    out = tmp_path / "out"
    proc = subprocess.Popen([*DRL_LAB, "run", str(exp), "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run, seen, lines = None, {}, []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "(run lb" in line:
                run = line.split("(run ")[1][:6]
            if "fault:" not in line:
                continue
            table, what = f"drl_{run}", line.split("fault: ")[1].strip()
            if what.startswith("kill l2"):
                pid = int(what.split("pid ")[1].rstrip(")"))
                seen["killed"] = pid
                assert not Path(f"/proc/{pid}").exists(), "the killed agent still runs"
            elif what.startswith("restart l2"):
                pid = int(what.split("pid ")[1].rstrip(")"))
                seen["restarted"] = pid
                # `ip netns exec` execs the agent a moment after the lab reports the restart
                assert poll(lambda: is_agent(pid, b"l2"), 5.0), Path(f"/proc/{pid}/cmdline").read_bytes()
            elif what.startswith("loss 30% gossip"):
                rules = nft_table(f"{run}-ctl", "bridge", table)
                assert "udp dport 7470 numgen random mod 100 < 30" in rules, rules
                seen["gossip"] = True
            elif what.startswith("loss 20% data"):
                # both ends of l1's link drop what arrives on it; the old gossip loss stays
                assert 'iifname "' + f"{run}l1-0" + '" numgen random mod 100 < 20' in nft_table(f"{run}-l1", "inet", table)
                assert f"{run}sw-0" in nft_table(f"{run}-sw", "inet", table)
                assert "table inet" not in nft_tables(f"{run}-l2")
                assert "mod 100 < 30" in nft_table(f"{run}-ctl", "bridge", table)
                seen["data"] = True
            elif what.startswith("heal"):
                for host in ("ctl", "l1", "l2", "sw", "sink"):
                    assert table not in nft_tables(f"{run}-{host}"), host
                seen["heal"] = True
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    assert proc.returncode == 0, "".join(lines[-20:]) + proc.stdout.read()
    assert set(seen) == {"killed", "restarted", "gossip", "data", "heal"}, seen

    doc = json.loads((out / "result.json").read_text())
    faults = doc["faults"]
    assert [f["action"] for f in faults] == ["kill", "restart", "loss", "loss", "heal"]
    kill, restart, gossip, data, heal = faults
    assert kill["pid"] == seen["killed"] and kill["exit_status"] == -9
    assert restart["pid"] == seen["restarted"] and 7 < restart["ready_at_s"] < 20   # answered status again
    assert gossip["dropped_packets"] > 0 and data["dropped_packets"] > 0
    for f in faults:
        assert abs(f["applied_at_s"] - f["at_s"]) < 0.5
        assert f["worst_window_ratio"] > 0.5 and f["recovery_s"] is not None
    assert {c["check"] for c in doc["checks"]} == {"max_window_ratio"}
    assert all(c["result"] == "pass" for c in doc["checks"])
    assert len(doc["window_ratios_1s"]) == 19   # whole seconds before the last sample (just before 20 s)
    assert (out / "timeseries.png").stat().st_size > 1000
    assert "kill l2" in (out / "fps-1" / "faults.log").read_text()
    # nothing of the run is left: namespaces (and so their tables), state, agents
    assert run not in leftover_runs()
    assert run not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"drl_{run}" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert subprocess.run(["pgrep", "-f", f"/run/drl-lab/{run}/"], capture_output=True).returncode == 1


def test_the_shipped_faults_experiment_passes_its_own_checks(tmp_path):
    """`drl-lab run faults` as shipped: kill, restart, stop, cont, gossip loss, partition,
    heal; it exits 0 only when every fault's worst 1-s window is <= 105 % of the limit
    and the limit is used again within 3 s (a partition: 4 s; the gossip loss, which lasts
    until its heal: before it)."""
    run = subprocess.run([*DRL_LAB, "run", "faults", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    checks = json.loads((tmp_path / "result.json").read_text())["checks"]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert checks and all(c["result"] in ("pass", "skipped") for c in checks), checks
