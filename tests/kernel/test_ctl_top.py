"""`drlctl top` against a real agent: in a real pseudo-terminal (curses), and in batch mode.

One agent alone on h1 (lab/topology.py's pair) with two classes from a config
file; drlctl runs outside the namespace (the control socket is a file).
"""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent, drl_agent, installed

pytestmark = pytest.mark.kernel

CONFIG = """\
[agent]
iface = "eth0"
node_id = "h1"

[[class]]
name = "gold"
global = "50mbit"
match = ["dport=5201,proto=tcp"]

[[class]]
name = "silver"
global = "20mbit"
match = ["dport=5202,proto=tcp"]
shadow = true
"""
ALT_SCREEN_OFF = b"\x1b[?1049l"      # xterm's rmcup: curses gave the terminal back


@pytest.fixture
def agent(net, tmp_path):
    h1 = net.hosts[0]
    conf, sock, log = tmp_path / "drl.toml", str(tmp_path / "a.sock"), tmp_path / "agent.log"
    conf.write_text(CONFIG)
    a = Agent(h1.name, sock, h1.popen(drl_agent(), "up", "--config", str(conf), "--socket", sock,
                                      "--state-dir", str(tmp_path), log=log), log)
    a.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    yield a
    a.kill(15)


def in_pty(argv: list[str], rows: int, cols: int, wait_for: bytes, keys: bytes) -> tuple[int, bytes, float]:
    """Run argv on a pty of rows x cols, type ``keys`` once ``wait_for`` is on screen; its exit
    code, everything it wrote, and the seconds from the keys to its exit."""
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.execve(argv[0], argv, {**os.environ, "TERM": "xterm"})
    out, sent_at, deadline = b"", None, time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if sent_at is None and wait_for in out:
                os.write(fd, keys)
                sent_at, deadline = time.monotonic(), time.monotonic() + 5
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = None
                took = None if sent_at is None else time.monotonic() - sent_at
                return os.waitstatus_to_exitcode(status), out + _drain(fd), took
            out += _drain(fd)
        raise AssertionError(f"drlctl top still running (keys sent: {sent_at is not None}); it wrote {out[-400:]!r}")
    finally:
        if pid is not None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)


def _drain(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 0.05)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    return out


def top_argv(agent: Agent, *args: str) -> list[str]:
    return [installed("drlctl"), "--socket", agent.socket, "top", *args]


def test_top_in_a_terminal_shows_the_classes_and_quits_on_q_or_ctrl_c(agent):
    for keys in (b"q", b"\x03"):
        code, out, took = in_pty(top_argv(agent), 24, 100, b"silver", keys)
        assert code == 0 and took <= 2.0, (keys, code, took)
        assert b"gold" in out and ALT_SCREEN_OFF in out, keys


def test_top_in_a_tiny_terminal_is_cut_not_crashed(agent):
    code, out, took = in_pty(top_argv(agent), 3, 12, b"drl top", b"q")
    assert code == 0 and took <= 2.0 and b"silver" not in out, (code, took)


def test_top_batch_prints_a_row_per_class(agent):
    run = subprocess.run(top_argv(agent, "--batch", "--iterations", "2", "--delay", "0.5"),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()]
    assert sum(r[:1] == ["gold"] for r in rows) == 2 and sum(r[:1] == ["silver"] and r[-1] == "yes" for r in rows) == 2
    assert run.stdout.count("drl top - node h1 on eth0") == 2 and "\x1b" not in run.stdout


def test_top_without_an_agent_is_one_line_and_exit_1(tmp_path):
    run = subprocess.run([installed("drlctl"), "--socket", str(tmp_path / "none.sock"), "top"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "no agent socket" in run.stderr, run.stderr
