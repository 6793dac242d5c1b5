"""The agent's Unix control socket: one JSON request per connection, one JSON reply.

    {"cmd": "status"}  ->  {"ok": true, "status": {...}}
    {"cmd": "down"}    ->  {"ok": true}            (the agent then detaches and exits)
    {"cmd": "reload"}  ->  {"ok": true, "added": [...], "changed": [...], "removed": [...]}
    {"cmd": "set", "class": "gold", "global": "100mbit"}
                       ->  {"ok": true, "class": "gold", "global_limit_bps": 1e8, "limit_version": 3}
    anything refused   ->  {"ok": false, "error": "one line"}

``drlctl`` and ``drl-agent down`` are the clients (:func:`request`); the daemon
owns a :class:`ControlServer` and polls it from its tick loop, so a request
never races the allocator.
"""
from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Callable

DEFAULT_SOCKET = "/run/drl/agent.sock"
MAX_REQUEST = 4096


class ControlError(Exception):
    """One line for the user: no agent at that socket, bad reply, ..."""


def request(path: str, cmd: str, timeout_s: float = 3.0, **args) -> dict:
    """Send one command (with its ``args``) to the agent at ``path`` and return its reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
        s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        data = b"".join(iter(lambda: s.recv(65536), b""))
    except FileNotFoundError:
        raise ControlError(f"no agent socket at {path} (is drl-agent running? try --socket)") from None
    except ConnectionRefusedError:
        raise ControlError(f"no agent is listening on {path} (stale socket file)") from None
    except PermissionError:
        raise ControlError(f"permission denied on {path} (run as root)") from None
    except socket.timeout:
        raise ControlError(f"the agent on {path} did not answer within {timeout_s:g} s") from None
    finally:
        s.close()
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError(f"unreadable reply from {path}") from None
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the agent refused the request"))
    return reply


class ControlServer:
    """Listens on ``path``; :meth:`handle_one` serves a connection ready on ``fileno()``."""

    def __init__(self, path: str):
        self.path = path
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:    # a file where the directory should be, a read-only /run
            raise ControlError(f"cannot create control socket {path}: {Path(path).parent}: {e.strerror}") from None
        if _is_live(path):
            raise ControlError(f"another agent is already running on {path} (stop it with drl-agent down --socket {path})")
        if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)  # left by an agent that crashed
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(path)
        except OSError as e:
            self.sock.close()
            raise ControlError(f"cannot create control socket {path}: {e.strerror}") from None
        os.chmod(path, 0o600)
        self.sock.listen(8)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def handle_one(self, handlers: dict[str, Callable[[dict], dict]]) -> None:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        with conn:
            conn.settimeout(1.0)
            try:
                raw = conn.recv(MAX_REQUEST)
                req = json.loads(raw or b"{}")
                handler = handlers.get(req.get("cmd"))
                reply = handler(req) if handler else {"ok": False, "error": f"unknown command {req.get('cmd')!r}"}
                conn.sendall(json.dumps(reply).encode())
            except (OSError, ValueError, AttributeError):
                pass  # a broken client must not stop the agent

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _is_live(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
