"""GTB, the global token bucket of [Raghavan07] §3.2.

    >>> from drl.agent.allocators import create
    >>> alloc = create("gtb")

The paper's bucket "refreshes tokens at the global rate limit, but removes
tokens both when bytes arrive locally and to account for expected arrivals at
other limiters", the latter at the sum of "the most recent values it has
received".  Our datapath has a local bucket with one refill rate, so GTB is
expressed as that rate: refill at L, drain at the others' reported rates, i.e.

    local limit = max(0, global - sum of every peer's last reported arrival rate)

An idle node whose peers report no arrivals either holds L/N, not L
(common.idle_split): otherwise every node of an idle cluster holds all of L, and
traffic that comes back on all of them at once passes N times it.  What GTB
cannot avoid is the next interval: the first arrivals are reported one gossip
round late, so until then each node's limit is L less the others' *old* rates.

Stale peers are *not* zeroed and the global limit is *not* cut by 1/N: GTB
takes the values as they stand, which is exactly its weakness ("highly
sensitive to stale observations that continue to remove tokens at an outdated
rate", §3.2) and what the evaluation shows (§5.1, Fig. 3(b)).  It publishes its
local arrival rate.  No parameters of its own: the estimate interval (paper:
50 ms) and the estimator's EWMA (paper: 0.1; GTB only does well with none, §5.2)
belong to the agent.  Bucket depth is the datapath's (paper: 75,000 bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from drl.agent.model import PeerView, Snapshot, Step
from .common import bucket_step, idle_split


def reported_sum(view: PeerView) -> float:
    """Every peer's last reported value, stale or not (GTB's "most recent values")."""
    return sum(peer.value for peer in view.peers.values())


@dataclass(frozen=True)
class GlobalTokenBucket:
    name: ClassVar[str] = "gtb"

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> None:
        return None

    def step(self, state: None, snap: Snapshot) -> Step:
        remote_Bps = reported_sum(snap.view)
        idle = idle_split(snap.local.demand_Bps, remote_Bps, snap.global_Bps, snap.view.n_nodes)
        return bucket_step(snap.global_Bps - remote_Bps if idle is None else idle, snap, remote_Bps=remote_Bps)
