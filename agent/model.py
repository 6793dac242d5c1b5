"""The values every layer passes around: measurements, peer views, messages, decisions.

The estimator fills a :class:`Local`, membership (or sim/views.py) a
:class:`PeerView`; an allocator (agent/allocators/, whose contract is documented
there) turns a :class:`Snapshot` into a :class:`Step`; the daemon writes its
:class:`Decision` to the datapath and hands its outbox of :class:`Envelope` to
gossip, whose wire format (agent/gossip/wire.py) carries the same bodies.  This module
imports nothing of the agent but its constants (agent/abi.py), so every layer
can import it.  Units: rates are bytes/s, volumes bytes, times seconds.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Protocol, Union

from drl.agent import abi


# FPS slow start ([Raghavan07] end of §3.2.2): 10 full frames a
# second (TCP's initial window) still pass a token bucket set below that rate
# (bpf/police.h police; agent/kernel/datapath.py writes it to every class config).
SLOW_START_Bps = 10 * 1514


# A value that decays (an EWMA'd rate in B/s, an FPS weight in flows) reaches exactly 0 below
# this magnitude instead of passing through denormals (1e-49 after 45 s of 0.1-per-second
# decay, 4e-323 later).  The wire carries values as float32, whose smallest normal is 1.2e-38,
# so without the snap a node kept a tiny weight of its own while its peers read it as exactly
# 0, and FPS line 10 gave each idle node the whole limit.  Far above float32's range, so every
# value it leaves non-zero reaches the peers non-zero; far below anything that matters (a
# millionth of a byte per second, of a flow).
ZERO_BELOW = 1e-6


def snap_zero(value: float) -> float:
    """``value``, or exactly 0.0 when its magnitude is below :data:`ZERO_BELOW`."""
    return value if value >= ZERO_BELOW or value <= -ZERO_BELOW else 0.0


# The values a tick makes for every class (thousands a tick) are NamedTuples: as immutable
# as a frozen dataclass, and a third of its cost to make (bench/agent_cost.py).  The hot
# paths make them positionally: with keywords a NamedTuple's __new__ takes a dict, twice the
# cost (a Snapshot: 695 against 367 ns).
_NO_INFO: Mapping[str, Any] = MappingProxyType({})


class Mode(enum.IntEnum):
    """What the BPF program does with a class (bpf/police.h police)."""
    PASS = abi.MODE_PASS
    BUCKET = abi.MODE_BUCKET
    DROP = abi.MODE_DROP


class Local(NamedTuple):
    """This node's measurements for one class over the last estimate interval (agent/estimator.py)."""
    demand_Bps: float                        # EWMA of arrivals: passed + dropped bytes
    sent_Bps: float = 0.0                    # EWMA of passed bytes
    flow_rates_Bps: tuple[float, ...] = ()   # EWMA rates of the sampled flows (FPS's sample set), unordered
    new_flows: int = 0                       # flows first seen during this interval
    sent_total_bytes: int = 0                # passed bytes since the class was created (volume quotas)
    refused_share: float = 0.0               # share of this interval's arrived bytes dropped (not smoothed)


@dataclass(frozen=True)
class PeerState:
    node_id: str
    value: float       # last published value (newest wins: agent/gossip/core.py, "Loss compensation")
    alive: bool
    age_s: float       # seconds since we last heard from it
    incarnation: int = 0   # its current life (agent/gossip/core.py header); 0 = unknown.  A new one
                           # means it restarted: what it held and its link state are gone


class PeerView(NamedTuple):
    """What membership + gossip know of the other nodes, with the stale policy applied.

    A stale peer's value counts as zero ([Raghavan07] §5.6), and
    what its datapath may still pass is kept out of the limit the alive nodes
    share (``reserved_Bps``, see effective_limit).
    """
    members: tuple[str, ...]                 # every current member id, self included, sorted
    peers: Mapping[str, PeerState]           # the other members (may be lazy); no entry = not a member
    remote_sum: float                        # sum of alive peers' values; stale ones count 0
    n_alive: int                             # alive peers, self excluded
    reserved_Bps: float | None = None        # what stale peers' datapaths may still pass; None: 1/N each
    unheard_by: int = 0                      # peers that may not hear us (heard_cap): alive ones that say
                                             # so, ones our late loop sent nothing too long (service/tick.py)
    stale_reserves: tuple[float, ...] = ()   # reserved_Bps peer by peer, largest first

    @property
    def n_nodes(self) -> int:
        return len(self.members)

    @property
    def n_stale(self) -> int:
        return self.n_nodes - 1 - self.n_alive


