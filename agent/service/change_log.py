"""One log line per state change the tick sees: a peer alive or stale, a class's mode or
allocator warning, and datagrams rejected (by reason, at most once a minute each).

    changes = ChangeLog()
    changes.log(now, transport.stats.rejected, members.status(now), table)   # after every tick

docs/logs.md lists the events.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from drl.agent import logs
from drl.agent.service.class_table import ClassRun

log = logs.get_logger("drl.agent")

REJECTS_EVERY_S = 60.0         # gossip_rejected: one line per reason at most this often
REJECT_HINTS = {"forged": "every agent of the cluster needs the same --key-file",
                "unknown_peer": "the sender is not in --peers (nor, with --registry, a member)",
                "wrong_cluster": "the sender belongs to another cluster",
                "unknown_version": "the sender runs another wire version of drl",
                "wrong_sender": "the sender uses a node id bound to another address",
                "bad_pair_mac": "a peer or this agent restarted (the old pair key, for a few Hellos) "
                                "or a forgery: not the pair key agreed with that node",
                "out_of_range": "an authenticated sender sent a value outside its bounds "
                                "(docs/config.md \"Bounds\"): a bug or a misbehaving key holder"}


class ChangeLog:
    """What was last said about each peer and reason; a class's own (mode, warning) lives on
    its ClassRun (``said``)."""

    def __init__(self):
        self._facts: dict[str, Any] = {}
        self._rejects_said: dict[str, tuple[int, float]] = {}   # reason -> (count, when) of its last log line

    def log(self, now: float, rejected: Mapping[str, int], peers: Iterable[dict], runs: Iterable[ClassRun]) -> None:
        """One line per peer that turned alive or stale, per class whose mode or warning changed,
        and per reason datagrams were rejected for (at most once a minute each)."""
        self._log_rejects(now, rejected)
        facts = {f"peer {p['node_id']} ({p['address']})": p["state"] for p in peers}
        for what, value in facts.items():
            if what in self._facts and self._facts[what] != value:
                log.info("change", what=what, now=value)
        self._facts = facts
        for run in runs:
            _log_class(run)

    def _log_rejects(self, now: float, rejected: Mapping[str, int]) -> None:
        """A peer with another key shows only as stale otherwise: its datagrams fail the MAC."""
        for reason, n in rejected.items():
            said, at = self._rejects_said.get(reason, (0, -math.inf))
            if n > said and now - at >= REJECTS_EVERY_S:
                log.warning("gossip_rejected", reason=reason, datagrams=n - said, hint=REJECT_HINTS.get(reason))
                self._rejects_said[reason] = (n, now)


def _log_class(run: ClassRun) -> None:
    """The class's mode and allocator warning, when either changed since the last tick."""
    if run.last is None:            # no step has succeeded yet (service/enforce.py fall_back)
        return
    d = run.last[1].decision
    said = (d.mode, d.info.get("warning"))
    if said != run.said and run.said is not None:     # the common case, once per class: equal
        for what, before, now_ in zip(("mode", "warning"), run.said, said):
            if before != now_:
                log.info("change", class_=run.name, what=what,
                         now=now_.name.lower() if what == "mode" else now_)
    run.said = said
