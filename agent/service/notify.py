"""The systemd notify protocol (sd_notify(3)), without libsystemd: one datagram per state.

    note = Notifier.from_env()     # no NOTIFY_SOCKET (not under systemd): every call does nothing
    note.ready()                   # READY=1: the filter is attached and the loop ticks
    note.watchdog(time.monotonic())   # from the tick; sends WATCHDOG=1 at most every WATCHDOG_USEC/4
    note.reloading() ... note.ready()
    note.stopping()

systemd/drl-agent.service runs the agent with ``Type=notify`` and ``WatchdogSec=``:
systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace)
and ``WATCHDOG_USEC``.  A send that fails is ignored, as sd_notify's callers do:
a lost notification must never stop the limiter.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Mapping


def socket_address(value: str) -> str | bytes:
    """NOTIFY_SOCKET -> the address to send to: ``@name`` is ``\\0name`` (abstract)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_s(env: Mapping[str, str], pid: int) -> float | None:
    """The watchdog timeout systemd asks us to beat, in seconds; None without one, or when
    WATCHDOG_PID names another process (the variable leaked to a child)."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0 or env.get("WATCHDOG_PID", str(pid)) != str(pid):
        return None
    return usec / 1e6


class Notifier:
    """Sends states to ``address`` (None: nowhere); watchdog beats every ``watchdog_s / 4``
    (systemd advises more often than half the timeout; a quarter leaves room for a slow tick)."""

    def __init__(self, address: str | bytes | None, watchdog_s: float | None = None):
        self.address = address
        self.watchdog_s = watchdog_s
        self._last_beat: float | None = None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) if address else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Notifier":
        value = env.get("NOTIFY_SOCKET", "")
        return cls(socket_address(value) if value else None, watchdog_s(env, os.getpid()))

    def send(self, *fields: str) -> bool:
        """One datagram of ``KEY=value`` lines; False when not sent."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError:
            return False
        return True

    def ready(self) -> bool:
        return self.send("READY=1", "STATUS=limiting")

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd (>= 253) tell this reload from an older one
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self, now: float) -> bool:
        """A beat if one is due at monotonic time ``now``: call it only when the loop made progress."""
        if self.watchdog_s is None:
            return False
        if self._last_beat is not None and now - self._last_beat < self.watchdog_s / 4:
            return False
        self._last_beat = now
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
