"""One class's step, the same for the agent's tick and the simulator's.

    snap, step = class_step(allocator, state, ClassInput(now, node_id, interval_s, global_Bps,
                                                         local, view, inbox, safe_Bps), sums)

In: the class's estimate (``Local``, agent/estimator.py), its peer view (``PeerView``, from
agent/gossip/membership.py or sim/views.py) and, where the sum tree runs, what the tree
summed (anything with ``apply(view, key, now)``: agent/gossip/tree.py's SumTree).  Out: the
``Snapshot`` the allocator saw and its ``Step``, with the heard cap applied to the decision.
The order is the design's (docs/design.md, "one tick"): estimate -> peer view -> tree sums
-> snapshot -> allocator -> heard cap.  Nothing here reads a clock, a map or a socket, so a
result from drl-sim is evidence about the agent: both run this function
(tests/unit/test_step.py fails if either goes round it).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence

from drl.agent.model import Allocator, Envelope, Local, PeerView, Snapshot, Step, heard_cap


class ClassInput(NamedTuple):
    """What one class's step reads this interval."""
    now: float
    node_id: str
    interval_s: float
    global_Bps: float
    local: Local                      # the estimate
    view: PeerView                    # per-peer gossip's view, stale rule applied
    inbox: Sequence[Envelope]         # point-to-point messages since the last step
    safe_Bps: float                   # the class's safe rate (safe_rate_Bps)
    key: int = 0                      # the class's gossip key (the tree sums per key)


class TreeSums(Protocol):
    def apply(self, view: PeerView, key: int, now: float) -> PeerView: ...


def safe_rate_Bps(global_Bps: float, n_nodes: int, configured_Bps: float | None = None) -> float:
    """A class's safe rate: as configured, or its 1/N share of the global limit."""
    return configured_Bps if configured_Bps is not None else global_Bps / max(1, n_nodes)


def class_step(allocator: Allocator, state: Any, given: ClassInput,
               sums: TreeSums | None = None) -> tuple[Snapshot, Step]:
    """The allocator's step on this interval's inputs; ``sums``: the sum tree, where it runs
    for this class.  The heard cap last: a host some alive peer no longer hears passes at
    most its safe rate, whatever its allocator decided (model.heard_cap)."""
    view = given.view if sums is None else sums.apply(given.view, given.key, given.now)
    snap = Snapshot(given.now, given.node_id, given.interval_s, given.global_Bps, given.local, view,
                    tuple(given.inbox))
    step = allocator.step(state, snap)
    capped = heard_cap(step.decision, view, given.safe_Bps)
    # the cap rarely applies, and a NamedTuple's _replace costs ~1 us: the simulator steps 1,000 a tick
    return snap, step if capped is step.decision else step._replace(decision=capped)
