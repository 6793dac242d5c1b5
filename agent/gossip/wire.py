"""The authenticated wire codec: typed messages <-> datagrams (schema: agent/gossip/drl.proto).

    >>> key = b"0123456789abcdef0123456789abcdef"
    >>> h = Header(cluster="prod", node="n1", seq=1, sent_at=0.0, incarnation=7)
    >>> data = encode(Message(h, Batch((ClassValue(key=7, seq=1, value=1250000.0),))), key)
    >>> decode(data, key, "prod").payload.values
    (ClassValue(key=7, seq=1, value=1250000.0, version=0, local_Bps=0.0),)
    >>> decode(data[:-1] + b"x", key, "prod")
    <Reason.FORGED: 'forged'>

A datagram is the serialized ``Datagram``, then, with per-node keys (``identity``, agent/gossip/signing.py),
the sender's Ed25519 signature over it (64 bytes) or, once the two ends share a pair key
(``pair``, agent/gossip/pairs.py), HMAC-SHA256 over it with that key (32 bytes), then one byte
saying which (SIGNED, PAIRED), then HMAC-SHA256 over all that with the cluster key
(``key=None``: no tag; the explicit insecure mode when there is no signature either).
With per-node keys ``decode`` is given the public keys of each node id (``keys``) and the pair
key shared with each (``pairs``) and accepts a datagram only if its signature verifies under
one of those of the node its header names (``bad_signature`` when none does, ``unknown_key``
for a node with none) or its pair MAC under the key shared with that node (``bad_pair_mac``
otherwise).  The cluster key's MAC, when there is one, is checked first and costs ~3 us, as
a pair MAC does; a signature ~60-190 us.
``decode`` never raises: bad input comes back as a :class:`Reason`, which the
receive path counts (agent/gossip/core.py ``Stats.rejected``).  Every number a
datagram carries is checked against agent/units.py's bounds before anything
uses it: finite, not negative (the sign of a Batch value is the receiver's to
judge, core.py, which knows the class's allocator), a published value within
+-MAX_VALUE, a Sums' sum within its node count times MAX_VALUE, a rate within the
rate ceiling, a version one more than which still fits its uint64
(``Reason.OUT_OF_RANGE``: the whole datagram is dropped, never clamped).  The
encoder clamps a published value and a Sums into those same bounds instead: a
sender whose allocator went wild (an FPS weight of 1e288, after a forged sum,
went out as float32 infinity) must not make every Batch it sends undecodable for
every peer for as long as the value lasts.  So decode(encode(m)) is never a
Reason for a Batch or a Sums, and whatever decode yields, encode sends unchanged
(tests/unit/gossip/test_wire_bounds.py).  The MAC is checked
before the protobuf parser ever sees the bytes, so unauthenticated input only
costs one HMAC; a signature is checked after the parse (the header names the signer)
and before any payload is read.  Replays are caught statefully by ``lives.SeqWindow``, one per
(sender, incarnation), in agent/gossip/core.py, after it has checked that the sender's
node id is the one bound to the source address (``Reason.WRONG_SENDER``).  The
cluster key file is read by agent/gossip/keys.py.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hmac
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence, Union

from google.protobuf.message import DecodeError

from drl.agent.gossip import drl_pb2
from drl.agent.gossip.signing import SIG_BYTES, Ed25519PrivateKey, Ed25519PublicKey, verify
from drl.agent.gossip.pairs import X25519_BYTES
from drl.agent import units
from drl.agent.clients.reports import BanNote, ClientReport, report_bytes
from drl.agent.model import Body, LeaseGrant, LeaseRequest, Report, Transfer, TransferAck

# 7: per-node keys' pair MACs and Hello, and the byte after the signature saying which (a
# version 6 agent would take that byte for the signature's last); 6: the per-node signature
# between the Datagram and the MAC (a version 5 agent would read it as part of the Datagram); 5: the sum tree's Sums (a limiter of version 4 would never answer one, and its value would be
# missing from every total); 3: gdrl/fillratio transfers count parts of the global limit (2: B/s; a mixed cluster would read one
# as the other, so they refuse each other's datagrams); 2: every class's value in a Batch (1: one
# Update datagram per class)
VERSION = 7
TAG_BYTES = 32            # full HMAC-SHA256, untruncated: security first
SIGNED, PAIRED = 1, 2     # per-node keys: the last byte before the cluster MAC, what precedes it
AUTH_BYTES = SIG_BYTES + 1   # the most per-node keys add to a datagram
MAX_DATAGRAM = 1200       # fits the IPv6 minimum MTU (1280) with IP+UDP headers, so never fragmented
MAX_SUM_NODES = 1 << 20   # limiters a Sums may count: far above any cluster, far below overflow
# The largest magnitude of a published value (units.MAX_AMOUNT, 2^53: the bound of a weight or an
# amount; a rate's ceiling is below it), one limiter's share of any sum: exact in a float32, so a
# clamped Batch value decodes as it was clamped.  A class-specific bound would be tighter, but
# FPS's line-9 weight has no scale of its own (it follows its peers' sum).
MAX_VALUE = float(units.MAX_AMOUNT)


class Reason(str, enum.Enum):
    """Why a datagram was dropped; each is a counter in gossip.Stats.rejected."""
    OVERSIZED = "oversized"            # longer than MAX_DATAGRAM
    TRUNCATED = "truncated"            # too short to hold a tag and a header
    FORGED = "forged"                  # MAC does not verify (wrong key, tampering)
    UNKNOWN_KEY = "unknown_key"        # per-node keys: no public key for the node id in the header
    BAD_SIGNATURE = "bad_signature"    # per-node keys: verifies under none of that node's keys
    BAD_PAIR_MAC = "bad_pair_mac"      # per-node keys: no pair key shared with that node verifies it
    OVER_BUDGET = "over_budget"        # per-node keys: its address failed too many verifications lately (core)
    GARBAGE = "garbage"                # authenticated (or insecure) but not a well-formed Datagram
    OUT_OF_RANGE = "out_of_range"      # well-formed, but a number outside its bounds (agent/units.py)
    UNKNOWN_VERSION = "unknown_version"
    WRONG_CLUSTER = "wrong_cluster"
    UNKNOWN_PEER = "unknown_peer"      # source address not in the configured peer list
    LOOP = "loop"                      # our own node id: the peer list names this node
    WRONG_DST = "wrong_dst"            # addressed to another node id (cross-link replay)
    WRONG_SENDER = "wrong_sender"      # node id not bound to its source address (gossip.py: identity)
    OLD_INCARNATION = "old_incarnation"  # from a previous life of a restarted peer
    OTHER_LIFE = "other_life"          # addressed to our life before a restart (core.receive)
    REPLAYED = "replayed"              # sequence number already seen or left of the window
    QUEUE_FULL = "queue_full"          # dropped by the kernel: the socket's buffer was full


@dataclass(frozen=True, slots=True)
class Header:
    cluster: str
    node: str
    seq: int
    incarnation: int
    sent_at: float
    class_id: int = 0
    dst: str = ""
    dst_incarnation: int = 0
    dst_heard_ms: int = 0
    version: int = VERSION


class ClassValue(NamedTuple):
    """One class's published value in a :class:`Batch`; ``seq`` runs per (link, class).
    A NamedTuple: one per class and target every round, a third of a frozen dataclass's cost."""
    key: int
    seq: int
    value: float
    version: int = 0
    local_Bps: float = 0.0     # what the sender's datapath may pass (the stale rule); travels as kB/s, rounded up


