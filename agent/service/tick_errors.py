"""Exceptions one class, one datagram or one control request threw, caught where they happened.

    errors = TickErrors()
    errors.record("allocate", e, now, class_="gold")   # counted; logged at most once a minute per (class, stage)
    errors.record("receive", e, now, peer="b")         # a datagram's: counted under no class
    errors.record("control", e, now, cmd="reload")     # a control request's
    errors.total, errors.of("gold"), errors.rows()     # for the status and /metrics

Stages: ``allocate`` (a class's estimate, allocator step and what follows it), ``enforce``
(its write into the datapath), ``fallback`` (writing its safe rate after either failed),
``receive`` (one datagram), ``control`` (one control request).

A bug or a hostile value that breaks one class's step must not take the agent, and with it
every other class, down: that class falls back to its safe rate (service/tick.py) and the
rest go on.  Counting them keeps the failure visible; a line a minute keeps the log readable.
Datagrams and requests are counted under no class, so a peer or a client that makes up
names cannot grow the table (or the metric's label set).
"""
from __future__ import annotations

import collections

from drl.agent import logs

EVERY_S = 60.0          # one log line per (class, stage) at most this often
log = logs.get_logger("drl.agent")


class TickErrors:
    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()    # (class, stage) -> n
        self._logged: dict[tuple[str, str], float] = {}

    def record(self, stage: str, error: BaseException, now: float, class_: str = "", **where: str) -> None:
        """One caught exception of ``stage`` in class ``class_`` ("" for none); ``where``
        (peer=, cmd=) only goes into the log line."""
        key = (class_, stage)
        self.counts[key] += 1
        if now - self._logged.get(key, -EVERY_S) >= EVERY_S:
            self._logged[key] = now
            named = {"class_": class_} if class_ else {}
            log.error("tick_error", **named, stage=stage, **where, error=f"{type(error).__name__}: {error}",
                      count=self.counts[key])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def of(self, class_: str) -> int:
        return sum(n for (c, _), n in self.counts.items() if c == class_)

    def rows(self) -> list[dict]:
        """Every (class, stage) counted so far, for the status (tick.errors_by) and /metrics."""
        return [{"class": c, "stage": s, "count": n} for (c, s), n in sorted(self.counts.items())]
