"""The agent's Unix control socket: one JSON request per connection, one JSON reply.

    {"cmd": "status"}  ->  {"ok": true, "status": {...}}
    {"cmd": "down"}    ->  {"ok": true}            (the agent then detaches and exits)
    {"cmd": "reload"}  ->  {"ok": true, "added": [...], "changed": [...], "removed": [...]}
    {"cmd": "set", "class": "gold", "global": "100mbit"}
                       ->  {"ok": true, "class": "gold", "global_limit_bps": 1e8, "limit_version": 3}
    anything refused   ->  {"ok": false, "error": "one line"}

``drlctl`` and ``drl-agent down`` are the clients (:func:`request`); the daemon
owns a :class:`ControlServer` and polls it from its tick loop, so a request
never races the allocator.  A handler may answer with an iterator of bytes
instead of a dict (``status``: 20,000 classes are ~17 MB of JSON and 1-2 s of
work): its parts are drawn a slice at a time between ticks (``slices``,
service/slices.py) and each is written as soon as it is made, so the loop is
never away from its tick for long and the client reads as the reply grows.

The socket is a way in (root only, but a stuck or hostile client is still a
client), so the server never waits on one: every connection is non-blocking
and sits in the server's own epoll set, whose descriptor is what the daemon's
selector watches (``fileno``), so the loop only ever reads or writes what is
already there.  A request is at most MAX_REQUEST bytes and ends at a newline
or the client's shutdown; a connection that has not sent it within
CONN_TIMEOUT_S, or that has a reply to read and has read none of it for
CONN_TIMEOUT_S, is closed (a reply still being made holds no clock).

Connections are shed per peer process (SO_PEERCRED's pid: the socket is root's
alone, so its uid tells no two clients apart): one peer holds at most
MAX_PER_PEER connections, a new one beyond them closes that peer's oldest,
and past MAX_CONNS in all the oldest of the peer holding the most is closed.
Accepts are at most BACKLOG a wake-up.  So a process that opens connections as
fast as it can only ever displaces its own, and the loop is not held by it.
Whatever the
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
import struct
import time
from pathlib import Path
from typing import Callable, Iterator, Union

from drl.agent import logs
from drl.agent.service.slices import Slices

MAX_REQUEST = 4096
CONN_TIMEOUT_S = 5.0        # a client that has not sent its request (or read its reply) by then is dropped
MAX_CONNS = 16              # connections in progress; a new one beyond them closes the busiest peer's oldest
MAX_PER_PEER = 4            # connections in progress of one client process; beyond: its own oldest goes
BACKLOG = 64                # connections waiting for accept(): pollers queue up while the agent compiles

log = logs.get_logger("drl.agent")

Reply = Union[dict, Iterator[bytes]]    # a dict, or the JSON text's parts, made as they are drawn
_PEERCRED = struct.Struct("3i")         # struct ucred: pid, uid, gid


class ControlError(Exception):
    """One line for the user: no agent at that socket, bad reply, ..."""


def _connect(path: str, timeout_s: float) -> socket.socket:
    """A connected socket, waiting up to ``timeout_s`` for room in the agent's accept queue.

    An agent that does not accept (compiling its program at start, or stopped) leaves the
    connections it was sent in its queue, and another process may keep it full.  A socket with
    a Python timeout is non-blocking, and connect() on a full queue fails at once (EAGAIN), so
    a poller retrying every few ms loses to whoever refills the queue faster; a blocking
    connect() bounded by SO_SNDTIMEO sleeps in the kernel and is woken by each accept."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout_s))
        try:
            s.connect(path)
        except BlockingIOError:        # SO_SNDTIMEO ran out with the queue still full
            raise socket.timeout from None
        s.settimeout(timeout_s)        # each read and write from here on: idle time, not the reply's length
        return s
    except BaseException:
        s.close()
        raise


