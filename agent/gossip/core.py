"""Gossip's socket-free core: datagrams in and out, validated and counted, no I/O.

The daemon drives it through agent/gossip/transport.py (a UDP socket around a
:class:`GossipCore`); the simulator drives one core per simulated node.

Design ([Raghavan07] §3.1, §4.2):

* Each interval ``publish`` sends the classes' values to ``branching`` peers (the
  paper's branching factor; branching >= peers is a full mesh), all classes for
  one peer together in as few datagrams as they fit (wire.Batch, ~13 bytes a
  class).  A class with demand or a changed value goes every round; a quiet
  one goes REPEATS times after its last change, then rests (once every
  REFRESH_ROUNDS rounds), so thousands of idle classes cost nothing.  Targets follow a
  random permutation of the peers, renewed every cycle (SWIM-style shuffled round
  robin) rather than independent draws: still random, but every peer hears from
  us at least once every 2*ceil(peers/branching) intervals, which is what lets
  membership time a silent peer out (membership.liveness_timeout).
* Sequence numbers run per (sender incarnation, receiver): with branching < peers a
  per-sender counter would show a gap whenever the sender picked someone else,
  so only a per-link counter makes gaps mean loss.  Inside a Batch each class
  has its own per-link sequence number, for newest-wins and its own loss count.  The header names the receiver
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

* Identity.  The cluster key says a datagram comes from *some* member; the
  source address and the header's node id say which, and both must agree with
  what we know (:meth:`GossipCore._may_speak`, before the replay window, so a
  wrong id never touches another peer's window): a peer named ``--peers
  ID@HOST:PORT`` is the only id that may speak from that address, and it may
  speak from no other; an unnamed peer's id is learned from its first
  authenticated datagram and then bound the same way until the address has
  been silent for ``timeout_s`` (the liveness timeout), so a replaced host can
  rejoin.  Anything else is ``wrong_sender``.
* Per-node keys (``keys``, agent/gossip/signing.py).  Each datagram is signed with our own
  key, and one is accepted only if it verifies under a key registered for the node id in
  its header (the peer keys file's, or the registry's: ``set_registry_keys``), so a host
  holding its own key speaks as no other, whatever address it sends from; the address
  binding above still holds.  A failed verification costs ~60-190 us, so each source
  address may fail at most VERIFY_FAILURES_PER_S a second (a bucket as deep): past that
  its datagrams are dropped unverified (``over_budget``) until the bucket refills, so a
  flood from a peer's address costs at most that many verifications a second (a peer
  that verifies spends nothing; docs/security.md "Per-node keys").  Once a peer and we hold
  each other's X25519 keys (agent/gossip/pairs.py: a signed Hello each way), the datagrams
  between us carry an HMAC under the key only the two of us can derive instead of a
  signature: the same proof for the receiver at ~3 us instead of ~200.
* Incarnations (:class:`~agent.lives.Lives`): a higher incarnation is a restart, but one that
  falls silent for ``timeout_s`` no longer shouts down the lower one still
  speaking, so a forged (or clock-skewed) jump cannot lock the real peer out.
* Lives and echo.  Every datagram names the receiver's life as the sender last heard
  it (``dst_incarnation``; 0 before it has heard any) and how long ago the sender last
  heard the receiver (``dst_heard_ms``).  A datagram naming another life of ours is
  dropped (``other_life``): a restarted agent accepts nothing sent to its previous
  life, so a capture replayed into it after the restart is refused although its replay
  windows started over.  A capture can only be of datagrams naming a life: what a peer
  sends before it has heard us names none, and says it has never heard us, which holds
  us to our safe rate (next point) for as long as it is all we get from that peer.
  The echo tells a host whether its peers hear it: one that a peer no longer counts
  alive is held to its safe rate (model.heard_cap), the most that peer reserves for
  it, however well it hears the peer (one-way loss).
* Bounds.  wire.py drops a datagram with any number outside its bounds
  (agent/units.py); the sign of a class's published value is judged here, where
  the owner says which classes may publish below 0 (``signed``, by class key:
  a GDRL indicator is compared, never summed).  Any other negative value (a
  weight, a rate, an amount) would take from the others' shares in every sum
  it enters (one peer's -max(weights) gave FPS 2x its limit), so its datagram
  is dropped whole and counted (``out_of_range``), never clamped into use.

Addresses are opaque hashables to the core: ``(host, port)`` for UDP, anything
the simulator likes.  Unnamed peers' node ids are learned from authenticated
headers; peers are addressed by the configured address.
"""
from __future__ import annotations