@dataclass(frozen=True, slots=True)
class LimitNote:
    """A class's global limit and its version (agent/cluster/limits.py), announced to a peer."""
    key: int
    version: int
    global_Bps: float


@dataclass(frozen=True, slots=True)
class Batch:
    """Many classes' values (and limit announcements) in one datagram; empty = heartbeat."""
    values: tuple[ClassValue, ...] = ()
    limits: tuple[LimitNote, ...] = ()


@dataclass(frozen=True, slots=True)
class ClassClients:
    """One class's per-client report (agent/clients/table.py), by class key."""
    key: int
    report: ClientReport


@dataclass(frozen=True, slots=True)
class ClientReports:
    """The per-client reports of several classes, to every alive peer each interval."""
    reports: tuple[ClassClients, ...] = ()


class SumKind(enum.IntEnum):
    """What a :class:`Sums` carries (agent/gossip/tree.py)."""
    LEAF = 1        # the sender's own values, to the limiter that sums its group
    PARTIAL = 2     # the sum over the leaves that chose the sender, to the other summing limiters
    TOTAL = 3       # everyone's sum but the receiver's own value, to a leaf


@dataclass(frozen=True, slots=True)
class Sums:
    """Per-class sums of the sum tree; a class missing is 0.  ``nodes``: the limiters summed."""
    kind: SumKind
    nodes: int
    values: tuple[tuple[int, float], ...] = ()      # (class key, sum)
    summers: tuple[str, ...] = ()                   # PARTIAL: the summers the sender knows of


