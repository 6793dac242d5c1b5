"""CTB, the central token bucket: the reference every distributed limiter is judged by.

    >>> from drl.agent.allocators import create
    >>> alloc = create("ctb")

[Raghavan07] §3 and §5.1: one token bucket at the global rate
through which *all* flows pass.  Run it on a single limiter that every flow
crosses (the lab's central topology); on N independent hosts it would let
N x global through, which is the point of every other allocator.  No
parameters; the bucket depth is the datapath's (the paper uses 75,000 bytes,
slightly more than the bandwidth-delay product, §5.1).  Publishes the local
arrival rate for ``drlctl status``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from drl.agent.model import Snapshot, Step
from .common import bucket_step


@dataclass(frozen=True)
class CentralTokenBucket:
    name: ClassVar[str] = "ctb"

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> None:
        return None

    def step(self, state: None, snap: Snapshot) -> Step:
        return bucket_step(snap.global_Bps, snap)
