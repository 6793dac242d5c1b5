"""What a host may send: the numbers the tick gossips and the status shows.

    local_limit(decision, local)        # the bucket rate, or what survives random drop
    safe_rate(conf, limit, n_nodes)     # the fail-safe rate the kernel falls back to
    slack_s(cfg, n_peers)               # how long after its last datagram a peer may still write
    send_gap_s(cfg, n_peers)            # the longest we may leave a peer without a datagram
    burst_budget(conf, limit, n_nodes)  # D: what all hosts may pass beyond the global rate
    host_burst(conf, limit, n_nodes, rate_Bps, enforce)   # this host's depth, its share of D
"""
from __future__ import annotations

from drl.agent.burst import budget, host_depth
from drl.agent.cluster.limits import Limit
from drl.agent.config.build import ClassConf, Config
from drl.agent.gossip.core import cycle_rounds
from drl.agent.model import Decision, Local, Mode
from drl.agent.step import safe_rate_Bps


def local_limit(d: Decision, local: Local) -> float:
    """What this host may send now: the bucket rate, or for random drop what survives it."""
    if d.mode == Mode.BUCKET:
        return d.limit_Bps
    if d.mode == Mode.DROP:
        return local.demand_Bps * (1.0 - d.drop_probability)
    return local.demand_Bps


def safe_rate(conf: ClassConf, limit: Limit, n_nodes: int) -> float:
    """The class's safe rate as configured, or its 1/N share of the global limit."""
    return safe_rate_Bps(limit.global_Bps, n_nodes, conf.safe_Bps)


def burst_budget(conf: ClassConf, limit: Limit, n_nodes: int) -> int:
    """The class's burst budget D (agent/burst.py) for its mode and the hosts there are now."""
    return budget(limit.global_Bps, n_nodes, _mode(conf), conf.burst_budget)


def host_burst(conf: ClassConf, limit: Limit, n_nodes: int, rate_Bps: float, enforce: str | None = None) -> int:
    """This host's bucket depth (or HTB burst) at rate_Bps: its share of the class's budget,
    at most --burst.  ``enforce``: the mode it is written for when not the class's own (a
    shaped class is policed until its first tick and at its safe rate)."""
    return host_depth(rate_Bps, limit.global_Bps, n_nodes, burst_budget(conf, limit, n_nodes),
                      enforce or _mode(conf), conf.burst_bytes)


def _mode(conf: ClassConf) -> str:
    return "shape" if conf.shaped else "police"


# What a loop's ticks may trail their schedule by, taken twice into the slack: a scrape, a GC
# pause or a busy CPU delays a tick by tens of ms (CI saw 511 ms once, with 20,000 classes),
# and a tick later than half the slack holds its classes to their safe rates (send_gap_s).
LOOP_JITTER_S = 0.2


def slack_s(cfg: Config, n_peers: int) -> float:
    """A peer's last config write is at most two gossip cycles, a tick and twice a loop's
    jitter after the last datagram we had from it: the slack of the stale rule
    (Membership.may_still_pass).  The peer keeps its side of it (send_gap_s)."""
    return (2 * cycle_rounds(n_peers, cfg.branching) + 1) * cfg.interval_s + 2 * LOOP_JITTER_S


def send_gap_s(cfg: Config, n_peers: int) -> float:
    """The longest this agent may leave a peer without a datagram and still write its own
    limit: half the slack, so that with one datagram lost in between our writes stay within
    slack_s of the last one the peer had (a loop held up longer is held to its safe rate,
    service/tick.py)."""
    return slack_s(cfg, n_peers) / 2
