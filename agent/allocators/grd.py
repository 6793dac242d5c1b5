"""GRD, global random drop ([Raghavan07] §3.2.1, Fig. 1).

    >>> from drl.agent.allocators import create
    >>> alloc = create("grd")

Every tick: global demand = local arrival rate + the peers' reported rates
(Fig. 1 line 1, r_i); if it exceeds the limit, every local packet is dropped
with probability (demand - limit) / demand (lines 3-4), so the expected drops
match one central bucket's and the aggregate forwards no more than the limit.
Stale peers follow §5.6: their rates count as zero (``view.remote_sum``) and
the limit shrinks by 1/N for each (``effective_limit``).

No parameters of its own ("GRD requires no tuning parameters of its own
besides the estimator's EWMA and estimate interval length", §3.2.1; the paper
uses a 50 ms interval and a 1-second EWMA of 0.1, and finds GRD sensitive to
the interval).  Mode DROP: the datapath drops at random and has no bucket, so
``limit_Bps`` is informational, the rate this node is expected to forward,
demand x (1 - p); summed over nodes that is the global limit when
over-subscribed.  It publishes its local arrival rate, r_i.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from drl.agent.model import Decision, Mode, Snapshot, Step, effective_limit
from .common import drop_probability


@dataclass(frozen=True)
class GlobalRandomDrop:
    name: ClassVar[str] = "grd"
    reads_sum: ClassVar[bool] = True     # reads only the peers' sum: the sum tree may supply it

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> None:
        return None

    def step(self, state: None, snap: Snapshot) -> Step:
        local_Bps = snap.local.demand_Bps
        demand_Bps = local_Bps + snap.view.remote_sum          # Fig. 1 line 1
        limit_Bps = effective_limit(snap)                       # §5.6: 1/N per stale peer
        p = drop_probability(demand_Bps, limit_Bps)             # Fig. 1 lines 3-4
        decision = Decision(mode=Mode.DROP, limit_Bps=local_Bps * (1.0 - p), drop_probability=p,
                            publish=local_Bps,
                            info={"global_demand_Bps": demand_Bps, "global_limit_Bps": limit_Bps})
        return Step(state=None, decision=decision)
