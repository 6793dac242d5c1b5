"""Export an experiment as the JSON topology the Vagrant twin reads (vagrant/Vagrantfile).

    python -m drl.lab.vagrant baseline            # print it
    python -m drl.lab.vagrant --write-all         # refresh vagrant/topologies/*.json

The JSON comes from the lab's own reader and planner (lab/reader.py,
lab/topology.py, lab/agents.py, lab/traffic.py), so a VM gets exactly the
addresses, routes, shaping, agent options and traffic commands that the
namespace lab uses; tests/unit/lab/test_lab_vagrant.py checks the shipped files
are current and that vagrant/topology.rb reads them back the same.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from drl.agent.units import to_bps

from .agents import agent_argv, unit_config
from .wheels import build_wheelhouse
from .registry import builtin, resolve
from .spec import REFERENCE, Experiment
from .topology import plan as make_plan
from .traffic import place

TOPOLOGIES = Path(__file__).resolve().parent.parent / "vagrant" / "topologies"
VM_KEY = "/etc/drl/cluster.key"
VM_SOCKET = "/run/drl/agent.sock"
VM_OUT = Path("/var/tmp/drl")
IFACE = "{iface}"  # the VM's NIC carrying the agent's address; provision.sh fills it in


def export(exp: Experiment) -> dict:
    spread, central = make_plan(exp, run="lb0000"), make_plan(exp, run="lb0000", central=True)
    hosts = []
    for name, role in exp.hosts.items():
        links = [{"net": f"link{i}", "addr": end.addr, "prefix": 24,
                  "rate_bps": to_bps(v.link.rate_Bps) if v.link.rate_Bps else None, **_impairment(v.link)}
                 for i, v in enumerate(spread.veths) for end in (v.a, v.b) if end.host == name]
        hosts.append({"name": name, "role": role, "links": links,
                      "ctl_addr": spread.ctl_address(name) if role == "limiter" and spread.ctl else None,
                      "routes": [{"dst": r.dst, "via": r.via} for r in spread.routes if r.host == name]})
    agents = {}
    for alloc in exp.allocators:
        p = central if alloc == REFERENCE else spread
        agents[alloc] = {h: vm_agent(iface.addr, agent_argv(p, h, alloc, VM_KEY, VM_SOCKET, iface=IFACE))
                         for h, iface in p.agent_ifaces().items()}
    traffic = [{"label": g.label, "server": g.server_host, "client": g.client_host,
                "server_argv": g.server_argv(VM_OUT, python="python3"),
                "client_argv": g.client_argv(VM_OUT, python="python3"),
                "start_s": g.traffic.start_s, "stop_s": g.traffic.stop_s}
               for g in place(spread)]
    events = [{"at_s": e.at_s, "link": list(e.link), "rate_bps": to_bps(e.rate_Bps)} for e in exp.events]
    return {"experiment": exp.name, "description": exp.description, "global_bps": to_bps(exp.global_Bps),
            "duration_s": exp.duration_s, "allocators": list(exp.allocators),
            "rto_min": spread.rto_min,
            "hosts": hosts, "agents": agents, "traffic": traffic, "events": events}


def vm_agent(iface_addr: str, argv: list[str]) -> dict:
    """A VM's agent: the address of the NIC it limits, its command line, and that command as
    the drl.toml the shipped unit (systemd/drl-agent.service) runs with."""
    return {"iface_addr": iface_addr, "argv": argv, "config": unit_config(argv)}


def _impairment(link) -> dict:
    """A link's delay, jitter and loss for netem on the VMs' NICs (VMs have sch_netem: no delay
    line there); absent on links without them, so files without delay export as before."""
    if not link.impaired:
        return {}
    return {"delay_ms": round((link.delay_s or 0) * 1e3, 3), "jitter_ms": round((link.jitter_s or 0) * 1e3, 3),
            "loss_pct": link.loss_pct or 0}


REPO = Path(__file__).resolve().parent.parent
VAGRANT_DIR = REPO / "vagrant"
BUILD_BOX = REPO / "scripts" / "build-box.sh"
# libvirtd's own state: bind-mounted over by a private libvirtd (PrivateLibvirt)
LIBVIRT_DIRS = {"etc": "/etc/libvirt", "lib": "/var/lib/libvirt", "run": "/run/libvirt",
                "log": "/var/log/libvirt", "cache": "/var/cache/libvirt"}


def vagrant_missing() -> str | None:
    """Why this machine cannot boot the VM lab with libvirt (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (libvirtd, network namespaces, debootstrap)"
    for tool in ("vagrant", "libvirtd", "virsh", "qemu-system-x86_64", "debootstrap", "qemu-img", "ip", "unshare"):
        if not shutil.which(tool):
            return f"needs {tool} (scripts/setup.sh installs it)"
    plugins = subprocess.run(["vagrant", "plugin", "list"], capture_output=True, text=True).stdout
    if "vagrant-libvirt" not in plugins:
        return "needs the vagrant-libvirt plugin (Debian's vagrant-libvirt)"
    return None


def build_box(log=None) -> Path:
    """The box of scripts/build-box.sh (built once, then cached); its path."""
    out = subprocess.run(["bash", str(BUILD_BOX)], check=True, stdout=subprocess.PIPE, stderr=log, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class PrivateLibvirt:
    """A libvirtd of one's own: in a network namespace (its bridges, taps and VMs never
    touch the host's interfaces) and a mount namespace whose /etc/libvirt, /var/lib/libvirt,
    /run/libvirt ... are directories under ``base`` (so it shares no network, pool or domain
    with a system libvirtd, and removing ``base`` removes its disks).  Its socket is
    ``base/sock/libvirt-sock``; ``stop()`` destroys its VMs, ends it and removes the rest.

    QEMU runs as root without cgroups or a security driver: the host may have no systemd
    and no AppArmor; stdio_handler "file" because there is no virtlogd."""

    def __init__(self, base: Path, netns: str | None = None):
        self.base = Path(base)
        self.netns = netns or f"drlvg{os.getpid()}"
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.base}/sock/libvirt-sock"

    def argv(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (vagrant must be: it reaches VMs over their bridge)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def start(self, timeout: float = 30) -> "PrivateLibvirt":
        b = self.base
        for d in (*LIBVIRT_DIRS, "sock", "etc/qemu/networks/autostart", "etc/storage", "etc/nwfilter"):
            (b / d).mkdir(parents=True, exist_ok=True)
        for real in LIBVIRT_DIRS.values():
            Path(real).mkdir(parents=True, exist_ok=True)
        (b / "etc/libvirtd.conf").write_text(
            f'unix_sock_dir = "{b}/sock"\nunix_sock_rw_perms = "0700"\nauth_unix_rw = "none"\n'
            f'auth_unix_ro = "none"\nlog_outputs = "3:file:{b}/libvirtd.log"\n')
        (b / "etc/qemu.conf").write_text('cgroup_controllers = [ ]\nstdio_handler = "file"\n'
                                         'security_driver = "none"\nuser = "root"\ngroup = "root"\n')
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(self.argv("ip", "link", "set", "lo", "up"), check=True)
        mounts = " && ".join(f"mount --bind {b / k} {v}" for k, v in LIBVIRT_DIRS.items())
        self.proc = subprocess.Popen(
            self.argv("unshare", "-m", "--propagation", "private", "sh", "-c",
                      f"{mounts} && exec libvirtd --config {b}/etc/libvirtd.conf --pid-file {b}/libvirtd.pid"),
            stdout=open(b / "libvirtd.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while subprocess.run(["virsh", "-c", self.uri, "version"], capture_output=True).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"libvirtd did not start: {(b / 'libvirtd.out').read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def virsh(self, *args: str) -> str:
        return subprocess.run(["virsh", "-c", self.uri, *args], capture_output=True, text=True).stdout

    def running(self) -> bool:
        return subprocess.run(["virsh", "-c", self.uri, "version"], capture_output=True).returncode == 0

    def stop(self) -> None:
        """Destroy every VM, end libvirtd (and any QEMU it left), delete the namespace and ``base``.
        Works from another process than the one that started it (``drl-lab down``): libvirtd is
        found by its pid file."""
        if self.running():
            for dom in self.virsh("list", "--all", "--name").split():
                self.virsh("destroy", dom)
            # a network's dnsmasq outlives libvirtd: destroying the network ends it
            for net in self.virsh("net-list", "--all", "--name").split():
                self.virsh("net-destroy", net)
            self._end_libvirtd()
        # QEMU and dnsmasq outlive a libvirtd that did not get to destroy them
        for pidfile in [*(self.base / "run" / "qemu").glob("*.pid"), *(self.base / "run" / "network").glob("*.pid")]:
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        # whatever still runs in the namespace is this libvirtd's doing
        for pid in subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)

    def _end_libvirtd(self, timeout: float = 15) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            return
        with contextlib.suppress(ValueError, OSError):
            pid = int((self.base / "libvirtd.pid").read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            # the namespace sweep in stop() kills it if it is still there

    def __enter__(self) -> "PrivateLibvirt":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def build_install(dest: Path) -> Path:
    """What provisioning installs on a VM of the box (vagrant/provision.sh, as docs/service.md
    says): drl's wheel, built from this checkout (the box has its dependencies), and the
    shipped units of systemd/."""
    build_wheelhouse(REPO, dest, deps=False)
    for unit in sorted((REPO / "systemd").glob("*.service")):
        shutil.copy(unit, dest)
    return dest


class VagrantCluster:
    """The Vagrantfile's VMs for one topology file, on a PrivateLibvirt, with the box of
    scripts/build-box.sh and drl from ``install`` (:func:`build_install`); Vagrant's state
    (its home with the box, .vagrant, the cluster key, the ssh config) stays in ``work``.  ``run(host, cmd)`` runs a shell command on a
    VM over ssh with Vagrant's key (one ssh, not one ``vagrant ssh``: each vagrant command
    costs seconds of Ruby start-up)."""

    def __init__(self, libvirt: PrivateLibvirt, work: Path, box: Path, install: Path, topology: Path,
                 allocator: str, tcg: bool = True, memory_mib: int = 768, log=None):
        self.lv, self.work, self.box, self.log = libvirt, Path(work), Path(box), log
        self.env = {**os.environ, "VAGRANT_HOME": str(self.work / "home"), "DRL_INSTALL": str(install),
                    "VAGRANT_DOTFILE_PATH": str(self.work / "dot"), "VAGRANT_CWD": str(VAGRANT_DIR),
                    "DRL_TOPOLOGY": str(topology), "DRL_ALLOCATOR": allocator, "DRL_BOX": "drl",
                    "DRL_VAGRANT_TCG": "1" if tcg else "0", "DRL_VAGRANT_MEMORY": str(memory_mib),
                    "DRL_LIBVIRT_URI": libvirt.uri, "VAGRANT_NO_COLOR": "1", "VAGRANT_CHECKPOINT_DISABLE": "1"}
        self.ssh_config = self.work / "ssh.cfg"

    def vagrant(self, *args: str, timeout: float = 1800) -> None:
        subprocess.run(self.lv.argv("vagrant", *args), env=self.env, check=True, timeout=timeout,
                       stdout=self.log, stderr=subprocess.STDOUT)

    def up(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.vagrant("box", "add", "--force", "--name", "drl", str(self.box))
        self.vagrant("up", "--provider", "libvirt")
        cfg = subprocess.run(self.lv.argv("vagrant", "ssh-config"), env=self.env, check=True,
                             capture_output=True, text=True).stdout
        self.ssh_config.write_text(cfg)

    def ssh_argv(self, host: str, cmd: str) -> list[str]:
        return self.lv.argv("ssh", "-F", str(self.ssh_config), "-o", "ServerAliveInterval=10", host, cmd)

    def run(self, host: str, cmd: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(self.ssh_argv(host, cmd), capture_output=True, text=True, timeout=timeout, check=check)

    def popen(self, host: str, cmd: str, stdout) -> subprocess.Popen:
        return subprocess.Popen(self.ssh_argv(host, cmd), stdout=stdout, stderr=subprocess.PIPE)

    def wait_agent(self, host: str, timeout: float = 600) -> float:
        """Seconds until ``host``'s agent answers drlctl (bcc compiles limiter.c first:
        under TCG that is the slowest step of all)."""
        t0 = time.monotonic()
        while self.run(host, f"sudo /opt/drl/bin/drlctl --socket {VM_SOCKET} status", check=False).returncode:
            if time.monotonic() - t0 > timeout:
                journal = self.run(host, "sudo journalctl -u drl-agent --no-pager -n 30", check=False).stdout
                raise TimeoutError(f"drl-agent on {host} did not answer in {timeout:.0f} s:\n{journal}")
            time.sleep(5)
        return time.monotonic() - t0


def boot(lv: PrivateLibvirt, work: Path, box: Path, topology: Path, allocator: str, agents: list[str],
         tcg: bool, memory_mib: int, log, progress, runs_traffic: bool = False) -> VagrantCluster:
    """The VMs of ``topology`` up on ``lv``, drl installed from this checkout, and every agent
    of ``agents`` answering drlctl.  ``runs_traffic``: the caller starts the traffic servers
    (for their reports), provisioning does not."""
    vms = VagrantCluster(lv, work, box, build_install(work / "install"), topology, allocator, tcg=tcg,
                         memory_mib=memory_mib, log=log)
    if runs_traffic:
        vms.env["DRL_LAB_RUNS_TRAFFIC"] = "1"
    t = time.monotonic()
    vms.up()
    progress(f"   VMs up in {time.monotonic() - t:.0f} s (log: {log.name})")
    for h in agents:
        progress(f"   agent on {h} answers after {vms.wait_agent(h):.0f} s more")
    return vms


# Runs on a VM beside its agent (and on the sink): one JSON line per sample, stamped with
# the VM's clock, so the host's times do not carry ssh's delays.  "rx": the sink NIC's
# received bytes every DT; "status": the agent's status every 0.5 s (as lab/agents.py's
# StatusPoller).  One process for the whole run: under TCG a Python start costs seconds.
PROBE = r"""
import json, subprocess, sys, time
sock, addr = sys.argv[1], sys.argv[2]
dev = None
if addr != "-":
    for line in subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines():
        f = line.split()
        if f[3].split("/")[0] == addr:
            dev = f[1]
if sock != "-":
    from drl.agent.service.control import request
next_status = 0.0
while True:
    t = time.monotonic()
    if dev:
        with open(f"/sys/class/net/{dev}/statistics/rx_bytes") as fh:
            print(json.dumps({"t": t, "rx": int(fh.read())}), flush=True)
    if sock != "-" and t >= next_status:
        next_status = t + 0.5
        try:
            print(json.dumps({"t": t, "status": request(sock, "status", timeout_s=2.0)["status"]}), flush=True)
        except Exception:
            pass  # a missed sample is a gap in the plot
    time.sleep(max(0.0, t + 0.1 - time.monotonic()))
"""


class _Probe:
    """Reads PROBE's lines from one VM on a thread.  Times are the host's monotonic clock
    (the first line anchors the VM's clock to it); ``since(t0)`` gives them on the run's
    clock.  Started before the run: a probe's Python takes seconds to start under TCG, and
    the sink's first seconds would be missing from the aggregate."""

    def __init__(self, vms: VagrantCluster, host: str, sock: str, addr: str):
        import threading
        self.rx: list[tuple[float, int]] = []
        self.status: list[tuple[float, dict]] = []
        self.offset = None
        self.proc = vms.popen(host, f"sudo /opt/drl/bin/python3 -u -c {_quote(PROBE)} {sock} {addr}",
                              stdout=subprocess.PIPE)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if self.offset is None:
                self.offset = time.monotonic() - doc["t"]
            t = doc["t"] + self.offset
            if "rx" in doc:
                self.rx.append((t, doc["rx"]))
            else:
                self.status.append((t, doc["status"]))

    def since(self, samples: list, t0: float) -> list:
        return [(t - t0, v) for t, v in samples if t >= t0]

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.thread.join(5)


def _quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def run_on_vagrant(exp: Experiment, out: Path, allocators: list[str] | None = None, progress=print,
                   tcg: bool | None = None, memory_mib: int = 768) -> dict:
    """``drl-lab run NAME --on vagrant``: for each allocator, the experiment's VMs (the
    Vagrantfile, the box of scripts/build-box.sh, a PrivateLibvirt), its traffic schedule
    and link events played on them over ssh, the same result.json and plots as the
    namespace lab (lab/results.py, lab/plots.py), then every VM destroyed.  One run per
    allocator (each boots its VMs afresh: minutes under TCG).  Faults are not played on VMs."""
    import tempfile

    from . import plots
    from .errors import LabError
    from .results import compare

    if exp.faults:
        raise LabError(f"{exp.name} has faults: --on vagrant plays traffic and link events only")
    reason = vagrant_missing()
    if reason:
        raise LabError(f"--on vagrant {reason}")
    tcg = os.environ.get("DRL_VAGRANT_TCG", "1") != "0" if tcg is None else tcg
    t0 = time.monotonic()
    progress("== box (scripts/build-box.sh; cached after the first build)")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "build-box.log", "w") as log:
        box = build_box(log)
    progress(f"   {box} ({time.monotonic() - t0:.0f} s)")
    runs = []
    for alloc in allocators or list(exp.allocators):
        progress(f"== {exp.name}: {alloc} on VMs ({'TCG' if tcg else 'KVM'})")
        work = Path(tempfile.mkdtemp(prefix="drl-vagrant-", dir="/var/tmp"))
        try:
            runs.append(_vm_run(exp, alloc, out / f"{alloc}-1", box, work, tcg, memory_mib, progress))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    summary = {**runs[0], "runs": runs, "comparison": compare(runs)}
    (out / "result.json").write_text(json.dumps(summary, indent=1))
    plots.draw_all(summary, exp, out)
    return summary


def _vm_run(exp: Experiment, alloc: str, out: Path, box: Path, work: Path, tcg: bool, memory_mib: int,
            progress) -> dict:
    from .agents import Agent
    from .collector import DT, SinkMeter
    from .results import analyse

    out.mkdir(parents=True, exist_ok=True)
    doc = export(exp)
    topo = work / "topology.json"
    topo.write_text(dumps(doc))
    # the VMs' kernel has sch_netem: a link event keeps the link's delay and loss (netem with a
    # rate) instead of the tbf the plan gives a host without it
    plan = dataclasses.replace(make_plan(exp, run="lb0000"), netem=True)
    groups = place(plan)
    addr = {h["name"]: [l["addr"] for l in h["links"]] for h in doc["hosts"]}
    hosts = list(doc["agents"][alloc])
    with open(out / "vagrant.log", "w") as log, PrivateLibvirt(work / "libvirt") as lv:
        vms = boot(lv, work, box, topo, alloc, hosts, tcg, memory_mib, log, progress, runs_traffic=True)
        servers = []
        for g in groups:
            argv = g.server_argv(VM_OUT, python="/opt/drl/bin/python3")
            servers.append((g, vms.popen(g.server_host, " ".join(argv),
                                         stdout=open(g.report(out) if g.traffic.kind != "web"
                                                     else out / f"web-server{g.index}.log", "w"))))
        sink_addr = addr[exp.sink][0]
        probes = {h: _Probe(vms, h, VM_SOCKET, sink_addr if h == exp.sink else "-") for h in hosts}
        if exp.sink not in probes:
            probes[exp.sink] = _Probe(vms, exp.sink, "-", sink_addr)
        # the servers listen and every probe reports before the schedule starts (ssh and
        # Python under TCG take seconds)
        deadline = time.monotonic() + 120
        while any(p.offset is None for p in probes.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        t0 = time.monotonic()
        actions = sorted([(g.traffic.start_s, "start", g) for g in groups] + [(e.at_s, "event", e) for e in exp.events],
                         key=lambda a: a[0])
        launched, clients = {}, []
        while (now := time.monotonic() - t0) < exp.duration_s:
            while actions and actions[0][0] <= now:
                _, what, item = actions.pop(0)
                if what == "start":
                    launched[item.index] = time.monotonic() - t0
                    clients.append(vms.popen(item.client_host,
                                             " ".join(item.client_argv(VM_OUT, python="/opt/drl/bin/python3")),
                                             stdout=open(out / f"client{item.index}.log", "w")))
                else:
                    link = next(l for l in exp.links if set(l.ends) == set(item.link))
                    for cmd in plan.shaping_commands(link, item.rate_Bps):
                        ns, dev = cmd[2], cmd[6]
                        end = next(i for v in plan.veths for i in (v.a, v.b) if plan.ns(i.host) == ns and i.name == dev)
                        # not waited for: ssh under TCG takes seconds, the schedule goes on
                        clients.append(vms.popen(
                            end.host, f"dev=$(ip -o -4 addr show | awk '$4 ~ \"^{end.addr}/\" {{print $2}}'); "
                                      f"sudo tc qdisc replace dev $dev root {' '.join(cmd[8:])}",
                            stdout=subprocess.DEVNULL))
                    progress(f"   t={now:5.1f}s  link {'-'.join(item.link)} now {to_bps(item.rate_Bps) / 1e6:g} Mbit/s")
            time.sleep(DT)
        for p in clients:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(60)
        for _, p in servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            p.terminate()
        for p in probes.values():
            p.stop()
    meter = SinkMeter.__new__(SinkMeter)   # the sink's samples, read on the VM
    meter.samples = probes[exp.sink].since(probes[exp.sink].rx, t0)
    agents = [Agent(h, VM_SOCKET, None, out / "vagrant.log", samples=probes[h].since(probes[h].status, t0))
              for h in hosts]
    result = analyse(exp, alloc, plan.run, 0, groups, launched, meter, agents, out)
    result["on"] = {"vagrant": {"tcg": tcg, "memory_mib": memory_mib, "box": box.name}}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m drl.lab.vagrant", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", nargs="?", help="built-in name or TOML file")
    ap.add_argument("--write-all", action="store_true", help="rewrite vagrant/topologies/ for every built-in")
    args = ap.parse_args(argv)
    if args.write_all:
        TOPOLOGIES.mkdir(parents=True, exist_ok=True)
        for name in builtin():
            (TOPOLOGIES / f"{name}.json").write_text(dumps(export(resolve(name))))
        return
    if not args.experiment:
        ap.error("name an experiment or pass --write-all")
    sys.stdout.write(dumps(export(resolve(args.experiment))))


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    main()
