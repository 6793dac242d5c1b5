"""Progress of long runs on stderr, one line per task, redrawn in place.

    progress = Progress()                       # Progress(enabled=False) is silent
    sim.run(600, progress=progress.task("fps N=490 br=3"))
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


class Progress:
    def __init__(self, stream: TextIO = sys.stderr, enabled: bool = True):
        self.stream, self.enabled = stream, enabled

    def task(self, label: str) -> Callable[[int, int], None]:
        start = time.monotonic()
        shown = [-1]

        def update(done: int, total: int) -> None:
            if not self.enabled:
                return
            pct = 100 * done // max(1, total)
            if pct == shown[0] or (pct % 5 and done != total):
                return
            shown[0] = pct
            end = "\n" if done == total else ""
            self.stream.write(f"\r  {label}: {pct:3d}%  {time.monotonic() - start:6.1f} s{end}")
            self.stream.flush()
        return update

    def note(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text + "\n")
            self.stream.flush()