@dataclass(frozen=True, slots=True)
class Hello:
    """Per-node keys' key agreement (agent/gossip/pairs.py): the sender's X25519 public key,
    the receiver's as the sender holds it (b"": none), and whether the sender has heard that
    the receiver holds the sender's."""
    key: bytes
    knows: bytes = b""
    ok: bool = False


Payload = Union[Batch, ClientReports, Sums, Hello, Body]


@dataclass(frozen=True, slots=True)
class Message:
    header: Header
    payload: Payload


# oneof field name <-> Python class; every field of the class has a same-named proto field.
_KINDS: dict[str, type] = {
    "transfer": Transfer, "transfer_ack": TransferAck,
    "lease_request": LeaseRequest, "lease_grant": LeaseGrant, "report": Report,
}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
_KIND_OF[Batch] = "batch"
_KIND_OF[ClientReports] = "client_reports"
_KIND_OF[Sums] = "sums"
_KIND_OF[Hello] = "hello"
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _KINDS.values()}
_HEADER_FIELDS = tuple(f.name for f in dataclasses.fields(Header))


@functools.lru_cache(maxsize=4096)    # the cluster key (and its successor across a reload), each peer's pair key
def _keyed(key: bytes):
    return hmac.new(key, digestmod="sha256")


def _tag(key: bytes, body: bytes) -> bytes:
    # the key's inner and outer pads hashed once: a MAC costs 1.5 us, not hmac.digest's 3.2,
    # which is what an outsider's flood costs us a datagram
    mac = _keyed(key).copy()
    mac.update(body)
    return mac.digest()


def encode(msg: Message, key: bytes | None, identity: Ed25519PrivateKey | None = None,
           pair: bytes | None = None) -> bytes:
    """Serialize and authenticate ``msg``: MACed with the ``pair`` key shared with the receiver,
    else signed with ``identity``, then MACed with ``key``; none only in insecure mode."""
    dg = drl_pb2.Datagram()
    for name in _HEADER_FIELDS:
        setattr(dg.header, name, getattr(msg.header, name))
    cls = type(msg.payload)
    sub = getattr(dg, _KIND_OF[cls])
    sub.SetInParent()                    # selects the oneof even when every field is default
    if cls is Batch:
        _fill_batch(sub, msg.payload)
    elif cls is ClientReports:
        for entry in msg.payload.reports:
            _fill_report(sub.reports.add(), entry)
    elif cls is Sums:
        _fill_sums(sub, msg.payload)
    elif cls is Hello:
        sub.key, sub.knows, sub.ok = msg.payload.key, msg.payload.knows, msg.payload.ok
    for name in _FIELDS.get(cls, ()):
        setattr(sub, name, getattr(msg.payload, name))
    body = dg.SerializeToString()
    if pair is not None:
        body += _tag(pair, body) + bytes((PAIRED,))
    elif identity is not None:
        body += identity.sign(body) + bytes((SIGNED,))
    return body if key is None else body + _tag(key, body)


