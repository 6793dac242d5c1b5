"""Signals as events of the agent's loop: SIGTERM and SIGINT stop it, SIGHUP reloads.

    rx = watch_signals(sel, stack, stop=..., reload=...)    # rx: close it when the loop ends

A handler only flags the loop (``stop``); the wakeup fd wakes the selector, and a SIGHUP
is read from the pipe and handled there, in the loop, never inside a tick.
"""
from __future__ import annotations

import contextlib
import selectors
import signal
import socket
from typing import Any, Callable

from drl.agent import logs

log = logs.get_logger("drl.agent")


def watch_signals(sel: selectors.BaseSelector, stack: contextlib.ExitStack, stop: Callable[[], None],
                  reload: Callable[[], Any]) -> socket.socket:
    """Install the handlers and register the signal pipe with ``sel``; ``stack`` puts the
    wakeup fd back.  Returns the pipe's reading end."""
    rx, tx = socket.socketpair()
    rx.setblocking(False)
    tx.setblocking(False)
    signal.set_wakeup_fd(tx.fileno())

    def on_signal(signum, frame) -> None:
        if signum != signal.SIGHUP:
            log.info("signal", name=signal.Signals(signum).name)
            stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    sel.register(rx, selectors.EVENT_READ, lambda: _signalled(rx, reload))
    stack.callback(tx.close)
    stack.callback(signal.set_wakeup_fd, -1)
    return rx


def _signalled(rx: socket.socket, reload: Callable[[], Any]) -> None:
    """The signal pipe: a SIGHUP reloads here, in the loop, never inside a tick."""
    if signal.SIGHUP in rx.recv(64):
        log.info("signal", name="SIGHUP")
        reload()
