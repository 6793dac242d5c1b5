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
what it said before does not undo a live ``set`` (README "Changing limits").
The book is kept in ``--state-dir`` so a restarted agent starts from the
newest version it knew, and gossip brings it the newer ones it missed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Limit:
    version: int
    global_Bps: float


@dataclass
class _Entry:
    limit: Limit
    configured_Bps: float | None      # what the config file said when we last read it


class LimitBookError(Exception):
    """The limits file cannot be read; one line."""


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
            entry = self._entries[name] = _Entry(Limit(0, configured_Bps), configured_Bps)
        elif entry.configured_Bps != configured_Bps:
            entry.limit = Limit(entry.limit.version + 1, configured_Bps)
            entry.configured_Bps = configured_Bps
        return entry.limit

    def set(self, name: str, global_Bps: float) -> Limit:
        """A live change (drlctl set): the next version."""
        entry = self._entries[name]
        entry.limit = Limit(entry.limit.version + 1, global_Bps)
        return entry.limit

    def merge(self, name: str, limit: Limit) -> bool:
        """A peer's limit for ``name``; True when it is newer than ours and now in force."""
        entry = self._entries.get(name)
        if entry is None or limit <= entry.limit:
            return False
        entry.limit = limit
        return True

    def forget(self, name: str) -> None:
        self._entries.pop(name, None)

    def save(self) -> None:
        if not self.path:
            return
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
            return {name: _Entry(Limit(int(d["version"]), float(d["global_Bps"])), d["configured_Bps"])
                    for name, d in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise LimitBookError(f"limits file {self.path} is unreadable ({e}); remove it to start afresh") from None
