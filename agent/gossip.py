"""Gossip's socket-free core: datagrams in and out, validated and counted, no I/O.

The daemon drives it through agent/transport.py (a UDP socket around a
:class:`GossipCore`); the simulator drives one core per simulated node.

Design (000_efbf5459a9d12355.txt §3.1, §4.2):

* Each interval ``publish`` sends every class's value to ``branching`` peers (the
  paper's branching factor; branching >= peers is a full mesh).  Targets follow a
  random permutation of the peers, renewed every cycle (SWIM-style shuffled round
  robin) rather than independent draws: still random, but every peer hears from
  us at least once every 2*ceil(peers/branching) intervals, which is what lets
  membership time a silent peer out (membership.liveness_timeout).
* Sequence numbers run per (sender incarnation, receiver): with branching < peers a
  per-sender counter would show a gap whenever the sender picked someone else,
  so only a per-link counter makes gaps mean loss.  The header names the receiver
  (``dst``) once the sender has learned its node id, so a datagram captured on one
  link cannot be replayed into another.
* Loss compensation.  The paper gossips push-sum style shares, where a lost
  message loses mass, so the receiver scales the newest update's value and weight
  by the lost count.  Our updates carry the sender's latest absolute value, which
  supersedes every earlier one: a lost update loses nothing once a newer one
  arrives, and scaling would multiply a rate by the loss count.  So compensation
  here is "newest wins": a late (reordered) update never overwrites a newer one
  (membership keeps the highest seq per class), and losses are counted
  (``Received.gap``, ``Stats.lost``) for drlctl and the simulator.

Addresses are opaque hashables to the core: ``(host, port)`` for UDP, anything
the simulator likes.  Node ids are learned from authenticated headers; peers are
addressed by the configured address.
"""
from __future__ import annotations

import collections
import math
import random
import time
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from .model import Envelope
from .wire import Header, Heartbeat, Message, Payload, Reason, SeqWindow, Update, decode, encode

Addr = Hashable


def new_incarnation() -> int:
    """Wall-clock milliseconds: grows across restarts without a state file."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Received:
    """One accepted datagram: its header, payload, source address, and the datagrams
    lost on this link just before it (> 0 only when it is the newest yet)."""
    header: Header
    payload: Payload
    addr: Addr
    gap: int = 0

    @property
    def envelope(self) -> Envelope | None:
        """Point-to-point bodies as the allocator's inbox wants them; None for update/heartbeat."""
        if isinstance(self.payload, (Update, Heartbeat)):
            return None
        return Envelope(self.payload, src=self.header.node)


class Stats:
    """Counters for one limiter; ``control_bps`` is the control bandwidth in bits/s.

    Byte counters are UDP payload bytes; ``control_bps`` adds ``overhead_bytes`` of
    IP+UDP headers per datagram (28 for IPv4) so it compares with the paper's
    48-byte updates (000_efbf5459a9d12355.txt §5.6: 48 x 20/s x br=3 = 2.88 kbit/s).
    """

    def __init__(self, window_s: float = 10.0, overhead_bytes: int = 28) -> None:
        self.window_s = window_s
        self.overhead_bytes = overhead_bytes
        self.sent = self.sent_bytes = self.received = self.received_bytes = 0
        self.lost = self.unroutable = self.send_errors = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_bytes = 0

    def count_sent(self, nbytes: int, now: float) -> None:
        self.sent += 1
        self.sent_bytes += nbytes
        wire = nbytes + self.overhead_bytes
        self._recent.append((now, wire))
        self._recent_bytes += wire

    def control_bps(self, now: float) -> float:
        """Bits/s sent over the last ``window_s`` seconds, IP+UDP headers included."""
        while self._recent and self._recent[0][0] <= now - self.window_s:
            self._recent_bytes -= self._recent.popleft()[1]
        return 8.0 * self._recent_bytes / self.window_s

    def as_dict(self, now: float) -> dict:
        """For drlctl status and metrics (JSON: _bps keys are bits/s; counts are datagrams)."""
        return {
            "sent": self.sent, "received": self.received, "lost": self.lost,
            "rejected": sum(self.rejected.values()),
            "rejected_by_reason": {r: n for r, n in sorted(self.rejected.items())},
            "bytes_sent": self.sent_bytes, "bytes_received": self.received_bytes,
            "unroutable": self.unroutable, "send_errors": self.send_errors,
            "control_bps": self.control_bps(now),
        }


class Cycle:
    """Shuffled round robin over n indexes in O(1) memory: a random affine permutation
    i -> (offset + i*stride) mod n per cycle, so 10,000 simulated nodes need no
    per-node copy of the peer list."""
    __slots__ = ("n", "rng", "offset", "stride", "i")

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n, self.rng, self.i = n, rng, n

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.i == self.n:
                self._reshuffle()
            idx = (self.offset + self.i * self.stride) % self.n
            self.i += 1
            if idx not in out:       # only at a cycle boundary; that peer was just served
                out.append(idx)
        return out

    def _reshuffle(self) -> None:
        self.offset = self.rng.randrange(self.n)
        self.stride = self.rng.randrange(1, self.n) if self.n > 1 else 1
        while math.gcd(self.stride, self.n) != 1:
            self.stride = self.rng.randrange(1, self.n)
        self.i = 0


