"""Static 1/N: every node enforces global / N, whatever the others do.

    >>> from drl.agent.allocators import create
    >>> alloc = create("static")

The baseline every paper compares against ([Raghavan07] §5.7,
Fig. 9(a): "a static 1/N limiting policy cannot take advantage of unused
capacity at the other sites").  N is the *configured* number of nodes
(``snap.view.n_nodes``), not the number alive: the policy ignores everyone, so
a stale or dead peer changes nothing, except that a dead peer's datapath may
pass more than its 1/N (the fail-safe of a limit lowered since, or a
``--safe-rate`` above 1/N): then the others share what is left of the limit
(``effective_limit``), so the sum never exceeds the global limit.  No
parameters.  Mode BUCKET (token bucket at global/N; the
datapath's bucket depth is its own setting, the paper uses 75,000 bytes, §5.1).
It publishes the local arrival rate only so ``drlctl status`` and peers can
show it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from drl.agent.model import Snapshot, Step, effective_limit
from .common import bucket_step


@dataclass(frozen=True)
class Static:
    name: ClassVar[str] = "static"

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> None:
        return None

    def step(self, state: None, snap: Snapshot) -> Step:
        view = snap.view
        return bucket_step(min(snap.global_Bps / max(1, view.n_nodes), effective_limit(snap) / (1 + view.n_alive)),
                           snap)
