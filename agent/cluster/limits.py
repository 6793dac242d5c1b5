"""Each class's global limit and its version: the newest wins on every agent.

    book = LimitBook(Path("/var/lib/drl/limits-a.json"))
    book.configure("gold", 6.25e6)       # from the config file (or --global)
    book.set("gold", 12.5e6)             # drlctl set gold --global 100mbit: version + 1
    book.merge("gold", Limit(7, 2.5e6))  # heard from a peer: adopted when newer
    book.save()

Order: a higher version wins; at equal versions the higher rate (two agents
that changed one class at the same instant still agree, by a rule both know).
What an operator does last wins, whichever way it was done: a live ``set`` is
a new version, and so is a config file whose value for the class changed
since this agent last read it (on reload or restart).  A file that still says
what it said before does not undo a live ``set`` (docs/agent.md "Changing limits").
The book is kept in ``--state-dir`` so a restarted agent starts from the
newest version it knew, and gossip brings it the newer ones it missed.

Nothing enters the book unchecked (agent/units.py): a rate within
MIN_RATE_Bps..MAX_RATE_Bps, a version below MAX_VERSION, so one more always
fits the wire.  ``configure`` and ``set`` refuse with a :class:`LimitBookError`
line, ``merge`` never adopts (the wire has already dropped and counted such a
note), ``save`` never writes one, and a file holding one is refused at start
with a hint.  A class at the top version refuses ``set``: only forged
announcements get there (a key holder; wire.py refuses them on receipt), and
the way out is to rotate the cluster key, then stop the agents and remove
their limits files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from drl.agent import units


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


class LimitBook:
    def __init__(self, path: Path | None = None):
        self.path = path
        self._entries: dict[str, _Entry] = self._load() if path else {}

    def get(self, name: str) -> Limit:
        return self._entries[name].limit

    def configure(self, name: str, configured_Bps: float) -> Limit:
        """The config file's value for ``name``: a new version when it differs from what it was."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(_checked(name, Limit(0, configured_Bps)), configured_Bps)
        elif entry.configured_Bps != configured_Bps:
            entry.limit = _checked(name, Limit(entry.limit.version + 1, configured_Bps))
            entry.configured_Bps = configured_Bps
        return entry.limit

    def set(self, name: str, global_Bps: float) -> Limit:
        """A live change (drlctl set): the next version."""
        entry = self._entries[name]
        if entry.limit.version + 1 >= units.MAX_VERSION:
            raise LimitBookError(f"class {name!r}: its limit is at version {entry.limit.version}, the highest "
                                 f"there is (only forged announcements get there): rotate the cluster key, "
                                 f"then stop every agent and remove its limits file")
        entry.limit = _checked(name, Limit(entry.limit.version + 1, global_Bps))
        return entry.limit

    def merge(self, name: str, limit: Limit) -> bool:
        """A peer's limit for ``name``; True when it is newer than ours and now in force."""
        entry = self._entries.get(name)
        if entry is None or limit <= entry.limit:
            return False
        try:
            check_limit(Limit(limit.version + 1, limit.global_Bps))    # a set after it must still fit
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
        return entries