class PeerList(tuple):
    """Configured peer addresses in order, with O(1) ``in``."""

    def __new__(cls, addrs):
        self = super().__new__(cls, addrs)
        self._set = frozenset(self)
        return self

    def __contains__(self, addr) -> bool:
        return addr in self._set


class GossipCore:
    """Everything but the socket: datagrams in, datagrams out, no I/O, time passed in.

    ``publish(values, now)`` and ``route(env, class_id, now)`` return (addr, bytes)
    to put on the wire; ``receive(data, addr, now)`` returns a :class:`Received`
    or None (the reason is counted in ``stats.rejected``).  ``key=None`` is insecure
    mode.  The simulator drives one core per simulated node.

    ``peers`` is kept as given, not copied: anything with ``len``, indexing and a
    fast ``in`` (a :class:`PeerList`, or a simulator's lazy "everyone but me" over
    10,000 ids), so per-node memory grows only with the peers actually talked to.
    """

    def __init__(self, node_id: str, cluster: str, key: bytes | None, peers: Sequence[Addr],
                 branching: int, incarnation: int, rng: random.Random | None = None,
                 stats: Stats | None = None) -> None:
        if branching < 1:
            raise ValueError(f"gossip branching must be >= 1, got {branching}")
        self.node_id, self.cluster, self.key = node_id, cluster, key
        self.peers = peers
        self.branching, self.incarnation = branching, incarnation
        self.stats = stats or Stats()
        self._cycle = Cycle(len(self.peers), rng or random.Random())
        self._seq: dict[Addr, int] = {}                          # next seq per receiver
        self._windows: dict[str, tuple[int, SeqWindow]] = {}     # node -> (incarnation, window)
        self._addr_of: dict[str, Addr] = {}                      # learned: node id -> address
        self._node_at: dict[Addr, str] = {}                      # learned: address -> node id

    def targets(self) -> list[Addr]:
        """This interval's targets: every peer if ``branching`` covers them, else the next ``branching``."""
        if self.branching >= len(self.peers):
            return list(self.peers)
        return [self.peers[i] for i in self._cycle.take(self.branching)]

    def publish(self, values: Mapping[int, float], now: float) -> list[tuple[Addr, bytes]]:
        """One Update per class to each target; a Heartbeat each when ``values`` is empty."""
        out = []
        for addr in self.targets():
            if not values:
                out.append((addr, self._datagram(addr, 0, Heartbeat(), now)))
            for class_id, value in values.items():
                out.append((addr, self._datagram(addr, class_id, Update(float(value)), now)))
        return out

    def route(self, env: Envelope, class_id: int, now: float) -> tuple[Addr, bytes] | None:
        """The datagram carrying ``env`` to ``env.dst``; None (counted) before we know its address."""
        addr = self._addr_of.get(env.dst)
        if addr is None:
            self.stats.unroutable += 1
            return None
        return addr, self._datagram(addr, class_id, env.body, now)

    def _datagram(self, addr: Addr, class_id: int, payload: Payload, now: float) -> bytes:
        seq = self._seq.get(addr, 0) + 1
        self._seq[addr] = seq
        header = Header(cluster=self.cluster, node=self.node_id, dst=self._node_at.get(addr, ""),
                        class_id=class_id, seq=seq, sent_at=now, incarnation=self.incarnation)
        data = encode(Message(header, payload), self.key)
        self.stats.count_sent(len(data), now)
        return data

    def receive(self, data: bytes, addr: Addr, now: float) -> Received | None:
        """Validate one datagram from ``addr``; never raises."""
        if addr not in self.peers:              # before the MAC: strangers cost nothing
            return self.reject(Reason.UNKNOWN_PEER)
        msg = decode(data, self.key, self.cluster)
        if isinstance(msg, Reason):
            return self.reject(msg)
        h = msg.header
        if h.node == self.node_id:
            return self.reject(Reason.LOOP)
        if h.dst and h.dst != self.node_id:
            return self.reject(Reason.WRONG_DST)
        gap = self._sequence(h)
        if isinstance(gap, Reason):
            return self.reject(gap)
        self._learn(h.node, addr)
        self.stats.received += 1
        self.stats.received_bytes += len(data)
        self.stats.lost += gap
        return Received(h, msg.payload, addr, max(gap, 0))

    def _sequence(self, h: Header) -> int | Reason:
        """Replay check and loss count; a new incarnation (restarted peer) gets a fresh window."""
        known = self._windows.get(h.node)
        if known is None or h.incarnation > known[0]:
            known = (h.incarnation, SeqWindow())
            self._windows[h.node] = known
        elif h.incarnation < known[0]:
            return Reason.OLD_INCARNATION
        gap = known[1].accept(h.seq)
        return Reason.REPLAYED if gap is None else gap

    def _learn(self, node: str, addr: Addr) -> None:
        if self._node_at.get(addr) != node:
            self._addr_of.pop(self._node_at.get(addr, ""), None)
            self._node_at[addr] = node
        self._addr_of[node] = addr

    def reject(self, reason: Reason) -> None:
        self.stats.rejected[reason.value] += 1
        return None
