"""The systemd units (systemd/) and what they promise, tested for real where this machine allows.

systemd is not PID 1 here, so the units are checked with ``systemd-analyze verify``
and the agent is run the way the unit runs it: as an unprivileged user (nobody)
holding exactly the unit's ``AmbientCapabilities=`` (setpriv), with /run/drl a
directory of its own (``RuntimeDirectory=``, here a bind mount in a private mount
namespace, so the host's /run/drl is untouched), and with ``NOTIFY_SOCKET`` and
``WATCHDOG_USEC`` pointing at a real datagram socket, as systemd sets them.
docs/service.md says what is verified how.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from drl.agent.kernel.caps import REQUIRED
from drl.lab.agents import drl_agent, installed
from drl.lab.measure import tc_show
from drl.lab.metrics import within
from drl.lab.traffic import iperf3

UNITS = Path(__file__).resolve().parents[2] / "systemd"
USER, GROUP = "nobody", "nogroup"
WATCHDOG_S = 1.0          # beats every WATCHDOG_S / 4 (agent/service/notify.py)


def unit_caps(name: str) -> list[str]:
    (line,) = re.findall(r"^AmbientCapabilities=(.*)$", (UNITS / name).read_text(), re.M)
    return line.split()


# -- the unit files -------------------------------------------------------------------------

def test_both_units_grant_exactly_the_capabilities_the_agent_checks():
    for name in ("drl-agent.service", "drl-agent@.service"):
        text = (UNITS / name).read_text()
        assert unit_caps(name) == list(REQUIRED), name
        assert re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M)[1].split() == list(REQUIRED), name
        for line in ("Type=notify", "Restart=on-failure", "NoNewPrivileges=yes", "User=drl"):
            assert f"\n{line}\n" in text, (name, line)


@pytest.mark.parametrize("unit", ["drl-agent.service", "drl-agent@.service", "drl-agent@eth0.service"])
def test_systemd_analyze_verify_is_silent(tmp_path, unit):
    """The units with ExecStart= pointing at this checkout's drl-agent (verify insists the
    command exists); an unknown key or a bad value would be printed."""
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: scripts/setup.sh installs systemd"
    for src in UNITS.glob("*.service"):
        (tmp_path / src.name).write_text(src.read_text().replace("/usr/local/bin/drl-agent", drl_agent()))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / unit)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout + out.stderr == "", out


# -- the agent as the unit runs it ------------------------------------------------------------

class NotifySocket:
    """A bound AF_UNIX datagram socket, as systemd's; ``next`` waits for a message."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)                  # the agent's user must be able to write to it
        self.seen: list[str] = []

    def next(self, timeout_s: float) -> str | None:
        self.sock.settimeout(timeout_s)
        try:
            msg = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        self.seen.append(msg)
        return msg

    def wait_for(self, wanted: str, timeout_s: float) -> list[str]:
        """Messages up to and including the first holding the line ``wanted``."""
        deadline, got = time.monotonic() + timeout_s, []
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is not None:
                got.append(msg)
                if wanted in msg.split("\n"):
                    return got
        raise AssertionError(f"no {wanted} within {timeout_s} s; got {got}")

    def during(self, seconds: float) -> list[str]:
        deadline, got = time.monotonic() + seconds, []
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is not None:
                got.append(msg)
        return got


def run_dir(tmp_path: Path) -> Path:
    """What RuntimeDirectory=drl gives the unit: a /run/drl owned by its user."""
    d = tmp_path / "run-drl"
    d.mkdir()
    shutil.chown(d, USER, GROUP)
    return d


def as_unit(host, rundir: Path, caps: list[str], args: list[str], env: dict[str, str] | None = None,
            capture: bool = False) -> subprocess.Popen:
    """``drl-agent up ARGS`` in host's namespace as USER with exactly ``caps``, ``rundir`` as /run/drl."""
    names = ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)
    only = "-all" + ("," + names if names else "")
    setpriv = ["setpriv", f"--reuid={USER}", f"--regid={GROUP}", "--clear-groups", f"--inh-caps={only}",
               f"--bounding-set={only}", *([f"--ambient-caps={names}"] if names else [])]
    os.makedirs("/run/drl", exist_ok=True)      # the mount point (a root agent would make it too)
    shell = f"mount --bind {rundir} /run/drl && exec \"$@\""
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh",
            "env", *(f"{k}={v}" for k, v in (env or {}).items()), *setpriv, drl_agent(), "up", *args]
    return host.popen(*argv, log=None if capture else rundir / "agent.log", capture=capture)