@dataclass(frozen=True)
class Transfer:
    """Move ``amount`` of an allocator's resource (rate in B/s, or quota bytes) from src to dst.

    ``link_total`` is the sender's link counter: everything it has ever moved to
    dst, so a receiver can rebuild lost state ([Behl12] link counters).
    """
    xfer_id: int
    amount: float
    link_total: float = 0.0


@dataclass(frozen=True)
class TransferAck:
    xfer_id: int
    accepted: bool = True
    link_total: float = 0.0


@dataclass(frozen=True)
class LeaseRequest:
    want_Bps: float


@dataclass(frozen=True)
class LeaseGrant:
    capacity_Bps: float
    ttl_s: float          # relative, so clocks need not agree
    refresh_s: float


@dataclass(frozen=True)
class Report:
    """Consumed and free amounts reported up a tree (DQMP's consumed-quota reports)."""
    consumed: float
    free: float


Body = Union[Transfer, TransferAck, LeaseRequest, LeaseGrant, Report]


@dataclass(frozen=True)
class Envelope:
    """A point-to-point message: ``dst`` on the way out, ``src`` on the way in."""
    body: Body
    dst: str = ""
    src: str = ""


class Snapshot(NamedTuple):
    now: float                    # seconds, monotonic on the agent, simulated time in sim/
    node_id: str
    interval_s: float
    global_Bps: float             # the configured global limit
    local: Local
    view: PeerView
    inbox: tuple[Envelope, ...] = ()


class Decision(NamedTuple):
    mode: Mode
    limit_Bps: float
    drop_probability: float = 0.0
    publish: float = 0.0
    quota_bytes: int | None = None            # byte allowance for the datapath, None = unlimited
    info: Mapping[str, Any] = _NO_INFO                   # allocator state shown by drlctl status


class Step(NamedTuple):
    state: Any
    decision: Decision
    outbox: tuple[Envelope, ...] = ()


class Allocator(Protocol):
    name: str

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> Any: ...

    def step(self, state: Any, snap: Snapshot) -> Step: ...


def effective_limit(snap: Snapshot) -> float:
    """What this node and the alive peers may pass together: the global limit less what the
    stale peers' datapaths may still pass (agent/gossip/membership.py), or, without that, less
    1/N for every stale peer ([Raghavan07] §5.6; the simulator's rule)."""
    view = snap.view
    if view.reserved_Bps is not None:
        return max(0.0, snap.global_Bps - view.reserved_Bps)
    return snap.global_Bps * (1 + view.n_alive) / max(1, view.n_nodes)


def heard_cap(d: Decision, view: PeerView, safe_Bps: float) -> Decision:
    """The decision of a host that some alive peer says it no longer hears (gossip's echo,
    agent/gossip/core.py): that peer counts it stale and reserves no more than the larger of
    its last told limit and its safe rate for it (agent/gossip/membership.py may_still_pass),
    so it may pass at most its safe rate, whatever it hears and its allocator decides.
    Without that, one-way loss let the silent host take its full share beside the
    reservation the others made for it."""
    if not view.unheard_by or (d.mode == Mode.BUCKET and d.limit_Bps <= safe_Bps):
        return d
    limit = min(d.limit_Bps, safe_Bps) if d.mode == Mode.BUCKET else safe_Bps
    return d._replace(mode=Mode.BUCKET, limit_Bps=limit, drop_probability=0.0,
                      info={**d.info, "unheard_by": view.unheard_by})


def ewma(previous: float | None, sample: float, weight: float) -> float:
    """new = weight*previous + (1-weight)*sample; ``weight`` is the share kept from the past."""
    if previous is None:
        return sample
    return weight * previous + (1.0 - weight) * sample