import collections
import math
import random
import time
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Callable, Hashable, Mapping, NamedTuple, Sequence

from drl.agent.model import Envelope
from drl.agent.gossip.lives import Lives
from drl.agent.gossip.pairs import Pairs
from drl.agent.gossip.signing import MAX_KEYS_PER_NODE, Ed25519PublicKey, NodeKeys, parse_public, public_text
from drl.agent.gossip.wire import (AUTH_BYTES, MAX_DATAGRAM, Batch, ClassClients, ClassValue, Header, Hello, LimitNote,
                                   Message, Payload, Reason, Sums, decode, encode, pack, pack_reports, pack_sums,
                                   signer)

CLUSTER = "drl"     # one cluster per key; the header field keeps two keyed clusters apart on one port

Addr = Hashable

CLASS_SEQS = 16383      # a class's per-link sequence numbers run 1..16383 and wrap: two varint bytes
REPEATS = 3             # a quiet class's unchanged value goes to every peer this many times, then rests
REFRESH_ROUNDS = 100    # ... and once more every this many rounds, in case every repeat was lost
ANNOUNCE_ROUNDS = 3     # a limit changed here goes to every peer in this many rounds
HEARD_MS_MAX = 2**32 - 1   # dst_heard_ms for a peer never counted alive (and the most it says: 49 days)
VERIFY_FAILURES_PER_S = 50  # per-node keys: failed verifications an address may cost a second (~1 % of a core)

_new_tuple = tuple.__new__


class Outgoing(NamedTuple):
    """One class's value for this round; an ``active`` class (it has demand) goes every round.
    ``local_Bps``: what our datapath may pass for the class, for the peers' stale rule.
    (A NamedTuple, like wire.ClassValue: thousands a tick, a third of a frozen dataclass's cost.)"""
    value: float
    version: int = 0
    active: bool = True
    local_Bps: float = 0.0


