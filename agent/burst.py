"""Bucket depths and the cluster's burst budget, in one place for the agent, the lab and the simulator.

    D = budget(global_Bps=1.25e6, n_hosts=3, enforce="shape")          # bytes: the class's promise
    depth = host_depth(rate_Bps=4e5, global_Bps=1.25e6, n_hosts=3, budget_bytes=D, enforce="shape")

The promise (docs/agent.md "The promise"): in every window of T >= 1 s the bytes a class
passes on all hosts together are at most G x T + D, the envelope of one central token
bucket of rate G and depth D.  What the hosts can pass beyond their rates is what their
buckets hold, so the sum of their depths must stay within D: each host's depth is a floor
the mode needs plus its share of what D has beyond N floors, in proportion to its local
rate (the rates sum to at most G), and never more than the mode's own rule asks for:

    depth_i = min(mode_depth(r_i), floor + (D - N x floor) x r_i / G)      sum_i depth_i <= D

Defaults by mode, measured in bench/RESULTS.md ("bucket depth", "police, shape and tbf"):
a policer has no queue, so cubic TCP needs its bucket to absorb the sawtooth (300 ms of the
rate: >= 0.97 of tbf's goodput; 100 ms: 0.78 with 4 flows); HTB queues, so a shaped host
needs only 4 ms.  The buckets are not the only burst: when a host starts, stops or comes
back, the others learn it a gossip round later, and meanwhile the local limits can add up to
more than G (a kill and restart on 3 hosts at 30 Mbit/s: up to 218 kB beyond G x T, 58 ms of
G, in bench/RESULTS.md "Envelope, measured").  So a shaped class's default budget is 100 ms of G,
the buckets and that reaction; a policed class's 300 ms covers both.  Either never goes below
what the mode must be able to pass at once (two 64 KiB GSO skbs for a policer, one and a frame
for HTB), so D is raised to N floors when the configured or default budget is smaller.
"""
from __future__ import annotations

import math

POLICE_TIME_S = 0.300               # a policer's depth: 300 ms of its rate
POLICE_FLOOR = 128 * 1024           # two 64 KiB GSO skbs
SHAPE_TIME_S = 0.004                # HTB burst = cburst: tc's rate/HZ at HZ=250
SHAPE_FLOOR = 64 * 1024 + 1514      # one GSO skb and a frame
BUDGET_TIME_S = {"police": POLICE_TIME_S, "shape": 0.100}


def floor(enforce: str) -> int:
    return SHAPE_FLOOR if enforce == "shape" else POLICE_FLOOR


def mode_depth(rate_Bps: float, enforce: str = "police") -> int:
    """A host's bucket (police) or HTB burst (shape) for its rate, as the mode needs it."""
    time_s = SHAPE_TIME_S if enforce == "shape" else POLICE_TIME_S
    return max(floor(enforce), int(rate_Bps * time_s))


def budget(global_Bps: float, n_hosts: int, enforce: str = "police", configured: int | None = None) -> int:
    """The class's burst budget D in bytes: ``configured`` (or BUDGET_TIME_S of G), and at
    least one floor per host so that every host can pass what its mode must."""
    wanted = configured if configured is not None else int(global_Bps * BUDGET_TIME_S.get(enforce, POLICE_TIME_S))
    return max(wanted, max(1, n_hosts) * floor(enforce))


def host_depth(rate_Bps: float, global_Bps: float, n_hosts: int, budget_bytes: int, enforce: str = "police",
               burst_bytes: int | None = None) -> int:
    """This host's depth for its local rate: its share of ``budget_bytes`` (see the module
    docstring), capped by ``burst_bytes`` when the operator set one, else by the mode's rule."""
    low = floor(enforce)
    spare = max(0, budget_bytes - max(1, n_hosts) * low)
    share = min(1.0, rate_Bps / global_Bps) if global_Bps > 0 and math.isfinite(rate_Bps) else 1.0
    cap = burst_bytes if burst_bytes is not None else mode_depth(rate_Bps, enforce)
    return max(1, min(cap, low + int(spare * max(0.0, share))))
