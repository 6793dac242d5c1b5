"""Exceptions one class, one datagram or one control request threw, caught where they happened.

    errors = TickErrors()
    errors.record("class", "gold", e, now)     # counted; logged at most once a minute per (where, stage)
    errors.record("receive", "b", e, now)      # where: the class, or for a datagram the peer's id
    errors.total, errors.of("gold")            # for the status and /metrics

A bug or a hostile value that breaks one class's step must not take the agent, and with it
every other class, down: that class falls back to its safe rate (daemon.Agent.tick) and the
rest go on.  Counting them keeps the failure visible; a line a minute keeps the log readable.
"""
from __future__ import annotations

import collections

from drl.agent import logs

EVERY_S = 60.0          # one log line per (where, stage) at most this often
log = logs.get_logger("drl.agent")


class TickErrors:
    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()    # (where, stage) -> n
        self._logged: dict[tuple[str, str], float] = {}

    def record(self, stage: str, where: str, error: BaseException, now: float) -> None:
        key = (where, stage)
        self.counts[key] += 1
        if now - self._logged.get(key, -EVERY_S) >= EVERY_S:
            self._logged[key] = now
            what = {"peer": where} if stage == "receive" else {"class_": where}
            log.error("tick_error", stage=stage, **what, error=f"{type(error).__name__}: {error}",
                      count=self.counts[key])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def of(self, where: str) -> int:
        return sum(n for (w, _), n in self.counts.items() if w == where)