def _timeval(seconds: float) -> bytes:
    """struct timeval; at least 1 us, since 0 would mean no limit."""
    usec = max(1, round(seconds * 1e6))
    return struct.pack("ll", usec // 1_000_000, usec % 1_000_000)


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
    """One client: its request as read so far, then its reply as left to write (``streaming``
    while a handler's parts are still being made)."""
    __slots__ = ("sock", "peer", "since", "inbuf", "outbuf", "streaming", "closed")

    def __init__(self, sock: socket.socket, peer: int, since: float):
        self.sock, self.peer, self.since, self.inbuf = sock, peer, since, b""
        self.outbuf: bytearray | None = None
        self.streaming = self.closed = False

    def idle(self, now: float) -> bool:
        """Past its time: its request not sent, or its reply not read (a reply still to be made waits)."""
        waiting = self.streaming and not self.outbuf
        return not waiting and now - self.since > CONN_TIMEOUT_S


class ControlServer:
    """Listens on ``path``; :meth:`handle_one` does what is ready when ``fileno()`` is readable:
    accepts, reads, answers, writes, each without waiting.  Streamed replies are jobs in
    ``slices``, which the daemon runs between ticks."""

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
        self.slices = Slices()
        self.shed = 0                            # connections closed to make room (the caps)

    def fileno(self) -> int:
        """Readable when a client connects, sends, hangs up or may be written to."""
        return self._epoll.fileno()

    def handle_one(self, handlers: dict[str, Callable[[dict], Reply]]) -> None:
        """Everything that is ready now, without waiting for anything that is not."""
        now = time.monotonic()
        for fd, events in self._epoll.poll(0):
            if fd == self.sock.fileno():
                self._accept(now)
            elif (conn := self._conns.get(fd)) is not None:
                if events & (select.EPOLLERR | select.EPOLLHUP) and conn.outbuf is not None:
                    self._drop(conn)
                elif conn.outbuf is None:
                    self._read(conn, handlers, now)
                else:
                    self._write(conn, now)
        for conn in [c for c in self._conns.values() if c.idle(now)]:
            self._drop(conn)

    def _accept(self, now: float) -> None:
        for _ in range(BACKLOG):       # a client connecting without end does not hold the loop
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:        # EMFILE and kin: the client sees a reset, the agent goes on
                log.warning("control_accept_failed", error=e.strerror)
                return
            sock.setblocking(False)
            peer = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
            self._make_room(peer)
            self._conns[sock.fileno()] = _Conn(sock, peer, now)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _make_room(self, peer: int) -> None:
        """Close the peer's oldest connection past MAX_PER_PEER, and past MAX_CONNS the oldest of
        the peer holding the most: a client churning connections sheds its own, not others'."""
        by_peer: dict[int, list[_Conn]] = {}
        for conn in self._conns.values():
            by_peer.setdefault(conn.peer, []).append(conn)
        mine = by_peer.get(peer, [])
        if len(mine) >= MAX_PER_PEER:
            victim = mine[0]
        elif len(self._conns) >= MAX_CONNS:
            victim = max(by_peer.values(), key=len)[0]
        else:
            return
        self.shed += 1
        self._drop(victim)

    def _read(self, conn: _Conn, handlers: dict[str, Callable[[dict], Reply]], now: float) -> None:
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
        conn.since = now
        if isinstance(reply, dict):
            conn.outbuf = bytearray(json.dumps(reply).encode())
            self._write(conn, now)
        else:
            conn.outbuf, conn.streaming = bytearray(), True
            self._watch(conn)
            self.slices.add(self._pump(conn, reply))

    def _pump(self, conn: _Conn, parts: Iterator[bytes]) -> Iterator[None]:
        """A slices job: one part of ``parts`` a step, each written as far as the client takes it."""
        try:
            for part in parts:
                if not conn.outbuf:
                    conn.since = time.monotonic()      # the client's clock starts with something to read
                conn.outbuf += part
                self._write(conn, time.monotonic())
                yield
                if conn.closed:         # dropped meanwhile (it hung up, timed out, was shed): stop making it
                    return
        except Exception as e:          # a reply cut short; the client sees it unreadable
            log.error("control_failed", error=f"{type(e).__name__}: {e}")
            self._drop(conn)
            return
        finally:
            conn.streaming = False
        if not conn.closed:
            self._write(conn, time.monotonic())

    def _write(self, conn: _Conn, now: float) -> None:
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(conn)
                return
            if sent:
                del conn.outbuf[:sent]
                conn.since = now
        if not conn.outbuf and not conn.streaming:
            self._discard_unread(conn)
            self._drop(conn)
        else:
            self._watch(conn)

    def _watch(self, conn: _Conn) -> None:
        """Wake for it when it can be written to and there is something to write (an idle
        streaming connection would wake the loop without end), else only on its hang-up."""
        self._epoll.modify(conn.sock.fileno(), select.EPOLLOUT if conn.outbuf else 0)

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
        if conn.closed:
            return
        conn.closed = True
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


def answer(raw: bytes, handlers: dict[str, Callable[[dict], Reply]]) -> Reply:
    """The reply to one request's bytes; never raises (a streamed reply's parts may: :meth:`ControlServer._pump`)."""
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
