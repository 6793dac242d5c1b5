"""Build a :class:`~lab.topology.Topology` into namespaces, run processes there, tear it all down.

    with Lab(plan) as lab:                      # an experiment's plan, or pair(run), star(n, run)
        proc = lab.spawn("l1", ["iperf3", "-c", "10.1.2.2"], log=Path("c.log"))
        h1 = lab.hosts[0]                       # the hosts with an address, as handles
        h1.run("ip", "addr")                    # inside h1's namespace; stdout
    clean()                                     # leftovers of crashed runs (drl-lab clean)

Every network of the project, an experiment's or a kernel test's, is built
here from its Topology's one list of commands, so what links and hosts can
do (shaping, delay, faults) is added in one place.  Links with delay, jitter
or loss use netem where the kernel has it; elsewhere the Lab starts one
delay-line relay per such link (lab/delay.py) right after the build, and
``lab.delay_stats()`` reads what each relay dropped (also after teardown:
the relays' last words).

Teardown is by name, never by pattern: the processes this Lab started (by
pid), then every process still inside one of the run's namespaces (``ip netns
pids``), then the namespaces themselves, which takes their veths and qdiscs
along.  Each run keeps its key files and sockets in ``/run/drl-lab/<run>/``
with an ``owner`` file, so ``clean`` can tell a live run from a dead one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .delay import read_stats
from .errors import LabError
from .preflight import netem_available, require_root
from .topology import ANY_RUN, RUN, Topology

STATE_DIR = Path("/run/drl-lab")
NETNS_DIR = Path("/run/netns")


def sh(cmd: list[str]) -> str:
    """Run one command; a failure becomes a one-line LabError naming it."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        why = (res.stderr.strip().splitlines() or ["exit status %d" % res.returncode])[-1]
        raise LabError(f"`{' '.join(cmd)}` failed: {why}")
    return res.stdout


def poll(ready: Callable[[], bool], timeout_s: float, period_s: float = 0.05) -> bool:
    """Ask ``ready()`` until it says yes (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(period_s)
    return True


RELAY_START_S = 10.0   # a relay is a fresh Python process: it forwards in ~0.1 s on an idle machine


class Lab:
    def __init__(self, plan: Topology):
        if plan.netem is None and any(v.link and v.link.impaired for v in plan.veths):
            plan = dataclasses.replace(plan, netem=netem_available())
        self.plan = plan
        self.state = STATE_DIR / plan.run
        self.procs: list[subprocess.Popen] = []
        self.hosts = [Host(self, h) for h in plan.hosts if plan.address(h)]
        self.relays: dict[int, subprocess.Popen] = {}    # link index -> its delay line's relay
        self._end_drops: dict[tuple[str, str], int] = {}   # (ns, iface) -> tx_dropped when its relay started
        self._final_stats: list[dict] | None = None

    def __enter__(self) -> "Lab":
        require_root()
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "owner").write_text(f"{os.getpid()}\n")
        try:
            for cmd in self.plan.build_commands():
                sh(cmd)
            self._start_delay_lines()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def host(self, name: str) -> "Host":
        """A handle on any of the topology's namespaces (``lab.hosts`` has the addressed ones)."""
        return Host(self, name)

    def spawn(self, host: str, argv: list[str], log: Path | None = None, capture: bool = False) -> subprocess.Popen:
        """Start argv inside ``host``'s namespace, in its own session so a Ctrl-C reaches only
        the lab, which then stops everything in order.  Output goes to ``log`` (stderr too),
        or to pipes with ``capture`` (text), else nowhere."""
        argv = ["ip", "netns", "exec", self.plan.ns(host), *argv]
        if capture:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    text=True, start_new_session=True)
        else:
            with open(log, "wb") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        self.procs.append(proc)
        return proc

    def apply(self, cmds: list[list[str]]) -> None:
        for cmd in cmds:
            sh(cmd)

    def _start_delay_lines(self) -> None:
        """One relay per delay line, in the line's namespace; each is forwarding when its stats
        file appears."""
        for line in self.plan.delay_lines():
            stats = self._stats_file(line.index)
            log = self.state / f"delay-{line.index}.log"
            proc = self.spawn(line.host, line.argv(str(stats)), log=log)
            self.relays[line.index] = proc
            if not poll(lambda: stats.exists() or proc.poll() is not None, RELAY_START_S) or not stats.exists():
                tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
                raise LabError(f"the delay line of link {line.index} ({line.veth.a.host}-{line.veth.b.host}) "
                               f"did not start: {tail[0] if tail else 'no output'}")
            for end in (line.veth.a, line.veth.b):   # what the ends sent before the relay's ports were up
                key = (self.plan.ns(end.host), end.name)
                self._end_drops[key] = _tx_dropped(*key) or 0

    def _stats_file(self, index: int) -> Path:
        return self.state / f"delay-{index}.json"

    def delay_stats(self) -> list[dict]:
        """Per delay line: ``link`` index, ``ends``, and its relay's counters (lab/delay.py) as last
        written (every 0.5 s; after teardown, the relay's final ones)."""
        if self._final_stats is not None:
            return self._final_stats
        rows = []
        for line in self.plan.delay_lines():
            doc = read_stats(self._stats_file(line.index)) or {}
            for end, peer in ((line.veth.a, line.veth.b), (line.veth.b, line.veth.a)):
                # dropped before the relay could read them: the relay namespace's input backlog was full
                direction = doc.get("directions", {}).get(f"{end.host}->{peer.host}")
                key = (self.plan.ns(end.host), end.name)
                if direction is not None and (now := _tx_dropped(*key)) is not None:
                    direction["end_tx_dropped"] = now - self._end_drops.get(key, 0)
            rows.append({"link": line.index, "ends": [line.veth.a.host, line.veth.b.host], **doc})
        return rows

    def teardown(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        self.procs.clear()
        if self._final_stats is None and self.relays:
            self._final_stats = self.delay_stats()   # the relays wrote their last counts on SIGTERM
        remove_run(self.plan.run)


@dataclass(frozen=True)
class Host:
    """One namespace of a built Lab: where to run things, and its addresses."""
    lab: Lab
    name: str

    @property
    def ns(self) -> str:
        return self.lab.plan.ns(self.name)

    @property
    def addr4(self) -> str | None:
        return self.lab.plan.address(self.name)

    @property
    def addr6(self) -> str | None:
        return self.lab.plan.address6(self.name)

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, *cmd: str) -> str:
        """Run to completion inside the namespace; stdout, or a LabError naming the command."""
        return sh(self.argv(*cmd))

    def popen(self, *cmd: str, cpu: int | None = None, log: Path | None = None,
              capture: bool = False) -> subprocess.Popen:
        """Start cmd inside the namespace (Lab.spawn), pinned to ``cpu`` when given; the Lab
        stops it at teardown."""
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        return self.lab.spawn(self.name, [*pin, *cmd], log=log, capture=capture)

    def listening(self, port: int) -> bool:
        """Whether a TCP socket listens on ``port`` here."""
        return f":{port} " in self.run("ss", "-Hltn")


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM (agents detach cleanly on it), then SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        if not _reaped(proc, timeout_s):
            proc.kill()
            _reaped(proc, timeout_s)


