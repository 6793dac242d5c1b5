"""The Vagrant twin, entered as a user would: ``drl-lab up`` boots two limiter VMs from
scripts/build-box.sh's box (on a libvirtd of the twin's own, in its own network
namespace: lab/vagrant.py PrivateLibvirt), ``drl-lab ssh`` runs ``drlctl status`` and
looks at the agent's unit, then iperf3 clients share 10 Mbit/s 1:3 through the two
FPS agents, and ``drl-lab down`` removes everything.

Each limiter sends to the other's iperf3 server on port 5201, and the one class is that
traffic (``proto=tcp,dport=5201``): a limiter's egress also carries the ACKs of the
other's flows, which a catch-all class would count as flows of its own.  No third VM as
a sink: under TCG two VMs boot on this machine's two cores in about two thirds of the
time three take.  A 20 ms netem delay on every VM's NIC gives the flows the lab's 40 ms
RTT (lab/experiments/baseline.toml).  QEMU emulates (TCG) unless DRL_VAGRANT_TCG=0:
this machine's /dev/kvm cannot boot a Debian kernel.  Takes minutes: the box (built
once, then cached in /var/cache/drl-test), the VMs booting, and bcc compiling limiter.c
in each.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from drl.agent.kernel.caps import REQUIRED
from drl.lab.agents import installed
from drl.lab.vagrant import VM_KEY, VM_SOCKET, vagrant_missing, vm_agent

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GLOBAL_BPS = 10_000_000
FLOWS = {"l1": 1, "l2": 3}
ADDR = {"l1": "10.1.0.1", "l2": "10.1.0.2"}
LIMITERS = ("l1", "l2")
OTHER = {"l1": "l2", "l2": "l1"}
PORT = 5201
# FPS settles in a few of its 200-ms ticks; 20 s judged is ~100 of them
WARMUP_S, MEASURE_S = 6, 20
# Under TCG an agent ticking every 100 ms (the default; the lab's 50 ms) took 78-84 % of its
# VM's one vCPU under this traffic, and at 50 ms the flows starved: 8.93-9.17 Mbit/s
# (bench/RESULTS.md "Agent cost").  At 200 ms they took 36-54 %.
INTERVAL = "200ms"


def topology() -> dict:
    """The JSON vagrant/topology.rb reads (the shape lab/vagrant.py's export writes)."""
    def agent(h):
        o = OTHER[h]
        return vm_agent(ADDR[h], [
            "drl-agent", "up", "--iface", "{iface}", "--global", f"{GLOBAL_BPS}bit", "--allocator", "fps",
            "--class", f"proto=tcp,dport={PORT}",
            "--node-id", h, "--socket", VM_SOCKET, "--listen", f"{ADDR[h]}:7470", "--peers", f"{o}@{ADDR[o]}:7470",
            "--key-file", VM_KEY, "--interval", INTERVAL, "--ewma", "0.1", "--burst", "75000"])

    return {
        "experiment": "vmtest", "allocators": ["fps"], "rto_min": None, "events": [],
        "hosts": [{"name": h, "role": "limiter", "ctl_addr": None, "routes": [],
                   "links": [{"net": "link0", "addr": ADDR[h], "prefix": 24, "rate_bps": None,
                              "delay_ms": 20.0, "jitter_ms": 0.0, "loss_pct": 0}]} for h in ADDR],
        "agents": {"fps": {h: agent(h) for h in LIMITERS}},
        "traffic": [{"label": f"{h}:tcp", "client": h, "server": OTHER[h],
                     "server_argv": ["iperf3", "-s", "-p", str(PORT)],
                     "client_argv": client_argv(h)} for h in LIMITERS],
    }


def client_argv(host: str) -> list[str]:
    return ["iperf3", "-c", ADDR[OTHER[host]], "-p", str(PORT), "-t", str(MEASURE_S), "-O", str(WARMUP_S),
            "-P", str(FLOWS[host]), "-C", "cubic", "-J"]


class Twin:
    """The drl-lab commands a user types, on a twin directory of the test's own."""

    def __init__(self, twin_dir: Path):
        self.dir = twin_dir
        self.lab = installed("drl-lab")

    def __call__(self, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([self.lab, *args[:1], "--twin-dir", str(self.dir), *args[1:]],
                              capture_output=True, text=True, timeout=timeout, **kw)

    def ssh(self, host: str, cmd: str, **kw) -> subprocess.CompletedProcess:
        out = self("ssh", host, "--", cmd, **kw)
        assert out.returncode == 0, f"drl-lab ssh {host} -- {cmd}: exit {out.returncode}\n{out.stderr[-2000:]}"
        return out

    def popen(self, host: str, cmd: str, stdout) -> subprocess.Popen:
        return subprocess.Popen([self.lab, "ssh", "--twin-dir", str(self.dir), host, "--", cmd],
                                stdout=stdout, stderr=subprocess.PIPE)


def unit_props(twin: Twin, host: str) -> dict[str, str]:
    props = "MainPID ActiveState User FragmentPath DropInPaths WatchdogUSec NoNewPrivileges ProtectSystem"
    out = twin.ssh(host, f"sudo systemctl show drl-agent.service {' '.join('-p ' + p for p in props.split())}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def agent_cpu_s(twin: Twin, host: str, pid: str) -> float:
    """CPU seconds the agent on ``host`` has used so far (user + system, from /proc)."""
    out = twin.ssh(host, f"getconf CLK_TCK; sudo cat /proc/{pid}/stat").stdout
    tck, stat = out.split("\n", 1)
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / int(tck)


def test_the_twin_comes_up_runs_the_shipped_unit_shares_by_flow_count_and_goes(tmp_path):
    reason = vagrant_missing()
    if reason:
        pytest.skip(reason)
    work = Path(tempfile.mkdtemp(prefix="drl-twin-", dir="/var/tmp"))
    topo = work / "topology.json"
    topo.write_text(json.dumps(topology(), indent=1))
    twin = Twin(work / "twin")
    times = {}
    try:
        t0 = time.monotonic()
        up = twin("up", str(topo), "--on", "vagrant", "--allocator", "fps", timeout=2400)
        times["up"] = time.monotonic() - t0
        assert up.returncode == 0, f"drl-lab up exited {up.returncode}:\n{up.stderr[-4000:]}"
        print(up.stderr)

        status = twin.ssh("l1", "sudo drlctl status").stdout
        assert "l2" in status and "alive" in status, status
        doc = json.loads(twin.ssh("l2", "sudo drlctl status --json").stdout)
        assert [p["state"] for p in doc["peers"]] == ["alive"], doc["peers"]

        shipped = (ROOT / "systemd" / "drl-agent.service").read_text()
        pids = {}
        for h in LIMITERS:
            props = unit_props(twin, h)
            assert props["ActiveState"] == "active" and props["User"] == "drl", props
            assert props["FragmentPath"] == "/etc/systemd/system/drl-agent.service", props
            assert twin.ssh(h, "cat /etc/systemd/system/drl-agent.service").stdout == shipped
            # the one drop-in: bcc's compile under TCG outlasts the unit's start timeout
            assert props["DropInPaths"] in ("", "/etc/systemd/system/drl-agent.service.d/slow-start.conf"), props
            assert props["WatchdogUSec"] == "10s" and props["NoNewPrivileges"] == "yes", props
            fields = dict(line.split(":", 1) for line in
                          twin.ssh(h, f"cat /proc/{props['MainPID']}/status").stdout.splitlines())
            want = sum(1 << bit for bit in REQUIRED.values())
            assert int(fields["CapEff"], 16) == want and int(fields["CapBnd"], 16) == want, fields
            assert fields["Uid"].split()[0] != "0", fields["Uid"]
            pids[h] = props["MainPID"]

        cpu0 = {h: agent_cpu_s(twin, h, pids[h]) for h in LIMITERS}
        t0 = time.monotonic()
        procs = {h: twin.popen(h, " ".join(client_argv(h)), stdout=open(work / f"{h}.json", "w"))
                 for h in LIMITERS}
        for h, p in procs.items():
            _, err = p.communicate(timeout=WARMUP_S + MEASURE_S + 120)
            assert p.returncode == 0, f"iperf3 on {h}: {err.decode()[-2000:]}"
        times["traffic"] = time.monotonic() - t0
        agent_cpu = {h: (agent_cpu_s(twin, h, pids[h]) - cpu0[h]) / times["traffic"] for h in LIMITERS}
        runs = {h: json.loads((work / f"{h}.json").read_text())["end"] for h in LIMITERS}
    finally:
        t0 = time.monotonic()
        gone = twin("down", timeout=300)
        times["down"] = time.monotonic() - t0
        subprocess.run(["rm", "-rf", str(work)])
    assert gone.returncode == 0 and "destroyed" in gone.stdout, gone.stdout + gone.stderr
    assert not twin.dir.exists()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "drltw" not in left, f"the twin's namespace outlived it: {left}"
    rates = {h: runs[h]["sum_received"]["bits_per_second"] for h in LIMITERS}
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