def _body(data: bytes, key: bytes | None) -> bytes | Reason:
    """Size checks and MAC verification, before any parsing."""
    if len(data) > MAX_DATAGRAM:
        return Reason.OVERSIZED
    if key is None:
        return data if data else Reason.TRUNCATED
    if len(data) <= TAG_BYTES:
        return Reason.TRUNCATED
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, body)):
        return Reason.FORGED
    return body


def _proto(body: bytes):
    dg = drl_pb2.Datagram()
    try:
        dg.ParseFromString(body)
    except (DecodeError, RuntimeWarning, ValueError):
        return Reason.GARBAGE
    if dg.WhichOneof("payload") is None or not dg.HasField("header"):
        return Reason.GARBAGE
    return dg


def _split_auth(body: bytes) -> tuple[bytes, bytes, int] | Reason:
    """Per-node keys' trailer: (Datagram bytes, signature or pair MAC, SIGNED or PAIRED)."""
    size = {SIGNED: SIG_BYTES, PAIRED: TAG_BYTES}.get(body[-1] if body else 0)
    if size is None or len(body) <= size + 1:
        return Reason.TRUNCATED if size or not body else Reason.GARBAGE
    return body[:-size - 1], body[-size - 1:-1], body[-1]


def _signed(body: bytes, keys: Callable[[str], Sequence[Ed25519PublicKey]],
            pairs: Callable[[str], bytes | None]):
    """The parsed Datagram whose pair MAC verifies under the key shared with the node it
    names, or whose signature under a key of that node's."""
    split = _split_auth(body)
    if isinstance(split, Reason):
        return split
    body, auth, how = split
    dg = _proto(body)
    if isinstance(dg, Reason):
        return dg
    if how == PAIRED:
        pair = pairs(dg.header.node)
        return dg if pair is not None and hmac.compare_digest(auth, _tag(pair, body)) else Reason.BAD_PAIR_MAC
    known = keys(dg.header.node)
    if not known:
        return Reason.UNKNOWN_KEY
    return dg if verify(known, auth, body) else Reason.BAD_SIGNATURE


def signer(data: bytes, key: bytes | None, keys: Sequence[Ed25519PublicKey]) -> Ed25519PublicKey | None:
    """Which of ``keys`` a signed datagram, decoded already, verifies under (None: none, or it
    came under a pair key): a Hello's, whose pairs last while that key is listed."""
    split = _split_auth(data if key is None else data[:-TAG_BYTES])
    if isinstance(split, Reason) or split[2] != SIGNED:
        return None
    body, sig, _ = split
    return next((k for k in keys if verify((k,), sig, body)), None)


def _read(dg) -> Message | Reason:
    kind = dg.WhichOneof("payload")
    if kind == "batch":
        payload = _read_batch(dg.batch)
    elif kind == "client_reports":
        payload = _read_reports(dg.client_reports)
    elif kind == "sums":
        payload = _read_sums(dg.sums)
    elif kind == "hello":
        payload = _read_hello(dg.hello)
    else:
        payload = _read_body(_KINDS[kind], getattr(dg, kind))
    header = Header(**{name: getattr(dg.header, name) for name in _HEADER_FIELDS})
    if isinstance(payload, Reason):
        return payload
    if not header.node or header.seq == 0 or not math.isfinite(header.sent_at):
        return Reason.GARBAGE
    return Message(header, payload)


# The bounds of each point-to-point body's numbers: a NaN or inf would poison every sum it
# enters, a negative amount or rate would take from the others' shares; no allocator sends one.
_BODY_BOUNDS: dict[str, float] = {
    "amount": math.inf, "link_total": math.inf,               # B/s or bytes moved: finite, >= 0
    "want_Bps": units.MAX_RATE_Bps, "capacity_Bps": units.MAX_RATE_Bps,
    "ttl_s": units.MAX_DURATION_S, "refresh_s": units.MAX_DURATION_S,
    "consumed": units.MAX_AMOUNT, "free": units.MAX_AMOUNT,
}