def _reaped(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether ``proc`` has exited within ``timeout_s``, reaped.  A Ctrl-C that interrupted an
    earlier wait can leave the Popen's waitpid lock held (CPython's ``with`` may not release
    a lock when a signal's exception lands right after acquire, bpo-29988): every later
    ``wait()`` would block on it for ever and each timed one only time out, so the pid is
    reaped here directly."""
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        pass
    try:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:          # reaped already
        return True
    if pid:
        proc.returncode = os.waitstatus_to_exitcode(status)
    return bool(pid)


def remove_run(run: str) -> None:
    """Everything named after ``run``: processes in its namespaces, the namespaces, stray links, state."""
    spaces = [ns for ns in _namespaces() if ns.startswith(run + "-")]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in spaces for pid in _pids(ns)]
        for pid in pids:
            _kill(pid, sig)
        if poll(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 3.0):
            break
    for ns in spaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in _root_links(run):  # never created there; removed if a future bug does
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    shutil.rmtree(STATE_DIR / run, ignore_errors=True)


def leftover_runs() -> dict[str, bool]:
    """Runs with namespaces or state on this machine -> whether their owner process is alive.
    A run of any prefix (a test's, a bench's) is found by its state, which every Lab writes
    first: a killed pytest leaves its namespaces to ``clean`` too."""
    runs = {ns.split("-", 1)[0] for ns in _namespaces() if RUN.fullmatch(ns.split("-", 1)[0])}
    if STATE_DIR.is_dir():
        runs |= {d.name for d in STATE_DIR.iterdir() if ANY_RUN.fullmatch(d.name)}
    return {run: _owner_alive(run) for run in sorted(runs)}


def clean() -> tuple[list[str], list[str]]:
    """Remove the leftovers of runs whose owner died; returns (removed, still running)."""
    removed, running = [], []
    for run, alive in leftover_runs().items():
        (running if alive else removed).append(run)
        if not alive:
            remove_run(run)
    return removed, running


def _tx_dropped(ns: str, ifname: str) -> int | None:
    """The kernel's tx_dropped of ``ifname`` in ``ns`` (None: it is gone)."""
    res = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", ifname], capture_output=True, text=True)
    try:
        return json.loads(res.stdout)[0]["stats64"]["tx"]["dropped"]
    except (ValueError, LookupError):
        return None


def _namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def _pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()]


def _root_links(run: str) -> list[str]:
    names = Path("/sys/class/net")
    return [p.name for p in names.iterdir() if p.name.startswith(run)] if names.is_dir() else []


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _owner_alive(run: str) -> bool:
    try:
        pid = int((STATE_DIR / run / "owner").read_text())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and Path(f"/proc/{pid}").exists()
