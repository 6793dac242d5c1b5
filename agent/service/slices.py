"""Work the loop does between ticks, a bounded slice at a time.

    slices.add(job)                 # job: an iterator; each next() is one small step
    slices.run(deadline)            # steps, round robin over the jobs, until the deadline

A status of 20,000 classes is ~1-2 s of work; made in one go it held the loop (late ticks,
the kernel's fail-safe, peers marking this agent stale).  Made as a job (a control reply,
a metrics snapshot) it advances only while the loop has nothing else to do: the daemon
runs it up to SLICE_S at a time and never past the next tick's due time.
"""
from __future__ import annotations

import collections
import time
from typing import Iterator

SLICE_S = 0.01      # the longest the loop is away from its sockets and its tick for these jobs


class Slices:
    def __init__(self) -> None:
        self._jobs: collections.deque[Iterator] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def add(self, job: Iterator) -> None:
        self._jobs.append(job)

    def run(self, deadline: float) -> None:
        """Steps until ``deadline`` (at least one while there is a job), each job in turn."""
        while self._jobs:
            job = self._jobs[0]
            try:
                next(job)
            except StopIteration:
                self._jobs.popleft()
            else:
                self._jobs.rotate(-1)
            if time.monotonic() >= deadline:
                return
