"""The Vagrant twin boots and measures: two limiter VMs from scripts/build-box.sh's box,
on a libvirtd of the test's own (in its own network namespace, lab/vagrant.py's
PrivateLibvirt), one FPS agent each sharing 10 Mbit/s between 1 and 3 TCP flows.

Both send to a third VM, the sink, on one isolated network (no traffic leaves the
test's VMs; a limiter's egress carries only its own flows, not the ACKs of the
other's, which FPS would count as flows too); a 20 ms netem delay on every VM gives
the flows the lab's 40 ms RTT (lab/experiments/baseline.toml).  QEMU emulates (TCG) unless
DRL_VAGRANT_TCG=0: this machine's /dev/kvm cannot boot a Debian kernel.  Takes minutes:
the box (built once, then cached in /var/cache/drl-test), two VMs booting, and bcc
compiling limiter.c in each.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from drl.lab.vagrant import VM_KEY, VM_SOCKET, PrivateLibvirt, VagrantCluster, build_box, vagrant_missing

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

GLOBAL_BPS = 10_000_000
FLOWS = {"l1": 1, "l2": 3}
ADDR = {"l1": "10.1.0.1", "l2": "10.1.0.2", "sink": "10.1.0.3"}
LIMITERS = ("l1", "l2")
WARMUP_S, MEASURE_S = 10, 30
# Under TCG an agent ticking every 100 ms (the default; the lab's 50 ms) took 78-84 % of its
# VM's one vCPU under this traffic, and at 50 ms the flows starved: 8.93-9.17 Mbit/s
# (bench/RESULTS.md "Agent cost").  At 200 ms they took 36-54 %.
INTERVAL = "200ms"


def topology() -> dict:
    """The JSON vagrant/topology.rb reads (the shape lab/vagrant.py's export writes)."""
    other = {"l1": "l2", "l2": "l1"}

    def agent(h):
        o = other[h]
        return {"iface_addr": ADDR[h], "argv": [
            "drl-agent", "up", "--iface", "{iface}", "--global", f"{GLOBAL_BPS}bit", "--allocator", "fps",
            "--node-id", h, "--socket", VM_SOCKET, "--listen", f"{ADDR[h]}:7470", "--peers", f"{o}@{ADDR[o]}:7470",
            "--key-file", VM_KEY, "--interval", INTERVAL, "--ewma", "0.1", "--burst", "75000"]}

    return {
        "experiment": "vmtest", "allocators": ["fps"], "rto_min": None, "events": [],
        "hosts": [{"name": h, "role": "limiter" if h in LIMITERS else "sink", "ctl_addr": None, "routes": [],
                   "links": [{"net": "link0", "addr": ADDR[h], "prefix": 24, "rate_bps": None,
                              "delay_ms": 20.0, "jitter_ms": 0.0, "loss_pct": 0}]} for h in ADDR],
        "agents": {"fps": {h: agent(h) for h in LIMITERS}},
        "traffic": [{"label": f"{h}:tcp", "client": h, "server": "sink",
                     "server_argv": ["iperf3", "-s", "-p", str(5201 + i)],
                     "client_argv": client_argv(h, i)} for i, h in enumerate(LIMITERS)],
    }


def client_argv(host: str, i: int) -> list[str]:
    return ["iperf3", "-c", ADDR["sink"], "-p", str(5201 + i), "-t", str(MEASURE_S), "-O", str(WARMUP_S),
            "-P", str(FLOWS[host]), "-C", "cubic", "-J"]


def agent_cpu_s(vms: VagrantCluster, host: str) -> float:
    """CPU seconds the agent on ``host`` has used so far (user + system, from /proc, in
    the guest's clock ticks)."""
    out = vms.run(host, "getconf CLK_TCK; sudo cat /proc/$(pgrep -o -f 'drl-agent up')/stat").stdout
    tck, stat = out.split("\n", 1)
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / int(tck)


@pytest.fixture(scope="session")
def box():
    """The box, built once per machine (keyed by its packages and drl's sources)."""
    reason = vagrant_missing()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    path = build_box()
    print(f"\nbox {path.name}: {time.monotonic() - t0:.0f} s")
    return path


def test_two_vms_share_the_limit_by_flow_count(box, tmp_path):
    work = Path(tempfile.mkdtemp(prefix="drl-vagrant-", dir="/var/tmp"))
    topo = work / "topology.json"
    topo.write_text(json.dumps(topology(), indent=1))
    tcg = os.environ.get("DRL_VAGRANT_TCG", "1") != "0"
    times = {}
    try:
        with open(tmp_path / "vagrant.log", "w") as log, PrivateLibvirt(work / "libvirt") as lv:
            vms = VagrantCluster(lv, work, box, topo, "fps", tcg=tcg, memory_mib=768, log=log)
            t0 = time.monotonic()
            try:
                vms.up()
            except Exception:
                pytest.fail(f"vagrant up failed:\n{(tmp_path / 'vagrant.log').read_text()[-4000:]}")
            times["up"] = time.monotonic() - t0
            for h in LIMITERS:
                times[f"agent {h}"] = vms.wait_agent(h)
            cpu0 = {h: agent_cpu_s(vms, h) for h in LIMITERS}
            t0 = time.monotonic()
            procs = {h: vms.popen(h, " ".join(client_argv(h, i)), stdout=open(work / f"{h}.json", "w"))
                     for i, h in enumerate(LIMITERS)}
            for h, p in procs.items():
                _, err = p.communicate(timeout=WARMUP_S + MEASURE_S + 120)
                assert p.returncode == 0, f"iperf3 on {h}: {err.decode()[-2000:]}"
            times["traffic"] = time.monotonic() - t0
            agent_cpu = {h: (agent_cpu_s(vms, h) - cpu0[h]) / times["traffic"] for h in LIMITERS}
        runs = {h: json.loads((work / f"{h}.json").read_text())["end"] for h in LIMITERS}
        rates = {h: runs[h]["sum_received"]["bits_per_second"] for h in LIMITERS}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lv.netns not in left, "the test's namespace outlived it"
    assert not lv.base.exists()
    total = sum(rates.values())
    shares = {h: r / total for h, r in rates.items()}
    print(f"times (s): {', '.join(f'{k} {v:.0f}' for k, v in times.items())}")
    print(f"aggregate {total / 1e6:.2f} Mbit/s, shares {', '.join(f'{h} {s:.3f}' for h, s in shares.items())}")
    # Under TCG a VM's one vCPU is the scarce thing: what the agent and iperf3 took of it.
    print("cpu: " + ", ".join(f"{h} agent {agent_cpu[h]:.0%} iperf3 {runs[h]['cpu_utilization_percent']['host_total']:.0f}%"
                              for h in LIMITERS))
    assert abs(total - GLOBAL_BPS) <= 0.1 * GLOBAL_BPS, (rates, times)
    for h, s in shares.items():
        want = FLOWS[h] / sum(FLOWS.values())
        assert abs(s - want) <= 0.1, (h, shares, times)
