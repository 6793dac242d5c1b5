"""Accepted datagrams to the code that consumes them, by payload type.

    dispatch = Dispatch(members.observe)        # every datagram: a sign of life first
    tree.subscribe(dispatch)                    # each consumer: dispatch.on(Sums, handler)
    table.subscribe(dispatch)                   # dispatch.otherwise(...): a class's inbox
    dispatch.watch(Batch, handler)              # sees every Batch too, beside its consumer
    dispatch.deliver(rx, now)

A new message type touches gossip/ (wire.py) and the code that consumes it, which
subscribes its handler; the agent's loop only hands every datagram here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from drl.agent.gossip.core import Received

Handler = Callable[["Received", float], None]


class Dispatch:
    def __init__(self, *observers: Handler):
        self._observers = observers
        self._by_type: dict[type, Handler] = {}
        self._watchers: dict[type, list[Handler]] = {}
        self._otherwise: Handler | None = None

    def on(self, kind: type, handler: Handler) -> None:
        if kind in self._by_type:
            raise ValueError(f"{kind.__name__} already has a consumer")
        self._by_type[kind] = handler

    def watch(self, kind: type, handler: Handler) -> None:
        """``handler`` sees every datagram of ``kind`` as well, after its consumer: a check that
        reads another consumer's messages (the sum tree reads the peers' Batch values)."""
        self._watchers.setdefault(kind, []).append(handler)

    def otherwise(self, handler: Handler) -> None:
        self._otherwise = handler

    def deliver(self, rx: "Received", now: float) -> None:
        for observe in self._observers:
            observe(rx, now)
        handler = self._by_type.get(type(rx.payload), self._otherwise)
        if handler is not None:
            handler(rx, now)
        for watch in self._watchers.get(type(rx.payload), ()):
            watch(rx, now)
