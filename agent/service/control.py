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

The socket is a way in (root only, but a stuck or hostile client is still a
client), so the server never waits on one: every connection is non-blocking
and sits in the server's own epoll set, whose descriptor is what the daemon's
selector watches (``fileno``), so the loop only ever reads or writes what is
already there.  A request is at most MAX_REQUEST bytes and ends at a newline
or the client's shutdown; a connection that has not finished within
CONN_TIMEOUT_S, or beyond the MAX_CONNS most recent, is closed.  Whatever the
bytes (too long, not JSON, nested past the parser's recursion limit, not an
object) the reply is ``{"ok": false, "error": ...}``, and so is a handler's
exception: a request can neither hold a tick nor stop the agent.
"""
from __future__ import annotations

import json
import os
import select
import socket
import stat
import time
from pathlib import Path
from typing import Callable

from drl.agent import logs

MAX_REQUEST = 4096
CONN_TIMEOUT_S = 5.0        # a client that has not sent its request (or read its reply) by then is dropped
MAX_CONNS = 16              # connections in progress; a new one beyond them closes the oldest
BACKLOG = 64                # connections waiting for accept(): pollers queue up while the agent compiles
CONNECT_RETRY_S = 0.05      # a client's wait between tries while that queue is full

log = logs.get_logger("drl.agent")


class ControlError(Exception):
    """One line for the user: no agent at that socket, bad reply, ..."""


def _connect(path: str, timeout_s: float) -> socket.socket:
    """A connected socket, waiting up to ``timeout_s`` for room in the agent's accept queue.

    An agent that does not accept (compiling its program at start, or stopped) leaves the
    connections it was sent in its queue, even those whose clients gave up; once the queue is
    full, a Unix socket with a timeout fails connect() with EAGAIN at once instead of waiting."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() + CONNECT_RETRY_S > deadline:
                raise socket.timeout from None
            time.sleep(CONNECT_RETRY_S)
        except BaseException:
            s.close()
            raise


def request(path: str, cmd: str, timeout_s: float = 3.0, **args) -> dict:
    """Send one command (with its ``args``) to the agent at ``path`` and return its reply."""
    s = None
    try:
        s = _connect(path, timeout_s)
        s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        data = b"".join(iter(lambda: s.recv(65536), b""))
    except FileNotFoundError:
        raise ControlError(f"no agent socket at {path} (is drl-agent running? try --socket)") from None
    except ConnectionRefusedError:
        raise ControlError(f"no agent is listening on {path} (stale socket file)") from None
    except PermissionError:
        raise ControlError(f"permission denied on {path} (run as root)") from None
    except (ConnectionResetError, BrokenPipeError):   # it died with our connection open (a SIGKILL)
        raise ControlError(f"the agent on {path} closed the connection before its reply") from None
    except socket.timeout:
        raise ControlError(f"the agent on {path} did not answer within {timeout_s:g} s") from None
    finally:
        if s is not None:
            s.close()
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError(f"unreadable reply from {path}") from None
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the agent refused the request"))
    return reply


class _Conn:
    """One client: its request as read so far, then its reply as left to write."""
    __slots__ = ("sock", "since", "inbuf", "outbuf")

    def __init__(self, sock: socket.socket, since: float):
        self.sock, self.since, self.inbuf, self.outbuf = sock, since, b"", None


class ControlServer:
    """Listens on ``path``; :meth:`handle_one` does what is ready when ``fileno()`` is readable:
    accepts, reads, answers, writes, each without waiting."""

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
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self.sock.fileno(), select.EPOLLIN)
        self._conns: dict[int, _Conn] = {}       # by fd, oldest first

    def fileno(self) -> int:
        """Readable when a client connects, sends, hangs up or may be written to."""
        return self._epoll.fileno()

    def handle_one(self, handlers: dict[str, Callable[[dict], dict]]) -> None:
        """Everything that is ready now, without waiting for anything that is not."""
        now = time.monotonic()
        for fd, events in self._epoll.poll(0):
            if fd == self.sock.fileno():
                self._accept(now)
            elif (conn := self._conns.get(fd)) is not None:
                if events & (select.EPOLLERR | select.EPOLLHUP) and conn.outbuf is not None:
                    self._drop(conn)
                elif conn.outbuf is None:
                    self._read(conn, handlers)
                else:
                    self._write(conn)
        for conn in [c for c in self._conns.values() if now - c.since > CONN_TIMEOUT_S]:
            self._drop(conn)

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:        # EMFILE and kin: the client sees a reset, the agent goes on
                log.warning("control_accept_failed", error=e.strerror)
                return
            sock.setblocking(False)
            while len(self._conns) >= MAX_CONNS:
                self._drop(next(iter(self._conns.values())))
            self._conns[sock.fileno()] = _Conn(sock, now)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _read(self, conn: _Conn, handlers: dict[str, Callable[[dict], dict]]) -> None:
        try:
            data = conn.sock.recv(MAX_REQUEST + 1 - len(conn.inbuf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.inbuf += data
        if len(conn.inbuf) > MAX_REQUEST:
            reply = {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"}
        elif data and b"\n" not in data:
            return                      # more to come
        else:
            reply = answer(conn.inbuf, handlers)
        conn.outbuf = json.dumps(reply).encode()
        self._epoll.modify(conn.sock.fileno(), select.EPOLLOUT)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.outbuf = conn.outbuf[sent:]
        if not conn.outbuf:
            self._discard_unread(conn)
            self._drop(conn)

    @staticmethod
    def _discard_unread(conn: _Conn) -> None:
        """Read what is left of an over-long request: closing on unread bytes would reset the
        client's connection before it reads the reply."""
        for _ in range(16):
            try:
                if not conn.sock.recv(65536):
                    return
            except OSError:
                return

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        self._conns.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        conn.sock.close()

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._epoll.close()
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def answer(raw: bytes, handlers: dict[str, Callable[[dict], dict]]) -> dict:
    """The reply to one request's bytes; never raises."""
    try:
        req = json.loads(raw or b"{}")
    except RecursionError:              # "[[[[..." past the parser's recursion limit
        return {"ok": False, "error": "unreadable request: nested too deep"}
    except ValueError as e:             # UnicodeDecodeError too
        return {"ok": False, "error": f"unreadable request: {str(e).splitlines()[0]}"}
    if not isinstance(req, dict):
        return {"ok": False, "error": "a request is a JSON object, e.g. {\"cmd\": \"status\"}"}
    cmd = req.get("cmd")
    handler = handlers.get(cmd) if isinstance(cmd, str) else None
    if handler is None:
        return {"ok": False, "error": f"unknown command {cmd!r}"}
    try:
        return handler(req)
    except Exception as e:              # a refusal the handler did not turn into a reply: still one line
        log.error("control_failed", cmd=cmd, error=f"{type(e).__name__}: {e}")
        return {"ok": False, "error": f"{cmd}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"}


def _is_live(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        return True
    except BlockingIOError:     # its accept queue is full: an agent listens there, busy (compiling)
        return True
    except OSError:
        return False
    finally:
        s.close()