def _read_body(cls: type, sub) -> Payload | Reason:
    values = [getattr(sub, name) for name in _FIELDS[cls]]
    for name, v in zip(_FIELDS[cls], values):
        if isinstance(v, float) and not (math.isfinite(v) and 0.0 <= v <= _BODY_BOUNDS[name]):
            return Reason.OUT_OF_RANGE
    return cls(*values)


def _read_hello(sub) -> Hello | Reason:
    if len(sub.key) != X25519_BYTES or len(sub.knows) not in (0, X25519_BYTES):
        return Reason.GARBAGE
    return Hello(sub.key, sub.knows, sub.ok)


def _fill_batch(sub, batch: Batch) -> None:
    if batch.values:
        keys, seqs, values, versions, locals_ = zip(*batch.values)
        sub.keys.extend(keys)
        sub.seqs.extend(seqs)
        sub.values.extend(map(sendable, values))
        sub.versions.extend(versions)
        sub.locals.extend(map(_kBps, locals_))
    for note in batch.limits:
        sub.limits.add(key=note.key, version=note.version, global_Bps=note.global_Bps)


def _read_batch(sub) -> Batch | Reason:
    """A well-formed Batch: arrays of one length, seqs from 1; values within +-MAX_VALUE, versions
    below MAX_VERSION, limits within the rate bounds (a value's sign is core.py's to judge)."""
    keys, seqs, values, versions, locals_ = sub.keys, sub.seqs, sub.values, sub.versions, sub.locals
    if not len(keys) == len(seqs) == len(values) == len(versions) == len(locals_) or 0 in seqs:
        return Reason.GARBAGE
    if not all(-MAX_VALUE <= v <= MAX_VALUE for v in values) or any(v >= units.MAX_VERSION for v in versions):
        return Reason.OUT_OF_RANGE
    limits = tuple(LimitNote(n.key, n.version, n.global_Bps) for n in sub.limits)
    if not all(map(_limit_ok, limits)):
        return Reason.OUT_OF_RANGE
    return Batch(tuple(map(ClassValue, keys, seqs, values, versions, (1000.0 * x for x in locals_))), limits)


def _limit_ok(note: LimitNote) -> bool:
    """A limit a LimitBook may adopt: a version a ``drlctl set`` can still increment (a forged
    top version was adopted for good, and the next set overflowed the wire), a rate within
    the bounds."""
    return (note.version + 1 < units.MAX_VERSION and math.isfinite(note.global_Bps)
            and units.MIN_RATE_Bps <= note.global_Bps <= units.MAX_RATE_Bps)


def sendable(value: float, most: float = MAX_VALUE, least: float | None = None) -> float:
    """``value`` clamped into [least, most] (least: -most); NaN, which no bound holds, as 0."""
    least = -most if least is None else least
    return min(most, max(least, value)) if value == value else 0.0


def sums_bound(kind: SumKind, nodes: int) -> int:
    """The most limiters a Sums of ``kind`` may count: a LEAF counts its sender alone."""
    return min(nodes, 1 if kind == SumKind.LEAF else MAX_SUM_NODES)


def _fill_sums(sub, sums: Sums) -> None:
    """A Sums as decode accepts it: nodes within sums_bound, each sum within 0 .. nodes x
    MAX_VALUE, no empty summer id."""
    sub.kind = sums.kind
    sub.nodes = nodes = max(0, sums_bound(sums.kind, sums.nodes))
    if sums.values:
        keys, values = zip(*sums.values)
        sub.keys.extend(keys)
        sub.values.extend(sendable(v, nodes * MAX_VALUE, 0.0) for v in values)
    sub.summers.extend(filter(None, sums.summers))


