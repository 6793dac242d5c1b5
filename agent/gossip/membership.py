"""Who is alive, what each peer last published, and the PeerView the allocators see.

    members = Membership("n1", transport.peer_addrs, liveness_timeout(0.1, n_peers=4, branching=2))
    for rx in transport.poll(now):
        members.observe(rx, now)
    view = members.view(class_key, now)       # agent/model.py PeerView of one class
    members.class_lost[class_key]             # its values lost on the way, all peers
    members.status(now)                       # rows for drlctl status
    members.set_peers({addr: "n2", ...}, timeout_s=...)   # the registry's set changed: N follows

N is this node plus one slot per peer address: the configured ones, or the
registry's current set (:meth:`Membership.set_peers`).  A slot is named by
``names`` (``--peers ID@HOST:PORT``, the registry's ids) or takes
the node id of whoever authenticates from that address
(agent/gossip/core.py checked MAC, identity, replay and incarnation before we see
it: a named slot only ever hears its own id, and a learned id keeps its slot
until the slot has been silent for the liveness timeout); until then it is a
placeholder ``?host:port``, stale.  Any accepted datagram (a
Batch of values, an empty one as a heartbeat, a point-to-point message) is a
sign of life; membership is per agent, values are per class.

The stale policy is the paper's conservative one ([Raghavan07] §5.6):
a peer not heard from for ``timeout_s`` counts with value 0 and is left out of
``n_alive``, so ``effective_limit`` (agent/model.py) drops the global limit by what its
datapath may still pass (:meth:`Membership.may_still_pass`; 1/N without a safe rate);
when it is heard again it counts again.  A restarted peer (another
incarnation: normally a higher one, or a lower one that gossip accepts again
after a higher one fell silent) starts with no values: only what it publishes
in its current life counts.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Collection, Iterator, Mapping, Sequence

from drl.agent.model import PeerState, PeerView
from drl.agent.gossip.core import Addr, Received, class_seq_gap, cycle_rounds
from drl.agent.gossip.peers import format_addr
from drl.agent.gossip.wire import Batch


_NOTHING = (0, 0.0, None)      # (seq, value, local_Bps) of a class a peer has not published
NEVER = -math.inf              # when a peer never heard was last heard


def alive(heard, now, timeout):
    """The stale rule, written once for the agent and for sim/views.py's 10,000 simulated
    views: a peer last heard at ``heard`` (NEVER: not yet) is alive at ``now`` while silent
    for at most ``timeout``.  Plain operators, so numpy arrays work as scalars do (elementwise)
    without the agent importing numpy; ``heard`` a float array where NEVER must be held."""
    return now - heard <= timeout


def reported(value, is_alive):
    """What a peer's value counts for under the stale rule: itself while the peer is alive,
    0 once it is stale ([Raghavan07] §5.6); scalars or numpy arrays, as ``alive``."""
    return value * is_alive


def _checked(timeout_s: float) -> float:
    if timeout_s <= 0:
        raise ValueError(f"liveness timeout must be > 0 s, got {timeout_s}")
    return timeout_s


def liveness_timeout(interval_s: float, n_peers: int, branching: int, misses: int = 3) -> float:
    """Silence after which a peer is stale: ``misses`` gossip cycles of ceil(n_peers/branching)
    intervals.  A peer reaches us at least once per 2 cycles (gossip.py shuffled round
    robin), so the default survives a lost update; a full mesh times out after 3 intervals."""
    return interval_s * misses * cycle_rounds(n_peers, branching)


@dataclass
class _Slot:
    addr: Addr
    node_id: str = ""
    incarnation: int = 0
    last_seen: float = NEVER
    lost: int = 0
    values: dict[int, tuple[int, float, float]] = field(default_factory=dict)   # class -> (seq, value, local)
    heard_us_s: float = math.inf    # how long before its last datagram it had last heard us (its echo)

    def name(self) -> str:
        return self.node_id or "?" + format_addr(self.addr)


class _Peers(Mapping[str, PeerState]):
    """One class's PeerStates, each built when an allocator asks for it (most read only
    the view's sums, and a tick views thousands of classes)."""
    __slots__ = ("_rows", "_class")

    def __init__(self, rows: dict, class_id: int):
        self._rows, self._class = rows, class_id

    def __getitem__(self, name: str) -> PeerState:
        _, values, alive, age, incarnation = self._rows[name]
        return PeerState(name, reported(values.get(self._class, _NOTHING)[1], alive), alive, age, incarnation)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def _safe_since(history: list[tuple[float, float]], since: float) -> float:
    """The largest safe rate in force at any time from ``since`` on (the one now for a peer
    never heard, since = -inf); history is sorted, its last entry in force now."""
    if since == -math.inf:
        return history[-1][1]
    return max(safe for k, (_, safe) in enumerate(history)
               if k + 1 == len(history) or history[k + 1][0] > since)


