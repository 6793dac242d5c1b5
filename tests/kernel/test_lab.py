"""The lab on real namespaces: build and complete teardown (also when interrupted or killed),
and one short experiment end to end with real agents and iperf3."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drl.lab.netns import Lab, clean, leftover_runs, poll
from drl.lab.preflight import skip_reason
from drl.lab.registry import resolve
from drl.lab.topology import plan

pytestmark = pytest.mark.kernel
REASON = skip_reason()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRL_LAB = [sys.executable, "-c", "from drl.cli.lab import main; main()"]


def traces(run: str) -> dict:
    """Everything on the machine that carries the run's name."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {"netns": [l for l in netns.splitlines() if l.startswith(run + "-")],
            "links": [l for l in links.splitlines() if run in l],
            "state": (Path("/run/drl-lab") / run).exists()}


NOTHING = {"netns": [], "links": [], "state": False}


@pytest.fixture
def bottleneck_plan():
    p = plan(resolve("bottleneck"))
    yield p
    from drl.lab.netns import remove_run
    remove_run(p.run)  # whatever a failing test left


def test_builder_builds_and_removes_everything(bottleneck_plan, tmp_path):
    p = bottleneck_plan
    exp = p.exp
    with Lab(p) as lab:
        assert len(traces(p.run)["netns"]) == len(p.namespaces)
        lab.spawn("sink", ["iperf3", "-s", "-1"])
        assert poll(lambda: lab.host("sink").listening(5201), 5), "iperf3 server never listened"
        link = next(l for l in exp.links if set(l.ends) == {"s2", "l2"})
        lab.apply(p.shaping_commands(link, 2e6 / 8))
        qdiscs = subprocess.run(["tc", "-n", p.ns("l2"), "qdisc", "show"], capture_output=True, text=True).stdout
        assert "tbf" in qdiscs
        res = subprocess.run(["ip", "netns", "exec", p.ns("s2"), "iperf3", "-c", p.address("sink"), "-t", "2", "-J"],
                             capture_output=True, text=True, timeout=30)
        # a source behind a limiter reaches the sink through the router, shaped by the new bottleneck
        got_bps = json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"]
        assert 1.0e6 < got_bps < 2.6e6
        # the web workload: server at l2 (responses cross its egress), fetching client at the sink
        lab.spawn("l2", [sys.executable, "-m", "drl.lab.web", "serve", "--port", "5300"])
        assert poll(lambda: lab.host("l2").listening(5300), 5), "web server never listened"
        report = tmp_path / "web.json"
        subprocess.run(["ip", "netns", "exec", p.ns("sink"), sys.executable, "-m", "drl.lab.web", "fetch",
                        "--server", f"{p.address('l2')}:5300", "--arrivals", "20", "--mean-size", "20000",
                        "--duration", "2", "--out", str(report)], cwd=ROOT, check=True, timeout=30)
        transfers = json.loads(report.read_text())["transfers"]
        assert len(transfers) > 10 and sum(t["completed"] for t in transfers) >= 0.9 * len(transfers)
        pids = [proc.pid for proc in lab.procs]
    assert traces(p.run) == NOTHING
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)


def _lab_in_child(run_plan_code: str) -> subprocess.Popen:
    code = ("import sys, time\nfrom lab.netns import Lab\nfrom lab.registry import resolve\nfrom lab.topology import plan\n"
            f"p = plan(resolve('baseline'), run={run_plan_code!r})\n"
            "with Lab(p) as lab:\n"
            "    lab.spawn('sink', ['sleep', '300'])\n"
            "    print('built', flush=True)\n"
            "    time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "built"
    return proc


def test_interrupted_lab_tears_down():
    from drl.lab.topology import new_run
    run = new_run()
    proc = _lab_in_child(run)
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        assert traces(run) == NOTHING
    finally:
        proc.kill()
        from drl.lab.netns import remove_run
        remove_run(run)


def test_clean_removes_a_killed_runs_leftovers_and_keeps_live_ones():
    from drl.lab.topology import new_run
    dead, live = new_run("xt"), new_run()    # a test's prefix: found by its state in /run/drl-lab
    victim, survivor = _lab_in_child(dead), _lab_in_child(live)
    try:
        victim.kill()  # SIGKILL: no teardown at all
        victim.wait()
        assert traces(dead)["netns"]
        assert leftover_runs()[dead] is False and leftover_runs()[live] is True
        removed, running = clean()
        assert dead in removed and live in running
        assert traces(dead) == NOTHING
        assert traces(live)["netns"], "clean must not touch a run whose drl-lab is alive"
    finally:
        for proc in (victim, survivor):
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        from drl.lab.netns import remove_run
        remove_run(dead)
        remove_run(live)
    assert traces(live) == NOTHING


@pytest.mark.slow
def test_short_baseline_runs_end_to_end(tmp_path):
    """FPS then CTB on the baseline squeezed to 12 s; result.json holds sane values."""
    out = tmp_path / "baseline"
    host_state = {f: f.stat().st_mtime_ns for f in Path("/var/lib/drl").glob("*-l[12]*.json")}
    res = subprocess.run([*DRL_LAB, "run", "baseline", "--allocator", "fps", "--allocator", "ctb",
                          "--duration", "12s", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((out / "result.json").read_text())
    assert [r["allocator"] for r in doc["runs"]] == ["fps", "ctb"]
    for run in doc["runs"]:
        assert run["experiment"] == "baseline" and run["global_limit_bps"] == 10e6 and run["duration_s"] == 12
        assert 0.7 < run["utilization"] < 1.3, run["utilization"]
        assert run["aggregate_bps"] == pytest.approx(run["utilization"] * 10e6)
        assert 0.5 < run["jain_index"] <= 1.0
        assert [l["name"] for l in run["limiters"]] == ["l1", "l2"]
        assert [l["flows"] for l in run["limiters"]] == [3, 7]
        assert sum(l["share"] for l in run["limiters"]) == pytest.approx(1.0)
        assert len(run["flows"]) == 10 and all(f["mean_bps"] > 0 for f in run["flows"])
        assert len(run["series"]["aggregate_bps"]) == 120
    for png in ("timeseries.png", "utilization.png", "flows.png"):
        assert (out / png).stat().st_size > 1000
    assert not [r for r in leftover_runs() if r in {run["run"] for run in doc["runs"]}]
    # the lab's agents keep their limits and state in the run, not in this host's agent's dir
    assert {f: f.stat().st_mtime_ns for f in Path("/var/lib/drl").glob("*-l[12]*.json")} == host_state


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupting_a_run_leaves_nothing(tmp_path, sig):
    proc = subprocess.Popen([*DRL_LAB, "run", "baseline", "--allocator", "fps", "--duration", "30s",
                             "--out", str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    run = None
    for line in proc.stderr:
        if "(run lb" in line:
            run = line.split("(run ")[1][:6]
        if "t=" in line and run:
            break
    assert run, "the run never started"
    proc.send_signal(sig)
    proc.wait(60)
    assert proc.returncode == 130
    assert traces(run) == NOTHING
    # agents carry the run prefix in their argv (interface, socket): none may survive
    assert subprocess.run(["pgrep", "-f", f"/run/drl-lab/{run}/"], capture_output=True).returncode == 1
