"""The control socket while another local process churns connections: the caps are per peer
process (SO_PEERCRED), so the churner sheds its own connections and drlctl is answered."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from daemon_harness import FakeDatapath, agent, config
from drl.agent.service import control
from drl.agent.service.control import ControlServer

# connect and close as fast as it can, keeping the HOLD newest connections open
CHURNER = """
import collections, socket, sys, time
path, hold, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
held, n = collections.deque(), 0
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except OSError:
        s.close()
        continue
    n += 1
    held.append(s)
    while len(held) > hold:
        held.popleft().close()
print(n)
"""

# what drlctl status does, every 0.1 s: one line per call, ok or the error
ASKER = """
import sys, time
from drl.agent.service.control import ControlError, request
path, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    t = time.monotonic()
    try:
        request(path, "status")
        print("ok", flush=True)
    except ControlError as e:
        print("failed:", e, flush=True)
    time.sleep(max(0.0, t + 0.1 - time.monotonic()))
"""


def holder(path: str, n: int) -> subprocess.Popen:
    """Another process holding ``n`` connections open until its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", "import socket, sys\n"
                             f"socks = [socket.socket(socket.AF_UNIX) for _ in range({n})]\n"
                             f"[s.connect({path!r}) for s in socks]\nprint('held', flush=True)\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def peers(srv: ControlServer) -> dict[int, int]:
    out: dict[int, int] = {}
    for conn in srv._conns.values():
        out[conn.peer] = out.get(conn.peer, 0) + 1
    return out


def test_a_process_holding_many_connections_displaces_only_its_own(tmp_path):
    srv = ControlServer(str(tmp_path / "agent.sock"))
    mine = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    others = []
    try:
        for s in mine:
            s.connect(srv.path)
        srv.handle_one({})
        for n in (40, 6, 6, 6):         # 42 in all on 16 places: the busiest peer gives way
            others.append(holder(srv.path, n))
            for _ in range(20):         # its connects wait in the kernel while the queue is full
                srv.handle_one({})
                time.sleep(0.01)
            assert others[-1].stdout.readline() == "held\n"
        srv.handle_one({})
        held = peers(srv)
        assert held[os.getpid()] == 2, held
        assert len(srv._conns) <= control.MAX_CONNS
        assert max(held.values()) <= control.MAX_PER_PEER and len(held) == 5, held
        assert srv.shed == 2 + 40 + 18 - len(srv._conns)     # each closed to make room
    finally:
        for p in others:
            p.communicate("")
        for s in mine:
            s.close()
        srv.close()


def churn(path: str, seconds: float, hold: int) -> tuple[list[str], int]:
    """A churner for ``seconds`` while drlctl status runs every 0.1 s: each call's outcome, and
    the connections the churner made."""
    churner = subprocess.Popen([sys.executable, "-c", CHURNER, path, str(hold), str(seconds)], stdout=subprocess.PIPE,
                               text=True)
    asker = subprocess.Popen([sys.executable, "-c", ASKER, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    calls, _ = asker.communicate(timeout=seconds + 30)
    made, _ = churner.communicate(timeout=30)
    return calls.splitlines(), int(made)


@pytest.mark.slow
def test_status_calls_are_answered_while_another_process_churns_connections(tmp_path, signals_kept):
    """234k connections in 5 s made 94 % of status calls fail; with the caps per process, at
    least 95 % of them are answered (bench/RESULTS.md "Control socket under churn")."""
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static", "--interval", "100ms")
    with agent(cfg, FakeDatapath()) as a:
        result = {}
        measure = threading.Thread(target=lambda: result.update(out=churn(cfg.socket_path, 5.0, 8)), daemon=True)
        stop = threading.Thread(target=lambda: (measure.join(), setattr(a, "stopping", True)), daemon=True)
        measure.start()
        stop.start()
        assert a.serve() == 0
        calls, made = result["out"]
    ok = sum(c == "ok" for c in calls)
    print(f"churn: {made} connections, {ok}/{len(calls)} status calls answered")
    assert len(calls) >= 30 and made > 10_000, (len(calls), made)
    assert ok >= 0.95 * len(calls), [c for c in calls if c != "ok"][:3]