def agent_args(h2) -> list[str]:
    # a configured peer that never answers: the gossip socket (SO_MARK) is made, and the
    # stale rule leaves this host half the global limit
    return ["--config", "/run/drl/drl.toml", "--iface", "eth0", "--node-id", "h1", "--socket", "/run/drl/agent.sock",
            "--state-dir", "/run/drl", "--listen", "10.0.0.1:7470", "--peers", f"h2@{h2.addr4}:7470", "--insecure",
            "--interval", "100ms"]


def attached(host) -> bool:
    return "drl_egress" in tc_show(host, "filter")


@pytest.mark.kernel
def test_unprivileged_agent_with_the_unit_capabilities_limits_notifies_and_stops_clean(net, server, tmp_path):
    h1, h2 = net.hosts
    rundir = run_dir(tmp_path)
    (rundir / "drl.toml").write_text('[[class]]\nname = "default"\nglobal = "20mbit"\n')
    note = NotifySocket(rundir / "notify.sock")
    agent = as_unit(h1, rundir, unit_caps("drl-agent.service"), agent_args(h2),
                    env={"NOTIFY_SOCKET": "/run/drl/notify.sock", "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))})
    log = rundir / "agent.log"

    try:
        before = note.wait_for("READY=1", 90)
    except AssertionError as e:                  # e.g. USER cannot read the checkout: the log says so
        raise AssertionError(f"{e}; agent log: {log.read_text()}") from None
    assert attached(h1), (before, log.read_text())          # READY=1 only once the filter is on
    assert before == ["READY=1\nSTATUS=limiting"], before    # nothing before it
    beats = note.during(2.0)
    assert beats.count("WATCHDOG=1") >= 3, beats        # ~6: a beat is due every 0.25 s, ticks come every 0.1 s

    status = subprocess.run(h1.argv(installed("drlctl"), "--socket", str(rundir / "agent.sock"), "status", "--json"),
                            capture_output=True, text=True)
    assert status.returncode == 0 and '"state": "attached"' in status.stdout, status
    result = iperf3(h1, server, seconds=6, streams=4)
    assert within(result.received_bps, 10e6 * 0.96, 0.10), (result, status.stdout)  # half of 20 Mbit/s, goodput

    os.killpg(agent.pid, signal.SIGSTOP)                   # a hung loop: no beats, systemd would restart it
    try:
        note.during(0.3)                                   # a beat already in flight
        assert "WATCHDOG=1" not in note.during(3 * WATCHDOG_S / 2)
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    note.wait_for("WATCHDOG=1", WATCHDOG_S)

    os.kill(agent.pid, signal.SIGHUP)                      # what ExecReload's drl-agent reload also triggers
    reload = note.wait_for("READY=1", 10)
    assert any(m.startswith("RELOADING=1\nMONOTONIC_USEC=") for m in reload), reload

    agent.send_signal(signal.SIGTERM)
    note.wait_for("STOPPING=1", 10)
    assert agent.wait(10) == 0, log.read_text()
    assert not attached(h1) and "clsact" not in tc_show(h1, "qdisc")
    assert "Traceback" not in log.read_text()


@pytest.mark.kernel
@pytest.mark.parametrize("dropped", list(REQUIRED))
def test_without_one_capability_the_agent_names_it_in_one_line_and_attaches_nothing(net, tmp_path, dropped):
    h1, h2 = net.hosts
    rundir = run_dir(tmp_path)
    (rundir / "drl.toml").write_text('[[class]]\nname = "default"\nglobal = "20mbit"\n')
    caps = [c for c in unit_caps("drl-agent.service") if c != dropped]
    agent = as_unit(h1, rundir, caps, agent_args(h2), capture=True)
    out, err = agent.communicate(timeout=60)
    assert agent.returncode == 1 and out == "", (out, err)
    assert err.strip().splitlines() == [f"Error: missing capabilities {dropped} "
                                        "(run as root or grant them: see docs/service.md)"], err
    assert not attached(h1) and "clsact" not in tc_show(h1, "qdisc")