def _read_sums(sub) -> Sums | Reason:
    """Well-formed Sums: a known kind, parallel arrays, at most sums_bound limiters, each sum
    finite within 0 .. nodes x MAX_VALUE (a negative one would take from everyone's total; a
    larger one is more than the limiters it claims to count can have published)."""
    if sub.kind not in SumKind.__members__.values() or len(sub.keys) != len(sub.values):
        return Reason.GARBAGE
    most = sub.nodes * MAX_VALUE
    if sub.nodes > sums_bound(SumKind(sub.kind), sub.nodes) or not all(0.0 <= v <= most for v in sub.values):
        return Reason.OUT_OF_RANGE
    if not all(sub.summers):
        return Reason.GARBAGE
    return Sums(SumKind(sub.kind), sub.nodes, tuple(zip(sub.keys, sub.values)), tuple(sub.summers))


def pack_sums(sums: Sums, room: int) -> list[Sums]:
    """``sums`` in as many datagrams as it takes, each at most ``room`` bytes (the datagram less
    its header and tag), every one with its kind and node count; the summers go in the first,
    as many as fit beside at least one class."""
    room -= 3 + 2 + 6 + 2 * 3      # the oneof's tag and length; kind; nodes; two arrays' tags and lengths
    summers, used = [], 13
    for node in sums.summers:
        size = len(node.encode())
        cost = 1 + (size.bit_length() + 6) // 7 + size            # tag, length, the id
        if used + cost > room:
            break
        summers.append(node)
        used += cost
    first = max(1, (room - used) // 13)       # a class: fixed32 key and double sum (12), and slack
    per = max(1, room // 13)
    values = sums.values
    parts = [Sums(sums.kind, sums.nodes, values[:first], tuple(summers))]
    parts += [Sums(sums.kind, sums.nodes, values[i:i + per]) for i in range(first, len(values), per)]
    return parts


def _fill_report(sub, entry: ClassClients) -> None:
    report = entry.report
    sub.key = entry.key
    sub.v4_len, sub.v6_len = report.lengths
    wide = report.lengths[1] > 64
    for client, count in report.counts:
        value = int.from_bytes(client, "big")
        if len(client) == 4:
            sub.v4.append(value)
            sub.v4_counts.append(count)
        else:
            sub.v6_hi.append(value >> 64)
            if wide:
                sub.v6_lo.append(value & (2**64 - 1))
            sub.v6_counts.append(count)
    for note in report.bans:
        sub.bans.add(prefix=note.client, version=note.version, remaining_s=note.remaining_s, lifted=note.lifted)


def _read_reports(sub) -> ClientReports | Reason:
    """Well-formed reports: parallel arrays of one length (v6_lo all or nothing), IPv4 and IPv6
    prefixes of 4 and 16 bytes; counts finite and >= 0, ban versions below MAX_VERSION (an
    unban is one up), remaining times finite within MAX_DURATION_S either way (negative: over)."""
    out = []
    for r in sub.reports:
        v6_lo = r.v6_lo if len(r.v6_lo) else [0] * len(r.v6_hi)
        if len(r.v4) != len(r.v4_counts) or not len(r.v6_hi) == len(v6_lo) == len(r.v6_counts):
            return Reason.GARBAGE
        if any(len(n.prefix) not in (4, 16) for n in r.bans):
            return Reason.GARBAGE
        if not all(math.isfinite(c) and 0.0 <= c <= units.MAX_AMOUNT for c in (*r.v4_counts, *r.v6_counts)):
            return Reason.OUT_OF_RANGE
        if not all(n.version < units.MAX_VERSION and math.isfinite(n.remaining_s)
                   and abs(n.remaining_s) <= units.MAX_DURATION_S for n in r.bans):
            return Reason.OUT_OF_RANGE
        counts = [(v.to_bytes(4, "big"), c) for v, c in zip(r.v4, r.v4_counts)]
        counts += [((hi << 64 | lo).to_bytes(16, "big"), c) for hi, lo, c in zip(r.v6_hi, v6_lo, r.v6_counts)]
        bans = tuple(BanNote(bytes(n.prefix), n.version, n.remaining_s, n.lifted) for n in r.bans)
        out.append(ClassClients(r.key, ClientReport((r.v4_len, r.v6_len), tuple(counts), bans)))
    return ClientReports(tuple(out))


def pack_reports(reports: list[ClassClients], room: int) -> list[ClientReports]:
    """Reports in as few datagrams as fit ``room`` bytes each (the datagram less its header and
    tag); a report is never split (agent/clients/table.py sizes one to fit a datagram alone)."""
    room -= 3                  # the oneof's tag and length
    out: list[list[ClassClients]] = []
    used = room
    for entry in reports:
        body = report_bytes(entry.report)
        cost = 1 + (body.bit_length() + 6) // 7 + body        # tag, length, body
        if used + cost > room:
            out.append([])
            used = 0
        out[-1].append(entry)
        used += cost
    return [ClientReports(tuple(group)) for group in out]


# A round sends a class's value to several targets, and each datagram converts and sizes it
# twice (pack, then _fill_batch): the pure conversions below are memoized, for a round's
# classes (at most 4,096) and the previous round's.
_ROUND_CACHE = 2 * 4096


@functools.lru_cache(maxsize=_ROUND_CACHE)
def _kBps(rate_Bps: float) -> int:
    """A local limit on the wire: kB/s rounded up (a stale peer is never counted below what it
    may send), at most 2**32 - 1 kB/s (34 Tbit/s); infinity as that most, NaN as 0."""
    return math.ceil(sendable(rate_Bps, (2**32 - 1) * 1000.0, 0.0) / 1000.0)


@functools.lru_cache(maxsize=_ROUND_CACHE)
def _tail_bytes(version: int, local_Bps: float) -> int:
    """A value's version and local limit varints (0 takes one byte)."""
    return ((version.bit_length() + 6) // 7 or 1) + ((_kBps(local_Bps).bit_length() + 6) // 7 or 1)


def _note_bytes(n: LimitNote) -> int:
    inner = 5 + 1 + max(1, (n.version.bit_length() + 6) // 7) + 9
    return 1 + 1 + inner                                       # tag, length (< 128), key, version, rate


def pack(values: list[ClassValue], limits: list[LimitNote], room: int) -> list[Batch]:
    """Split values and limit notes into Batches whose encoding takes at most ``room``
    bytes each (the datagram less its header and tag); at least one (a heartbeat)."""
    room -= 3 + 5 * 3          # the oneof's tag and length; the five packed arrays' tags and lengths
    out, cur_l, used = [], [], 0
    for note in limits:
        cost = _note_bytes(note)
        if used + cost > room and cur_l:
            out.append(Batch((), tuple(cur_l)))
            cur_l, used = [], 0
        cur_l.append(note)
        used += cost
    start = 0
    for i, v in enumerate(values):
        # key fixed32 + seq varint + value float + version varint + local varint
        cost = 8 + (v.seq.bit_length() + 6) // 7 + _tail_bytes(v.version, v.local_Bps)
        if used + cost > room and (i > start or cur_l):
            out.append(Batch(tuple(values[start:i]), tuple(cur_l)))
            start, cur_l, used = i, [], 0
        used += cost
    out.append(Batch(tuple(values[start:]), tuple(cur_l)))
    return out


def decode(data: bytes, key: bytes | None, cluster: str,
           keys: Callable[[str], Sequence[Ed25519PublicKey]] | None = None,
           pairs: Callable[[str], bytes | None] = lambda node: None) -> Message | Reason:
    """Verify and parse one datagram; never raises.  ``keys``: per-node keys, the public
    keys of a node id (none: unknown); ``pairs``: the pair key shared with a node id (None:
    none yet).  Replays are SeqWindow's job."""
    body = _body(data, key)
    if isinstance(body, Reason):
        return body
    dg = _proto(body) if keys is None else _signed(body, keys, pairs)
    if isinstance(dg, Reason):
        return dg
    msg = _read(dg)
    if isinstance(msg, Reason):
        return msg
    if msg.header.version != VERSION:
        return Reason.UNKNOWN_VERSION
    if msg.header.cluster != cluster:
        return Reason.WRONG_CLUSTER
    return msg
