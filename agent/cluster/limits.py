"""Each class's global limit and its version: the newest wins on every agent.

    book = LimitBook(Path("/var/lib/drl/limits-a.json"))
    book.configure("gold", 6.25e6)       # from the config file (or --global)
    book.set("gold", 12.5e6)             # drlctl set gold --global 100mbit: version + 1
    book.merge("gold", Limit(7, 2.5e6))  # heard from a peer: adopted when newer
    book.save()

Order: a higher version wins; at equal versions the higher rate (two agents
that changed one class at the same instant still agree, by a rule both know).
What an operator does last wins, whichever way it was done: a live ``set`` is
a new version, and so is a config file (or an etcd table) whose value for the
class changed since this agent last read it (on reload, restart, or etcd's watch).
A file that still says what it said before does not undo a live ``set``
(docs/agent.md "Changing limits").  The book is kept in ``--state-dir`` so a
restarted agent starts from the newest version it knew, and gossip brings it
the newer ones it missed.

Versions carry when they were set (a hybrid logical clock): a ``set`` or a
changed value takes ``max(current + 1, now)``, now in milliseconds since the
Unix epoch, so a version is the time of the change unless a newer one was
already there.  A class's first value from the config file is version 0, and
the small versions of older limits files (1, 2, 3...) read as changes made in
1970: valid, and beaten by any new change.  A version further than
MAX_AHEAD_MS (60 s) ahead of this agent's clock is never adopted from a peer
(``merge``: the caller counts and logs it) and is dropped from the limits file
at start (the class starts from its config value, version 0, and peers bring
back the newest legitimate one).  So a forged far-future note (a key holder,
docs/security.md "Limit versions") is never adopted, and a forged near-future
one is overtaken by the operator's next change, which is one more than it; the
top of the integer range, which a ``set`` could not follow, is out of reach.
Agents' clocks must agree within that bound (NTP): an agent whose clock runs
further ahead has its changes refused, and says so in the others' logs.

Nothing enters the book unchecked (agent/units.py): a rate within
MIN_RATE_Bps..MAX_RATE_Bps, a version below MAX_VERSION.  ``configure`` and
``set`` refuse with a :class:`LimitBookError` line, ``merge`` never adopts,
``save`` never writes one, and a file holding one is refused at start with a hint.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from drl.agent import logs, units

log = logs.get_logger("drl.agent")

MAX_AHEAD_MS = 60_000       # how far ahead of our clock a version may be adopted: clock skew, and no more


@dataclass(frozen=True, order=True)
class Limit:
    version: int
    global_Bps: float


@dataclass
class _Entry:
    limit: Limit
    configured_Bps: float | None      # what the config file said when we last read it


class LimitBookError(Exception):
    """The limits file cannot be read, or a limit is out of bounds; one line."""


def check_limit(limit: Limit, what: str = "limit") -> Limit:
    """``limit`` if its version and rate are within bounds, else :class:`~agent.units.UnitError`."""
    units.check_version(limit.version, f"{what}: version")
    units.check_rate(limit.global_Bps, f"{what}: global_Bps")
    return limit


def _checked(name: str, limit: Limit) -> Limit:
    try:
        return check_limit(limit, f"class {name!r}")
    except units.UnitError as e:
        raise LimitBookError(str(e)) from None


def clock_ms() -> int:
    return int(time.time() * 1000)


class LimitBook:
    def __init__(self, path: Path | None = None, clock: Callable[[], int] = clock_ms):
        self.path, self.clock = path, clock
        self._entries: dict[str, _Entry] = self._load() if path else {}

    def ahead_ms(self, version: int) -> int:
        """How far ``version`` lies beyond what this agent may adopt (> 0: it may not)."""
        return version - self.clock() - MAX_AHEAD_MS

    def _next(self, entry: _Entry) -> int:
        return max(entry.limit.version + 1, self.clock())

    def get(self, name: str) -> Limit:
        return self._entries[name].limit

    def configure(self, name: str, configured_Bps: float) -> Limit:
        """The config file's value for ``name``: a new version when it differs from what it was."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(_checked(name, Limit(0, configured_Bps)), configured_Bps)
        elif entry.configured_Bps != configured_Bps:
            entry.limit = _checked(name, Limit(self._next(entry), configured_Bps))
            entry.configured_Bps = configured_Bps
        return entry.limit

    def set(self, name: str, global_Bps: float) -> Limit:
        """A live change (drlctl set): the next version, which beats every one held."""
        entry = self._entries[name]
        entry.limit = _checked(name, Limit(self._next(entry), global_Bps))
        return entry.limit

    def merge(self, name: str, limit: Limit) -> bool:
        """A peer's limit for ``name``; True when it is newer than ours and now in force.
        One beyond :meth:`ahead_ms` is never adopted (the caller tells it apart to log it)."""
        entry = self._entries.get(name)
        if entry is None or limit <= entry.limit or self.ahead_ms(limit.version) > 0:
            return False
        try:
            check_limit(limit)
        except units.UnitError:
            return False            # never adopted; wire.py has dropped and counted such a note
        entry.limit = limit
        return True

    def forget(self, name: str) -> None:
        self._entries.pop(name, None)

    def save(self) -> None:
        if not self.path:
            return
        for name, e in self._entries.items():          # what _load would refuse is never written
            _checked(name, e.limit)
        data = {name: {"version": e.limit.version, "global_Bps": e.limit.global_Bps,
                       "configured_Bps": e.configured_Bps} for name, e in self._entries.items()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def _load(self) -> dict[str, _Entry]:
        try:        # the state directory (--state-dir) is made here, at start: one line if it cannot be
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LimitBookError(f"cannot use state directory {self.path.parent}: {e.strerror}") from None
        try:
            data = json.loads(self.path.read_text())
            entries = {name: _Entry(Limit(d["version"], d["global_Bps"]), d["configured_Bps"])
                       for name, d in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise LimitBookError(f"limits file {self.path} is unreadable ({e}); remove it to start afresh") from None
        for name, e in entries.items():
            try:
                check_limit(e.limit, f"class {name!r}")
                if e.configured_Bps is not None:
                    units.check_rate(e.configured_Bps, f"class {name!r}: configured_Bps")
            except units.UnitError as err:
                raise LimitBookError(f"limits file {self.path}: {err}; fix or remove the file to start "
                                     f"(the classes then start from the config file's limits)") from None
        return {name: e for name, e in entries.items() if not self._ahead_at_start(name, e.limit)}

    def _ahead_at_start(self, name: str, limit: Limit) -> bool:
        """A stored version beyond the clock bound: adopted before this check existed, or the
        clock went back; dropped, so that a change can follow it again."""
        ahead = self.ahead_ms(limit.version)
        if ahead > 0:
            log.warning("limit_ahead", class_=name, version=limit.version, ahead_s=round((ahead + MAX_AHEAD_MS) / 1000),
                        from_="limits file")
        return ahead > 0