class Membership:
    def __init__(self, node_id: str, peer_addrs: Sequence[Addr], timeout_s: float,
                 names: Mapping[Addr, str] | None = None, failsafe_s: float = math.inf,
                 slack_s: float = 0.0) -> None:
        self.node_id, self.timeout_s = node_id, _checked(timeout_s)
        self.failsafe_s, self.slack_s = failsafe_s, slack_s      # the stale rule: may_still_pass
        names = names or {}
        self._slots = {addr: _Slot(addr, names.get(addr, "")) for addr in peer_addrs}
        self._named = {addr: node for addr, node in names.items() if addr in self._slots}
        self._homes = {node: addr for addr, node in self._named.items()}    # named id -> its address
        self.class_lost: collections.Counter[int] = collections.Counter()
        self._rows_at: tuple | None = None
        self._lost: frozenset[Addr] = frozenset()     # set_peers: gone from the registry unannounced
        self._safes: dict[int, list[tuple[float, float]]] = {}   # class -> [(since, safe rate)]: view's

    def set_peers(self, peers: Mapping[Addr, str | None], *, timeout_s: float | None = None,
                  slack_s: float | None = None, lost: Collection[Addr] = ()) -> None:
        """The peer set changed at runtime (a registry's watch): ``peers`` maps every current
        peer address to its node id, or None for an unnamed one (learned as at start).

        A peer that stays (same address, and the same id if it is named) keeps its slot:
        values, last_seen, incarnation, lost.  A removed one is gone at once (N shrinks;
        it is not stale, it is no member).  A new one, or an address now named with another
        id than it had, is a fresh slot: stale until heard, as at start.  So a node id that
        rejoins at a new address is a new slot there.  An unnamed slot whose learned id is
        now named elsewhere reverts to a placeholder (a named id speaks only from its home).

        ``timeout_s`` / ``slack_s``: the new liveness timeout and stale-rule slack, for a
        caller whose values follow N (liveness_timeout(interval, n_peers, branching));
        None keeps the current value (an explicit ``--peer-timeout`` stays fixed).

        ``lost`` (some of ``peers``): members that went without leaving (an expired lease).
        While one is still heard it counts as a member (cut off from the registry, not
        dead); once silent it leaves the view's members, but not N: its datapath keeps
        passing at the fail-safe of the N it knew, so it stays reserved by the stale rule
        (:meth:`may_still_pass`) and our safe rate stays the share of that N.  Out of N, a
        killed peer of two made the survivor's safe rate, and so the killed one's
        reservation, the whole limit (issue 43)."""
        if timeout_s is not None:
            self.timeout_s = _checked(timeout_s)
        if slack_s is not None:
            self.slack_s = slack_s
        self._named = {addr: node for addr, node in peers.items() if node}
        self._homes = {node: addr for addr, node in self._named.items()}
        self._slots = {addr: self._kept(addr) for addr in peers}
        self._lost = frozenset(lost) & self._slots.keys()
        self._rows_at = None

    def _kept(self, addr: Addr) -> _Slot:
        """``addr``'s slot under the new names (set_peers): the old one if it is still the same
        peer, else a fresh one."""
        name, slot = self._named.get(addr, ""), self._slots.get(addr)
        if slot is None or (slot.node_id not in ("", name) if name else slot.node_id in self._homes):
            return _Slot(addr, name)
        slot.node_id = slot.node_id or name
        return slot

    @property
    def n_nodes(self) -> int:
        """N: this host and every peer whose datapath may pass the class, lost ones included
        (their kernels keep the fail-safe of the N they knew, which counted us)."""
        return 1 + len(self._slots)

    def observe(self, rx: Received, now: float) -> None:
        """Record one accepted datagram (from gossip; unknown addresses are ignored)."""
        slot = self._slots.get(rx.addr)
        if slot is None:
            return
        self._rows_at = None
        h = rx.header
        if self._homes.get(h.node, rx.addr) != rx.addr or self._named.get(rx.addr, h.node) != h.node:
            return      # a named id from elsewhere, or another id at a named address: gossip rejects these
        if h.node != slot.node_id:
            slot = self._claim(rx.addr, h.node)
        if h.incarnation != slot.incarnation:
            slot.incarnation, slot.values = h.incarnation, {}
        if now >= slot.last_seen:
            slot.heard_us_s = h.dst_heard_ms / 1000 if h.dst_incarnation else math.inf
        slot.last_seen = max(slot.last_seen, now)
        slot.lost += rx.gap
        if isinstance(rx.payload, Batch):
            for v in rx.payload.values:
                # newest wins: a reordered older value never overwrites (see gossip.py on compensation)
                lost = class_seq_gap(v.seq, slot.values.get(v.key, _NOTHING)[0])
                if lost is not None:
                    slot.values[v.key] = (v.seq, v.value, v.local_Bps)
                    self.class_lost[v.key] += lost

    def _claim(self, addr: Addr, node_id: str) -> _Slot:
        """A new node id at ``addr``: forget the old one, and the id's old address."""
        for other, slot in self._slots.items():
            if slot.node_id == node_id:
                self._slots[other] = _Slot(other)
        slot = self._slots[addr] = _Slot(addr, node_id)
        return slot

    def _alive(self, slot: _Slot, now: float) -> bool:
        return alive(slot.last_seen, now, self.timeout_s)

    def view(self, class_id: int, now: float, safe_Bps: float | None = None) -> PeerView:
        """The allocator's view of ``class_id``: stale peers count 0 and are not in n_alive.
        With ``safe_Bps`` (the class's fail-safe rate) the view also reserves what every
        stale peer's datapath may still pass (:meth:`may_still_pass`)."""
        rows, members, n_alive, sums, stale, unheard = self._rows(now)
        reserved, each = None, []
        if safe_Bps is not None:
            heard = [now - age for _, age in stale if age < math.inf]     # a peer never heard: ours now
            history = self._safe_history(class_id, now, safe_Bps, heard)
            each = sorted((self.may_still_pass(values.get(class_id, _NOTHING)[2], now - age, now,
                                               _safe_since(history, now - age - self.timeout_s),
                                               deaf=not n_alive)
                           for values, age in stale), reverse=True)
            reserved = sum(each)
        return PeerView(members, _Peers(rows, class_id), sums.get(class_id, 0.0), n_alive, reserved, unheard,
                        tuple(each))

    def _safe_history(self, class_id: int, now: float, safe_Bps: float, last_seen: list[float]) -> list:
        """The class's safe rate from ``now`` on, noted after the ones before: a stale peer's
        datapath falls back to the safe rate of the limit and N it last knew, which a lowered
        limit (or a larger N) since has made larger than ours now.  Kept back to the oldest
        stale peer's last datagram, less a liveness timeout for a limit change that had not
        reached it yet; an alive peer was heard within a timeout, so that far back for it."""
        history = self._safes.setdefault(class_id, [])
        if not history or history[-1][1] != safe_Bps:
            history.append((now, safe_Bps))
        keep = min([*last_seen, now - self.timeout_s]) - self.timeout_s
        while len(history) > 1 and history[1][0] <= keep:
            history.pop(0)
        return history

    def may_still_pass(self, local_Bps: float | None, last_seen: float, now: float, safe_Bps: float,
                       deaf: bool = False) -> float:
        """What a silent peer's datapath may pass now: the larger of the local limit it last
        told us and the safe rate until its fail-safe has surely started (bpf/police.h
        policy_of), then the safe rate.  Not less than the safe rate before: a silent peer
        may be alive and unheard, holding itself to the safe rate (model.heard_cap).  Its last
        config write is within ``slack_s`` of the last datagram we had from it, so its
        fail-safe starts within failsafe_s +- slack_s of that.  A peer never heard, or that
        never told us this class's limit (or told no finite one), is counted at the safe rate.
        ``safe_Bps``: the largest the peer can have had since it was last heard (view,
        _safe_since).

        ``deaf``: we hear no peer at all.  Then every silent one counts at the safe rate
        alone, so that we pass our own safe rate at once, not what a peer's last local limit
        leaves (0.1 Mbit/s for 2 s; a survivor of two starved as long).  Either we are deaf
        and the peers, who hear our echo, hold themselves to their safe rates
        (model.heard_cap), or they all died and their fail-safes take over within
        failsafe_s + slack_s: the one stretch the hosts may pass more than the limit, by
        what the dead ones' last local limits exceeded their safe rates.  A peer's death
        beside others we hear keeps the full rule: they share what is left."""
        if local_Bps is None or last_seen == NEVER or deaf or not math.isfinite(local_Bps):
            return safe_Bps
        if now - last_seen < self.failsafe_s + self.slack_s:
            # at least the safe rate: it may be alive and not heard (one-way loss), holding
            # itself to the safe rate from when it learns we do not hear it (model.heard_cap)
            return max(local_Bps, safe_Bps)
        return safe_Bps

    def _rows(self, now: float) -> tuple[dict, tuple[str, ...], int, dict, list, int]:
        """At ``now``, worked out once for all the classes a tick views at one instant:
        {name: (name, values, alive, age, incarnation)} of every slot, the sorted member ids, the alive
        count, every class's sum over the alive peers (one pass over what they published,
        not a pass over the peers per class), the stale peers' (values, age), and how many
        alive peers said they had not heard us for longer than the liveness timeout."""
        if self._rows_at is None or self._rows_at[0] != now:
            every = {addr: (slot.name(), slot.values, self._alive(slot, now), now - slot.last_seen,
                            slot.incarnation) for addr, slot in self._slots.items()}
            # a lost member that fell silent is no member, only what its datapath may pass
            rows = {row[0]: row for addr, row in every.items() if row[2] or addr not in self._lost}
            sums: dict[int, float] = {}
            for _, values, alive, _, _ in rows.values():
                if alive:
                    for key, (_, value, _) in values.items():
                        sums[key] = sums.get(key, 0.0) + value
            stale = [(values, age) for _, values, alive, age, _ in every.values() if not alive]
            unheard = sum(1 for addr, slot in self._slots.items()
                          if every[addr][2] and slot.heard_us_s > self.timeout_s)
            self._rows_at = (now, (rows, tuple(sorted([self.node_id, *rows])),
                                   sum(row[2] for row in rows.values()), sums, stale, unheard))
        return self._rows_at[1]

    def status(self, now: float) -> list[dict]:
        """One row per peer for drlctl status: node_id, address, state (alive, stale, or lost:
        gone from the registry unannounced and silent, see set_peers), last_seen_s, lost, and
        hears_us: alive and its last datagram said it had heard us within the liveness timeout."""
        return [{"node_id": slot.name(), "address": format_addr(slot.addr),
                 "state": "alive" if self._alive(slot, now) else "lost" if addr in self._lost else "stale",
                 "last_seen_s": None if slot.last_seen == NEVER else now - slot.last_seen,
                 "incarnation": slot.incarnation, "lost": slot.lost,
                 "hears_us": self._alive(slot, now) and slot.heard_us_s <= self.timeout_s}
                for addr, slot in self._slots.items()]