def cycle_rounds(n_peers: int, branching: int) -> int:
    """Rounds in which every peer is a target once: ceil(n_peers / branching), at least 1."""
    return max(1, -(-n_peers // max(1, branching)))


def class_seq_gap(new: int, old: int) -> int | None:
    """How many of a class's values were lost between ``old`` and ``new`` (serial-number
    arithmetic, RFC 1982: 1..CLASS_SEQS wrap), or None when ``new`` is not newer; ``old`` 0
    means nothing heard yet."""
    if not old:
        return 0
    ahead = (new - old) % CLASS_SEQS
    return ahead - 1 if 0 < ahead <= CLASS_SEQS // 2 else None


class _Said:
    """What a class last published, and the round it changed."""
    __slots__ = ("said", "changed")

    def __init__(self, said: Outgoing, changed: int) -> None:
        self.said, self.changed = said, changed


def _unsigned(key: int) -> bool:
    return False


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
        if isinstance(self.payload, Batch):
            return None
        return Envelope(self.payload, src=self.header.node)


class Stats:
    """Counters for one limiter; ``control_bps`` is the control bandwidth in bits/s.

    Byte counters are UDP payload bytes; ``control_bps`` adds ``overhead_bytes`` of
    IP+UDP headers per datagram (28 for IPv4) so it compares with the paper's
    48-byte updates ([Raghavan07] §5.6: 48 x 20/s x br=3 = 2.88 kbit/s).
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

    ``publish(classes, now)`` and ``route(env, class_id, now)`` return (addr, bytes)
    to put on the wire; ``receive(data, addr, now)`` returns a :class:`Received`
    or None (the reason is counted in ``stats.rejected``).  ``key=None`` is insecure
    mode.  The simulator drives one core per simulated node.

    ``names`` maps configured peer addresses to their node ids (``--peers
    ID@HOST:PORT``): only that id may speak from that address, and from no
    other.  ``timeout_s`` is the liveness timeout: how long a learned (unnamed)
    id stays bound to its address after its last datagram, and how long a silent
    higher incarnation keeps shouting down a lower one (:class:`~agent.lives.Lives`); the
    default (never) is for tests, the daemon passes ``--peer-timeout``.

    ``peers`` is kept as given, not copied: anything with ``len``, indexing and a
    fast ``in`` (a :class:`PeerList`, or a simulator's lazy "everyone but me" over
    10,000 ids), so per-node memory grows only with the peers actually talked to.
    :meth:`set_peers` replaces it (and ``names``) when the membership changes.
    """
    KEEP_GONE = 16      # removed peers whose link counters are kept, at least (set_peers says why)

    def __init__(self, node_id: str, cluster: str, key: bytes | None, peers: Sequence[Addr],
                 branching: int, incarnation: int, rng: random.Random | None = None,
                 stats: Stats | None = None, *, names: Mapping[Addr, str] | None = None,
                 timeout_s: float = math.inf, keys: NodeKeys | None = None) -> None:
        if branching < 1:
            raise ValueError(f"gossip branching must be >= 1, got {branching}")
        self.node_id, self.cluster, self.key = node_id, cluster, key
        self.peers = peers
        self.branching, self.incarnation = branching, incarnation
        self.stats = stats or Stats()
        self._cycle = Cycle(len(self.peers), rng or random.Random())
        self._seq: dict[Addr, int] = {}                          # next seq per receiver
        self._sent: dict[Addr, float] = {}                       # last datagram built, per receiver
        self.timeout_s = timeout_s
        self._lives: dict[str, Lives] = {}                      # per sender node id
        self._node_at: dict[Addr, str] = {}
        self._bind(names or {})                                 # _names, _homes, _node_at, _addr_of
        self._heard: dict[Addr, float] = {}                      # last datagram accepted, per address
        self._said: dict[int, _Said] = {}                        # per class key
        self._seqs: dict[Addr, dict[int, int]] = {}              # per peer, per class key: last seq
        self._full: set[Addr] = set()                            # restarted peers: every class next time
        self._pending: dict[Addr, dict[int, LimitNote]] = {}     # limit notes for one peer
        self._announce: dict[int, tuple[LimitNote, int]] = {}    # limit notes for all: rounds left
        self._gone: dict[Addr, None] = {}                        # removed peers with link counters, oldest first
        self._round = 0
        self.signed: Callable[[int], bool] = _unsigned           # class keys whose values may be below 0
        self.keys = keys                                         # per-node keys; None: the cluster key alone
        self.pairs = Pairs(cluster, node_id) if keys is not None else None
        self._registry_keys: dict[str, tuple[Ed25519PublicKey, ...]] = {}
        self._failures: dict[Addr, tuple[float, float]] = {}     # per address: (bucket level, when)

    def set_keys(self, keys: NodeKeys) -> None:
        """Per-node keys re-read (a reload): signed with the new identity from now on, verified
        under the new peer keys (a rotation lists a node's old and new key while it changes).
        A pair whose Hello verified under a key no longer listed ends; a new identity of ours
        says Hello to every peer again, signed with it (pairs.py)."""
        old, self.keys = self.keys, keys
        if self.pairs is None:
            self.pairs = Pairs(self.cluster, self.node_id)
            return
        self.pairs.retire(self._listed)
        if old is None or public_text(old.identity) != public_text(keys.identity):
            self.pairs.renew()

    def set_registry_keys(self, published: Mapping[str, Sequence[str]]) -> None:
        """The public keys the registry's members publish (node id -> base64 texts); one that
        does not parse is left out (it is the member's to fix, and shows as unknown_key)."""
        out = {}
        for node, texts in published.items():
            parsed = []
            for text in list(texts)[:MAX_KEYS_PER_NODE]:
                try:
                    parsed.append(parse_public(text))
                except ValueError:
                    continue
            out[node] = tuple(parsed)
        self._registry_keys = out
        if self.pairs is not None:
            self.pairs.retire(self._listed)

    def keys_of(self, node: str) -> tuple[Ed25519PublicKey, ...]:
        """The public keys ``node`` may sign with: the peer keys file's, else the registry's."""
        return self.keys.peers.get(node) or self._registry_keys.get(node, ())

    def _listed(self, node: str) -> list[str]:
        return [public_text(k) for k in self.keys_of(node)]

    def set_peers(self, peers: Sequence[Addr], names: Mapping[Addr, str] | None = None,
                  timeout_s: float | None = None) -> None:
        """The peer set changed at runtime (a registry's watch): ``peers`` and ``names`` as for
        the constructor, ``timeout_s`` the new liveness timeout (None keeps it).

        A new list starts a new shuffled round robin, so every peer, new ones too, is a target
        within one cycle (an unchanged list keeps its cycle, whose bound liveness relies on).
        A new peer gets every class in its first Batch, like a restarted one.  A removed peer
        is never a target again, its datagrams are unknown_peer, and what we knew of it is
        forgotten: its id's binding and lives, its pending limit notes.  Only its link counters
        (``_seq``, ``_seqs``) are kept, for the last max(KEEP_GONE, len(peers)) removed peers:
        one whose registry lease merely lapsed still runs and remembers them, and counters
        started over would be refused as replays (its window) and their values as older ones
        (newest wins) until they caught up."""
        if timeout_s is not None:
            self.timeout_s = timeout_s
        if tuple(peers) != tuple(self.peers):
            self._replace(peers)
        bound = set(self._node_at.values())
        self._bind(names or {})
        for node in bound.difference(self._node_at.values()):
            self._lives.pop(node, None)

    def _replace(self, peers: Sequence[Addr]) -> None:
        """Target ``peers`` from now on; forget what was only for the removed ones."""
        gone = [addr for addr in self.peers if addr not in peers]
        joined = [addr for addr in peers if addr not in self.peers]
        self.peers = peers
        self._cycle = Cycle(len(peers), self._cycle.rng)
        self._full.update(joined)
        for addr in gone:
            self._full.discard(addr)
            self._heard.pop(addr, None)
            self._sent.pop(addr, None)
            self._pending.pop(addr, None)
        for addr in joined:
            self._gone.pop(addr, None)              # a lapsed lease renewed: its counters go on
        self._gone.update(dict.fromkeys(gone))
        while len(self._gone) > max(self.KEEP_GONE, len(peers)):
            addr = next(iter(self._gone))
            del self._gone[addr]
            self._seq.pop(addr, None)
            self._seqs.pop(addr, None)

    def _bind(self, names: Mapping[Addr, str]) -> None:
        """Bind each named peer's id to its address (``names``, only our peers'); a learned
        binding stays while its address is still a peer and its id is not named elsewhere."""
        self._names = {addr: node for addr, node in names.items() if addr in self.peers}
        self._homes = {node: addr for addr, node in self._names.items()}    # named id -> its address
        learned = {addr: node for addr, node in self._node_at.items()
                   if addr in self.peers and node not in self._homes}
        self._node_at = {**learned, **self._names}                            # named or learned: address -> id
        self._addr_of = {node: addr for addr, node in self._node_at.items()}  # and back

    def overdue(self, now: float, gap_s: float) -> int:
        """The peers we sent a datagram before but none for longer than ``gap_s``: a loop so
        late that they may count us stale while our datapath still passes our limit."""
        sent = self._sent
        return sum(1 for addr in self.peers if now - sent.get(addr, now) > gap_s)

    def targets(self) -> list[Addr]:
        """This interval's targets: every peer if ``branching`` covers them, else the next ``branching``."""
        if self.branching >= len(self.peers):
            return list(self.peers)
        return [self.peers[i] for i in self._cycle.take(self.branching)]

    def publish(self, classes: Mapping[int, Outgoing], now: float) -> list[tuple[Addr, bytes]]:
        """This round's Batches: to each target the classes due (see :meth:`_due`), as many
        a datagram as fit, or one empty Batch as a heartbeat; limit notes (:meth:`announce`)
        to whoever they are for, target or not."""
        self._round += 1
        targets = self.targets()
        due = self._due(classes)
        broadcast = self._broadcast_notes()
        out = []
        for addr in dict.fromkeys([*targets, *self._pending, *(self.peers if broadcast else ())]):
            values = []
            if addr in targets:
                everything = addr in self._full
                self._full.discard(addr)
                values = self._stamp(addr, list(classes.items()) if everything else due)
            notes = broadcast + list(self._pending.pop(addr, {}).values())
            for batch in pack(values, notes, self._room(addr)):
                out.append((addr, self._datagram(addr, 0, batch, now)))
        return out + self._hellos(now)

    def _hellos(self, now: float) -> list[tuple[Addr, bytes]]:
        """Per-node keys: the Hellos due this round (pairs.py), to any peer, target or not."""
        if self.pairs is None:
            return []
        out = []
        for addr in self.peers:
            say = self.pairs.hello(addr, self._node_at.get(addr, ""), now)
            if say is not None:
                out.append((addr, self._datagram(addr, 0, Hello(*say), now)))
        return out

    def report_clients(self, reports: list[ClassClients], now: float) -> list[tuple[Addr, bytes]]:
        """The classes' per-client reports to every peer, as few datagrams as fit: a client's
        global count must be whole within a round (docs/clients.md "Over the threshold"),
        so not to this round's targets only; they exist only while a class has heavy clients."""
        if not reports:
            return []
        return [(addr, self._datagram(addr, 0, payload, now))
                for addr in self.peers for payload in pack_reports(reports, self._room(addr))]

    def announce(self, note: LimitNote, addr: Addr | None = None) -> None:
        """Send a class's limit to ``addr`` in the next round, or to every peer in the next
        ANNOUNCE_ROUNDS rounds (a change made here: every peer must hear it, loss or not)."""
        if addr is None:
            self._announce[note.key] = (note, ANNOUNCE_ROUNDS)
        else:
            self._pending.setdefault(addr, {})[note.key] = note

    def _broadcast_notes(self) -> list[LimitNote]:
        notes = [note for note, _ in self._announce.values()]
        self._announce = {k: (note, left - 1) for k, (note, left) in self._announce.items() if left > 1}
        return notes

    def _due(self, classes: Mapping[int, Outgoing]) -> list[tuple[int, Outgoing]]:
        """(key, what it says) of the classes this round's targets get: active ones, and a
        quiet one for as many rounds after its last change as it takes every peer to hear
        it REPEATS times, then for one cycle every REFRESH_ROUNDS rounds (in case every
        repeat was lost).  Decided once per round, not per peer: thousands of classes."""
        cycle = cycle_rounds(len(self.peers), self.branching)
        now, out = self._round, []
        said = self._said
        for key, o in classes.items():
            s = said.get(key)
            if s is None:
                s = said[key] = _Said(o, now)
            elif s.said != o:
                s.said, s.changed = o, now
            quiet = now - s.changed
            if o.active or quiet < REPEATS * cycle or quiet % REFRESH_ROUNDS < cycle:
                out.append((key, o))
        if len(said) > len(classes):                      # classes removed since
            self._forget([k for k in said if k not in classes])
        return out

    def _forget(self, keys: list[int]) -> None:
        for key in keys:
            del self._said[key]
            for seqs in self._seqs.values():
                seqs.pop(key, None)

    def _stamp(self, addr: Addr, entries: list[tuple[int, Outgoing]]) -> list[ClassValue]:
        """The entries for ``addr`` with their per-(link, class) sequence numbers."""
        seqs = self._seqs.setdefault(addr, {})
        keys = [key for key, _ in entries]
        stamped = [seq % CLASS_SEQS + 1 for seq in map(seqs.get, keys, repeat(0))]
        seqs.update(zip(keys, stamped))
        # tuple.__new__: a NamedTuple's own __new__ is a Python function that costs as much again
        return [_new_tuple(ClassValue, (key, seq, o.value, o.version, o.local_Bps))
                for key, seq, o in zip(keys, stamped, map(itemgetter(1), entries))]

    def _room(self, addr: Addr) -> int:
        """Bytes a Batch may take in a datagram to ``addr``: what its header and tag leave."""
        header = Header(cluster=self.cluster, node=self.node_id, dst=self._node_at.get(addr, ""),
                        seq=2**64 - 1, sent_at=1.0, incarnation=self.incarnation,
                        dst_incarnation=2**64 - 1, dst_heard_ms=HEARD_MS_MAX)
        auth = AUTH_BYTES if self.keys is not None else 0
        return MAX_DATAGRAM - len(encode(Message(header, Batch()), self.key)) - auth

    def route(self, env: Envelope, class_id: int, now: float) -> tuple[Addr, bytes] | None:
        """The datagram carrying ``env`` to ``env.dst``; None (counted) before we know its address."""
        addr = self._addr_of.get(env.dst)
        if addr is None:
            self.stats.unroutable += 1
            return None
        return addr, self._datagram(addr, class_id, env.body, now)

    def knows(self, node: str) -> bool:
        """Whether we know ``node``'s address (named, or learned from its datagrams)."""
        return node in self._addr_of

    def sums(self, node: str, sums: Sums, now: float) -> list[tuple[Addr, bytes]]:
        """The datagrams carrying ``sums`` to ``node`` (agent/gossip/tree.py); none before we know
        its address (the tree sends only to peers it ``knows``)."""
        addr = self._addr_of.get(node)
        if addr is None:
            return []
        return [(addr, self._datagram(addr, 0, part, now)) for part in pack_sums(sums, self._room(addr))]

    def _datagram(self, addr: Addr, class_id: int, payload: Payload, now: float) -> bytes:
        """One datagram to ``addr``, naming its life as we last heard it and how long ago we last
        counted it alive (the handshake and the echo of the module docstring)."""
        seq = self._seq.get(addr, 0) + 1
        self._seq[addr] = seq
        self._sent[addr] = now
        node = self._node_at.get(addr, "")
        lives = self._lives.get(node)
        heard = self._heard.get(addr)
        heard_ms = HEARD_MS_MAX if heard is None else min(HEARD_MS_MAX, round((now - heard) * 1000))
        header = Header(cluster=self.cluster, node=self.node_id, dst=node, class_id=class_id, seq=seq,
                        sent_at=now, incarnation=self.incarnation,
                        dst_incarnation=(lives and lives.current) or 0, dst_heard_ms=max(0, heard_ms))
        # a Hello is signed always: it is what the pair key is agreed by
        pair = None if self.pairs is None or isinstance(payload, Hello) else self.pairs.sending_key(node)
        data = encode(Message(header, payload), self.key, self.keys and self.keys.identity, pair)
        self.stats.count_sent(len(data), now)
        return data

    def receive(self, data: bytes, addr: Addr, now: float) -> Received | None:
        """Validate one datagram from ``addr``; never raises.  None: rejected (the reason
        counted), or a Hello, which the core takes itself (pairs.py)."""
        if addr not in self.peers:              # before the MAC: strangers cost nothing
            return self.reject(Reason.UNKNOWN_PEER)
        if self.keys is None:
            msg = decode(data, self.key, self.cluster)
        elif self._budget(addr, now) < 1.0:
            return self.reject(Reason.OVER_BUDGET)
        else:
            msg = decode(data, self.key, self.cluster, self.keys_of, self.pairs.key)
            if msg is Reason.BAD_SIGNATURE:
                self._failures[addr] = (self._budget(addr, now) - 1.0, now)
        if isinstance(msg, Reason):
            return self.reject(msg)
        if isinstance(msg.payload, Batch) and not self._signs_ok(msg.payload):
            return self.reject(Reason.OUT_OF_RANGE)
        h = msg.header
        if h.node == self.node_id:
            return self.reject(Reason.LOOP)
        if h.dst and h.dst != self.node_id:
            return self.reject(Reason.WRONG_DST)
        if h.dst_incarnation and h.dst_incarnation != self.incarnation:
            # addressed to our life before a restart: a replay of what was sent to it, or a
            # peer that has not heard this life yet (our next datagram tells it).  A transfer
            # credited to this life would count capacity twice (docs/allocators.md "Rejoin")
            return self.reject(Reason.OTHER_LIFE)
        if not self._may_speak(h.node, addr, now):      # before the window: a wrong id touches nothing
            return self.reject(Reason.WRONG_SENDER)
        lives = self._lives.get(h.node)
        if lives is None:
            lives = self._lives[h.node] = Lives()
        before = lives.current
        gap = lives.accept(h.incarnation, h.seq, now, self.timeout_s)
        if isinstance(gap, Reason):
            return self.reject(gap)
        if before is not None and before != h.incarnation:    # restarted: it forgot what we told it, so
            self._full.add(addr)                          # tell it everything again
        self._learn(h.node, addr)
        self._heard[addr] = max(self._heard.get(addr, now), now)
        self.stats.received += 1
        self.stats.received_bytes += len(data)
        self.stats.lost += gap
        if isinstance(msg.payload, Hello):
            self._hello(h.node, msg.payload, data)
            return None
        return Received(h, msg.payload, addr, max(gap, 0))

    def _hello(self, node: str, hello: Hello, data: bytes) -> None:
        """A Hello accepted: its key, and which of the node's Ed25519 keys it verified under."""
        if self.pairs is None:
            return
        by = signer(data, self.key, self.keys_of(node))
        if not self.pairs.heard(node, hello.key, hello.knows, hello.ok, by and public_text(by)):
            self.stats.rejected[Reason.GARBAGE.value] += 1      # authentic, but no key to agree on

    def _budget(self, addr: Addr, now: float) -> float:
        """Failed verifications ``addr`` may still cost now: a bucket of VERIFY_FAILURES_PER_S,
        refilled at that rate."""
        level, when = self._failures.get(addr, (VERIFY_FAILURES_PER_S, now))
        return min(VERIFY_FAILURES_PER_S, level + (now - when) * VERIFY_FAILURES_PER_S)

    def _signs_ok(self, batch: Batch) -> bool:
        """No value below 0 but for a class that may publish one (``signed``)."""
        signed = self.signed
        return all(signed(v.key) for v in batch.values if v.value < 0.0)

    def _may_speak(self, node: str, addr: Addr, now: float) -> bool:
        """Whether ``node`` may speak from ``addr``: a named address only as its id, a named
        id only from its address; an unnamed address as the id learned there (and that id
        from nowhere else) until the address has been silent for ``timeout_s``."""
        named = self._names.get(addr)
        if named is not None:
            return node == named
        if node in self._homes:
            return False
        bound = self._node_at.get(addr)
        if bound is not None and bound != node and self._fresh(addr, now):
            return False
        there = self._addr_of.get(node)
        return there is None or there == addr or not self._fresh(there, now)

    def _fresh(self, addr: Addr, now: float) -> bool:
        heard = self._heard.get(addr)
        return heard is not None and now - heard <= self.timeout_s

    def _learn(self, node: str, addr: Addr) -> None:
        """Bind ``node`` to ``addr`` (a no-op for named peers): forget the address's old
        id and the id's old address."""
        old = self._node_at.get(addr)
        if old != node:
            if old is not None and self._addr_of.get(old) == addr:
                del self._addr_of[old]
            self._node_at[addr] = node
        moved = self._addr_of.get(node)
        if moved is not None and moved != addr and self._node_at.get(moved) == node:
            del self._node_at[moved]
        self._addr_of[node] = addr

    def reject(self, reason: Reason, n: int = 1) -> None:
        self.stats.rejected[reason.value] += n
        return None
