"""Per-client throttle and rate-based ban, counted across all hosts: the pure core.

A class may carry one **client rule** ([RLDesign] "Throttling traffic",
"Banning clients based on request rates"): who the client is (the remote
address of egress packets, grouped by a prefix length), what is counted
(bytes, packets or new connections), a threshold (a count per sliding
window), and what happens above it (``throttle``: the client gets at most
the threshold, split between the hosts by demand; ``ban``: the client is cut
off for the rest of the window plus a ban duration).  A client that spreads
its load over many hosts is counted once, globally: every agent reports its
heavy clients, and sums what its peers report.

How the pieces fit (docs/clients.md has the whole design, kernel included)::

    rule = client_rule(parse_client_key("dst/24"), "bytes", parse_threshold("2mbit"), "throttle")
    table = ClientTable(rule, max_age_s=0.5, start_s=now)
    # every interval: the counter deltas the kernel counted per client prefix
    tick = table.tick(now, {rule.key.client_of("198.51.100.7"): 1500.0, ...}, n_hosts=3)
    tick.limits      # throttled clients -> this host's share (count per window)
    tick.bans        # banned clients -> until (seconds, the caller's clock)
    tick.report      # what to gossip: top-K heavy clients and ban notes
    # whenever a peer's report arrives
    table.receive("b", report, now)

Everything here is pure: time comes in as an argument, nothing touches a
socket, a map or the clock, so the agent and a simulator can run it alike.
The table is a mutable object for speed (100,000 clients per class), but its
methods depend on their arguments and its own state only.

**Over the threshold before the hosts know about each other.**  No host holds
a client back on a guess: a client is limited once what a host knows of it
(its own sliding count plus its peers' fresh reports) reaches the threshold.
Reports carry every client at or above half a fair share of the threshold
locally (``REPORT_FRACTION`` x threshold / N) and, once any host reports a
client, every host that sees it at all.  With reports sent to every alive
peer each interval I and a one-way gossip delay d, a client whose summed
count crosses the threshold is limited on every host **one tick** after the
crossing tick when each host holding it is at or above that line (within
2 I + d of the crossing), **two ticks** after it otherwise (3 I + 2 d).
What it gets above the threshold is its excess rate over that time (0.2 to
0.3 s at I = 100 ms), plus the sliding window's error (:func:`sliding_count`).
The alternative, a first local share of threshold/N for every client not yet
heard of, never lets a spread client over the threshold but throttles every
single-host client above threshold/N for a round, which is the common,
legitimate case; docs/clients.md compares the two.
"""
from __future__ import annotations

import functools
import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Union

from drl.agent import units

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
# A client prefix as the kernel keys it and every table here holds it: the packed network
# address, 4 bytes (IPv4) or 16 (IPv6), host bits zero; its length is the class's ClientKey's.
# bytes cache their hash; ip_network objects recompute theirs on every lookup, which made a
# tick at 100,000 clients 13 times slower.
Client = bytes

MEASURES = ("bytes", "packets", "conns")
ACTIONS = ("throttle", "ban")
SIDES = ("dst", "src")
# A single length in a client key is its family's; the other family gets the
# prefix one host has: an IPv4 address, an IPv6 /64 (SLAAC and privacy
# addresses give every host a whole /64, so a /128 key would let one host be
# 2**64 clients).
HOST_LENGTH = {4: 32, 6: 64}
RATE_WINDOW_s = 1.0           # a rate threshold ('2mbit') is its count over a 1-s sliding window

# Reports: one class's report fits one 1,200-byte datagram behind the longest
# header (report_bytes; docs/clients.md "Report size").
REPORT_K = 32                 # clients per class and round
MAX_BAN_NOTES = 6             # ban notes per class and round, rotating through all bans
REPORT_FRACTION = 0.5         # report a client at half a fair share: threshold x 0.5 / N

# Throttle split: each host gets a floor of FLOOR_FRACTION x threshold / N, so a
# host where the client is new or quiet can still see its demand grow; the
# rest of the threshold goes in proportion to local demand.
FLOOR_FRACTION = 0.05
RELEASE_FRACTION = 0.5        # released below half the threshold: a throttled TCP flow dips under 0.9 (BBR: 1.5x the threshold)


class ClientRuleError(ValueError):
    """A client rule that cannot be used; the message is one line."""


# -- rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientKey:
    """Which address is the client's and how it is grouped, per family.

    A client is a :data:`Client`: the packed network address of its prefix, as the kernel
    keys it, with the length this key gives its family."""
    side: str          # "dst": the remote address of egress packets; "src": the local one
    v4_len: int
    v6_len: int

    def length(self, client: Client) -> int:
        return self.v4_len if len(client) == 4 else self.v6_len

    def client_of(self, address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> Client:
        """The client prefix an address belongs to."""
        addr = ipaddress.ip_address(address)
        length = self.v4_len if addr.version == 4 else self.v6_len
        return ipaddress.ip_network((addr, length), strict=False).network_address.packed

    def network(self, client: Client) -> Network:
        """A client as a prefix, for people (drlctl, logs)."""
        return ipaddress.ip_network((client, self.length(client)))

    def owns(self, client: Client) -> bool:
        """A well-formed client of this key: 4 or 16 bytes, no bit set past the prefix."""
        if len(client) not in (4, 16):
            return False
        host_bits = 8 * len(client) - self.length(client)
        return int.from_bytes(client, "big") & ((1 << host_bits) - 1) == 0

    def __str__(self) -> str:
        return f"{self.side}/{self.v4_len}/{self.v6_len}"


def parse_client_key(text: str) -> ClientKey:
    """``dst/32`` -> IPv4 /32 and IPv6 /64; ``dst/64`` -> IPv6 /64 and IPv4 /32;
    ``dst/24/56`` -> IPv4 /24 and IPv6 /56 (first IPv4, then IPv6)."""
    m = re.fullmatch(r"\s*([a-z]+)/([0-9]+)(?:/([0-9]+))?\s*", text)
    if not m:
        raise ClientRuleError(f"client key {text!r}: write dst/LEN or dst/LEN4/LEN6, e.g. 'dst/32' "
                              "(IPv4 /32, IPv6 /64) or 'dst/24/56'")
    side, first, second = m.group(1), int(m.group(2)), m.group(3)
    if side not in SIDES:
        raise ClientRuleError(f"client key {text!r}: the client is 'dst' (the remote address of egress "
                              "packets) or 'src'")
    if second is not None:
        return ClientKey(side, _length(text, first, 4, " (the first length is IPv4's)"), _length(text, int(second), 6))
    if first <= 32:
        return ClientKey(side, first, HOST_LENGTH[6])
    return ClientKey(side, HOST_LENGTH[4], _length(text, first, 6))


def _length(text: str, length: int, version: int, hint: str = "") -> int:
    most = 32 if version == 4 else 128
    if length > most:
        raise ClientRuleError(f"client key {text!r}: an IPv{version} prefix length is at most {most}{hint}")
    return length


@dataclass(frozen=True)
class Threshold:
    """A count per sliding window, in the measure's unit; ``kind`` is how it was written."""
    count: float
    window_s: float
    kind: str          # "rate" ('2mbit': bytes over RATE_WINDOW_s), "size" ('250KB/1s'), "count" ('2000/1200s')
    text: str

    @property
    def per_s(self) -> float:
        return self.count / self.window_s

    def __str__(self) -> str:
        return self.text


def _unit(parse, value: str, text: str):
    """``parse(value)`` (agent/units.py), its UnitError as the threshold's one line."""
    try:
        return parse(value)
    except units.UnitError as e:
        raise ClientRuleError(f"threshold {text!r}: {e}") from None


def parse_threshold(text: str) -> Threshold:
    """``2mbit`` (a rate of bytes), ``250KB/1s`` (bytes per window) or ``2000/1200s`` (a count
    per window; ``2000/1s`` is a rate of 2,000 a second).  The measure is checked by client_rule."""
    amount, sep, window = text.strip().partition("/")
    amount = amount.strip()
    if not sep:
        return _rate_threshold(text, amount)
    window_s = _unit(units.parse_duration, window, text)
    if window_s <= 0:
        raise ClientRuleError(f"threshold {text!r}: the window must be longer than 0")
    if re.fullmatch(r"[0-9]*\.?[0-9]+", amount):
        if not amount.isdigit() or int(amount) == 0:
            raise ClientRuleError(f"threshold {text!r}: the count must be a whole number above 0")
        return Threshold(float(amount), window_s, "count", text.strip())
    size = _unit(units.parse_size, amount, text)
    if size <= 0:
        raise ClientRuleError(f"threshold {text!r}: the size must be above 0")
    return Threshold(float(size), window_s, "size", text.strip())


def _rate_threshold(text: str, amount: str) -> Threshold:
    if re.fullmatch(r"[0-9]*\.?[0-9]+", amount):
        raise ClientRuleError(f"threshold {text!r}: give a rate ('2mbit') or COUNT/WINDOW ('2000/1200s')")
    rate_Bps = _unit(units.parse_rate, amount, text)
    if rate_Bps <= 0:
        raise ClientRuleError(f"threshold {text!r}: the rate must be above 0")
    return Threshold(rate_Bps * RATE_WINDOW_s, RATE_WINDOW_s, "rate", text.strip())


def parse_prefix(text: str) -> Network:
    """An address or CIDR (exempt lists, ``drlctl unban``); host bits are dropped."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ClientRuleError(f"{text!r} is not an address or prefix (e.g. 10.0.0.0/8, 2001:db8::/32)") from None


@dataclass(frozen=True)
class ClientRule:
    """One class's client rule, checked (:func:`client_rule`)."""
    key: ClientKey
    measure: str
    threshold: Threshold
    action: str
    ban_duration_s: float = 0.0
    exempt: tuple[Network, ...] = ()

    @property
    def limit(self) -> float:
        """The threshold as a count per window, in the measure's unit."""
        return self.threshold.count

    @property
    def window_s(self) -> float:
        return self.threshold.window_s

    def is_exempt(self, client: Client) -> bool:
        """The whole client prefix lies in an exempt prefix (the kernel checks each packet's address)."""
        if not self.exempt:
            return False
        value, length = int.from_bytes(client, "big"), self.key.length(client)
        return any(len(client) == size and e_len <= length and value >> shift == top
                   for size, e_len, shift, top in self._exempt_bits)

    @functools.cached_property
    def _exempt_bits(self) -> tuple[tuple[int, int, int, int], ...]:
        """Per exempt prefix: address bytes, length, host bits, the prefix's top bits; integer
        tests, as a tick may check 100,000 clients."""
        return tuple((e.max_prefixlen // 8, e.prefixlen, e.max_prefixlen - e.prefixlen,
                      int(e.network_address) >> (e.max_prefixlen - e.prefixlen)) for e in self.exempt)

    def check_interval(self, interval_s: float) -> None:
        """Counts arrive once an interval, so a window must hold at least one."""
        if self.window_s < interval_s:
            raise ClientRuleError(f"threshold {self.threshold.text!r}: the window ({self.window_s:g} s) is "
                                  f"shorter than the interval ({interval_s:g} s)")


def client_rule(key: ClientKey | None, measure: str | None = None, threshold: Threshold | None = None,
                action: str | None = None, ban_duration_s: float | None = None,
                exempt: Iterable[Network] = ()) -> ClientRule | None:
    """The parsed fields of one class -> a checked ClientRule, or None without a client key.
    Defaults: measure bytes, action throttle, ban duration 0 (banned for the rest of the window)."""
    exempt = tuple(sorted(set(exempt), key=lambda n: (n.version, n)))
    if key is None:
        given = [name for name, value in (("measure", measure), ("threshold", threshold), ("action", action),
                                          ("ban_duration", ban_duration_s), ("exempt", exempt or None))
                 if value is not None]
        if given:
            raise ClientRuleError(f"client {given[0]} given without a client key: add client = \"dst/32\" "
                                  "(--client-key dst/32)")
        return None
    measure, action = measure or "bytes", action or "throttle"
    if measure not in MEASURES:
        raise ClientRuleError(f"client measure {measure!r}: use {', '.join(MEASURES)}")
    if action not in ACTIONS:
        raise ClientRuleError(f"client action {action!r}: use {' or '.join(ACTIONS)}")
    if threshold is None:
        raise ClientRuleError(f"client key {key}: needs a threshold, e.g. '2mbit' or '2000/1200s'")
    _check_measure(measure, threshold)
    if action == "throttle" and ban_duration_s is not None:
        raise ClientRuleError("ban_duration applies to action = \"ban\", not throttle")
    ban_duration_s = 0.0 if ban_duration_s is None else ban_duration_s
    if not 0.0 <= ban_duration_s < math.inf:
        raise ClientRuleError(f"ban_duration must be 0 s or more, got {ban_duration_s!r}")
    return ClientRule(key, measure, threshold, action, ban_duration_s, exempt)


def _check_measure(measure: str, threshold: Threshold) -> None:
    if measure == "bytes" and threshold.kind == "count":
        raise ClientRuleError(f"measure 'bytes': threshold {threshold.text!r} has no size unit; give a rate "
                              "('2mbit') or a size per window ('250KB/1s')")
    if measure != "bytes" and threshold.kind != "count":
        raise ClientRuleError(f"measure {measure!r} counts {'packets' if measure == 'packets' else 'new connections'}: "
                              f"threshold {threshold.text!r} is bytes; write COUNT/WINDOW, e.g. '2000/1s'")


# -- sliding window counter ---------------------------------------------------------------


def sliding_count(prev: float, cur: float, into_s: float, window_s: float) -> float:
    """[RLDesign] "Sliding window counter algorithm": the count over the last ``window_s`` is the
    current fixed window's count plus the previous one's, weighted by how much of it the rolling
    window still covers (5 before and 3 now, 30 % into the window: 3 + 5 x 0.7 = 6.5).

    Error bound: the previous window's count is taken as spread evenly over it.  With alpha =
    1 - into_s/window_s, the estimate minus the exact count lies in [-prev x (1 - alpha),
    prev x alpha]: within the previous window's count, 0 for a steady rate."""
    return cur + prev * max(0.0, 1.0 - into_s / window_s)


class Windows:
    """Sliding window counters for many clients sharing one window and one tick clock.

    Fixed windows are [k W, (k+1) W) of the caller's clock.  ``add`` takes the counts of the
    interval since the previous ``add`` (the kernel's counter deltas) and spreads each evenly
    over that interval, so a delta that straddles a window boundary is split between the two.
    Per client: the window index it was last counted in, the previous and the current count."""

    def __init__(self, window_s: float, start_s: float):
        self.window_s = window_s
        self.last_s = start_s                                   # end of the last interval added
        self._counts: dict[Hashable, list] = {}                 # client -> [window index, prev, cur]

    def add(self, now_s: float, deltas: Mapping[Hashable, float]) -> None:
        index, in_cur, in_prev = self._split(self.last_s, now_s)
        if index != self._index(self.last_s):
            self._forget_before(index - 1)
        counts = self._counts
        for client, delta in deltas.items():
            if delta <= 0:
                continue
            state = counts.get(client)
            if state is None:
                counts[client] = [index, delta * in_prev, delta * in_cur]
                continue
            if state[0] != index:
                state[1], state[2] = _roll(state, index)
                state[0] = index
            state[1] += delta * in_prev
            state[2] += delta * in_cur
        self.last_s = max(self.last_s, now_s)

    def count(self, client: Hashable, now_s: float) -> float:
        """The sliding estimate at ``now_s`` (at or after the last add)."""
        state = self._counts.get(client)
        if state is None:
            return 0.0
        index = self._index(now_s)
        prev, cur = _roll(state, index)
        return sliding_count(prev, cur, now_s - index * self.window_s, self.window_s)

    def counts(self, now_s: float, clients: Iterable[Hashable] | None = None,
               at_least: float = 0.0) -> dict[Hashable, float]:
        """The counts above 0 and at or above ``at_least`` of ``clients`` (None: all): :meth:`count`,
        inlined, for 100,000 clients a tick."""
        index = self._index(now_s)
        weight = max(0.0, 1.0 - (now_s - index * self.window_s) / self.window_s)
        states = self._counts
        pairs = states.items() if clients is None else ((c, states[c]) for c in clients if c in states)
        out = {}
        for client, (at, prev, cur) in pairs:
            value = cur + prev * weight if at == index else cur * weight if at == index - 1 else 0.0
            if value > 0 and value >= at_least:
                out[client] = value
        return out

    def clear(self, client: Hashable) -> None:
        self._counts.pop(client, None)

    def window_end_s(self, now_s: float) -> float:
        return (self._index(now_s) + 1) * self.window_s

    def __len__(self) -> int:
        return len(self._counts)

    def _index(self, t_s: float) -> int:
        return math.floor(t_s / self.window_s)

    def _split(self, last_s: float, now_s: float) -> tuple[int, float, float]:
        """(window index of now, share of (last, now] in that window, share in the one before)."""
        index, span = self._index(now_s), now_s - last_s
        if span <= 0:
            return index, 1.0, 0.0
        start = index * self.window_s
        in_cur = (now_s - max(last_s, start)) / span
        in_prev = (min(now_s, start) - max(last_s, start - self.window_s)) / span
        return index, in_cur, max(0.0, in_prev)

    def _forget_before(self, index: int) -> None:
        """Drop clients counted last before window ``index``: their sliding count is 0 now."""
        for client in [c for c, s in self._counts.items() if s[0] < index]:
            del self._counts[client]


def _roll(state: list, index: int) -> tuple[float, float]:
    """(prev, cur) of a client's counters seen from window ``index``."""
    if state[0] == index:
        return state[1], state[2]
    if state[0] == index - 1:
        return state[2], 0.0
    return 0.0, 0.0


# -- what agents tell each other ----------------------------------------------------------


@dataclass(frozen=True)
class BanNote:
    """A ban (or its tombstone, ``lifted``) as gossiped; time relative, so clocks need not agree."""
    client: Client
    version: int            # grows with every ban and unban of this client; the higher wins
    remaining_s: float      # until - sender's now
    lifted: bool = False


@dataclass(frozen=True)
class ClientReport:
    """One class's heavy clients as one sender counts them (top-K, largest first) and its bans.
    ``lengths`` is the sender's (IPv4, IPv6) key: a receiver with another key ignores the report."""
    lengths: tuple[int, int]
    counts: tuple[tuple[Client, float], ...] = ()
    bans: tuple[BanNote, ...] = ()


def _varint_bytes(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _packed_bytes(payload: int) -> int:
    """A packed repeated field: tag, length varint, payload; nothing when empty."""
    return 1 + _varint_bytes(payload) + payload if payload else 0


def _uint_bytes(value: int) -> int:
    """A proto3 integer field: tag and varint, nothing when 0."""
    return 1 + _varint_bytes(value) if value else 0


def ban_note_bytes(note: BanNote) -> int:
    """One BanNote in the proposed wire message (docs/clients.md), its tag and length included."""
    body = (2 + len(note.client) + _uint_bytes(note.version)
            + (5 if note.remaining_s else 0) + (2 if note.lifted else 0))
    return 1 + _varint_bytes(body) + body


def report_bytes(report: ClientReport) -> int:
    """The proposed ClientReport's encoded body (docs/clients.md "Report size"; without the tag and
    length that frame it): the class key, the key lengths, packed parallel arrays (IPv4 fixed32
    prefixes, IPv6 fixed64 halves, float counts), then the ban notes."""
    v4_len, v6_len = report.lengths
    n4 = sum(1 for c, _ in report.counts if len(c) == 4)
    n6 = len(report.counts) - n4
    body = 5 + _uint_bytes(v4_len) + _uint_bytes(v6_len) + 2 * _packed_bytes(4 * n4)
    body += _packed_bytes(8 * n6) * (2 if v6_len > 64 else 1) + _packed_bytes(4 * n6)
    return body + sum(map(ban_note_bytes, report.bans))


# -- the table: local counts + peers' reports -> limits and bans ---------------------------


@dataclass(frozen=True)
class ClientTick:
    """What one tick decided for one class."""
    limits: Mapping[Client, float]      # throttled clients -> this host's share, count per window
    bans: Mapping[Client, float]        # banned clients -> until_s (the caller's clock)
    issued: tuple[Client, ...]          # bans this host issued on this tick
    report: ClientReport                # to gossip to every alive peer
    resets: frozenset[Client] = frozenset()   # clients whose count starts over (bans, unbans) since the last tick
    line: float = 0.0                   # the reporting line: a client counted at or above it is heavy


@dataclass(frozen=True)
class ClientRow:
    """One client as ``drlctl clients`` shows it; counts per window, in the measure's unit."""
    client: Network
    global_count: float
    local_count: float
    state: str                          # ok, throttled or banned
    share: float | None = None          # this host's share while throttled
    banned_until_s: float | None = None
    hosts: tuple[str, ...] = ()         # the nodes that count it, this one included


@dataclass
class _Peer:
    at_s: float                         # when its report arrived
    counts: dict[Client, float]


@dataclass
class _Ban:
    version: int
    until_s: float
    lifted: bool = False                # a tombstone: an older ban note must not bring the ban back
    announced_s: float = -math.inf      # last put in a report; the least recent go first

    def in_force(self, now_s: float) -> bool:
        return not self.lifted and self.until_s > now_s


def throttle_share(limit: float, local: float, total: float, n_hosts: int) -> float:
    """This host's share of a throttled client's limit: a floor of FLOOR_FRACTION x limit / N for
    every host, the rest in proportion to local demand ([Raghavan07] §3: local limits from local
    and global demand).  Over N hosts sharing one view (total = the sum of their demands) the
    shares add up to ``limit`` exactly."""
    if total <= 0:
        return limit / n_hosts
    floor = FLOOR_FRACTION * limit / n_hosts
    return floor + (limit - n_hosts * floor) * (local / total)


class ClientTable:
    """One class's clients: local sliding counts, peers' reports, throttled set and bans.

    Call :meth:`tick` once an interval with the counter deltas, :meth:`receive` with each peer's
    report, :meth:`unban` for ``drlctl unban``, :meth:`rows` for ``drlctl clients``.  A peer's
    report counts until ``max_age_s`` after it arrived (the membership's liveness timeout):
    then it counts 0, like a stale peer's value ([Raghavan07] §5.6)."""

    def __init__(self, rule: ClientRule, max_age_s: float, start_s: float, node_id: str = ""):
        self.rule, self.max_age_s, self.node_id = rule, max_age_s, node_id
        self._lengths = (rule.key.v4_len, rule.key.v6_len)
        self._windows = Windows(rule.window_s, start_s)
        self._peers: dict[str, _Peer] = {}
        self._limited: set[Client] = set()
        self._bans: dict[Client, _Ban] = {}
        self._local: dict[Client, float] = {}       # this tick's counts of the clients that can matter
        self._heavy: set[Client] = set()             # at or above the reporting line
        self._n_hosts = 0                            # the N of the reporting line
        self._tick_s = start_s
        self._remote: dict[Client, float] = {}
        self._seen: dict[Client, list[str]] = {}
        self._shares: dict[Client, float] = {}
        self._resets: set[Client] = set()

    # -- input

    def tick(self, now_s: float, deltas: Mapping[Client, float], n_hosts: int) -> ClientTick:
        """One interval, the sliding windows kept here (a simulator, the tests): ``deltas`` are
        this host's counts per client since the previous tick; ``n_hosts`` the alive hosts, this
        one included."""
        self._expire(now_s)
        counted = self._countable(deltas, now_s)
        self._windows.add(now_s, counted)
        self._sum_peers(now_s)
        heavy = self._windows.counts(now_s, self._watched(counted, n_hosts), at_least=self.line(n_hosts))
        rest = self._windows.counts(now_s, (set(self._remote) | self._limited) - heavy.keys())
        return self._tick(now_s, {**rest, **heavy}, n_hosts)

    def tick_counts(self, now_s: float, counts: Mapping[Client, float], n_hosts: int) -> ClientTick:
        """One interval, the sliding windows kept elsewhere (the kernel, bpf/limiter.c): ``counts``
        are this host's sliding counts now, of at least the clients :meth:`wanted` names and every
        client newly at or above :meth:`line`; the agent's work grows with those, not with all
        the clients the kernel counts."""
        self._expire(now_s)
        self._sum_peers(now_s)
        return self._tick(now_s, {c: v for c, v in counts.items() if v > 0 and not self._banned(c, now_s)},
                          n_hosts)

    def line(self, n_hosts: int) -> float:
        """The reporting line: half a fair share of the threshold (REPORT_FRACTION / N)."""
        return REPORT_FRACTION * self.rule.limit / max(1, n_hosts)

    def wanted(self) -> set[Client]:
        """The clients whose counts the next :meth:`tick_counts` needs besides the newly heavy
        ones: counted last tick (until they fade to 0: the kernel flags a client once per window),
        reported by a peer, or throttled."""
        return set(self._local).union(self._remote, self._limited)

    def _tick(self, now_s: float, local: dict[Client, float], n_hosts: int) -> ClientTick:
        """Decide on this host's counts now: heavy ones, and those of peers' clients and throttled."""
        line = self.line(n_hosts)
        # The kernel never counts an exempt address; counts from elsewhere (a simulator) may hold
        # one: it is counted but never reported or limited, and checked here, on the few.
        self._heavy = {c for c, v in local.items() if v >= line and not self.rule.is_exempt(c)}
        self._local = local
        self._tick_s = now_s
        issued = self._decide(now_s, n_hosts)
        bans = {c: b.until_s for c, b in self._bans.items() if b.in_force(now_s)}
        resets, self._resets = frozenset(self._resets), set()
        return ClientTick(dict(self._shares), bans, tuple(issued), self._report(now_s), resets, line)

    def receive(self, peer: str, report: ClientReport, now_s: float) -> int:
        """A peer's report replaces its previous one; returns how many entries were ignored (all of
        a report made with other key lengths; a malformed or exempt client, a count that is not
        finite and >= 0, a ban note without a version or a finite time)."""
        if report.lengths != self._lengths:
            return len(report.counts) + len(report.bans)
        good = {c: v for c, v in report.counts if self._valid(c) and math.isfinite(v) and v >= 0}
        self._peers[peer] = _Peer(now_s, good)
        notes = [n for n in report.bans if self._valid(n.client) and math.isfinite(n.remaining_s) and n.version > 0]
        for note in notes:
            self._merge_ban(note, now_s)
        return len(report.counts) - len(good) + len(report.bans) - len(notes)

    def unban(self, prefix: Network, now_s: float) -> list[Network]:
        """Lift every ban in force that ``prefix`` covers (or the one ``prefix`` lies in); a tombstone
        one version up is gossiped so that no older ban note brings it back."""
        lifted = []
        for client, ban in list(self._bans.items()):
            net = self.rule.key.network(client)
            if ban.in_force(now_s) and net.version == prefix.version and (net.subnet_of(prefix)
                                                                          or prefix.subnet_of(net)):
                self._bans[client] = _Ban(ban.version + 1, ban.until_s + self.max_age_s, lifted=True)
                self._reset(client)
                lifted.append(net)
        return lifted

    # -- output

    def rows(self, now_s: float, limit: int | None = None) -> list[ClientRow]:
        """The clients as of the last tick, the banned first, then by global count."""
        network = self.rule.key.network
        banned = sorted((ClientRow(network(c), 0.0, 0.0, "banned", banned_until_s=b.until_s)
                         for c, b in self._bans.items() if b.in_force(now_s)),
                        key=lambda r: (r.client.version, r.client))
        local = {**self._local, **self._windows.counts(self._tick_s)}   # every client: drlctl asks rarely
        counted = {c for c in local if not self.rule.is_exempt(c)} | set(self._remote) | self._limited
        top = sorted(counted, key=lambda c: (-local.get(c, 0.0) - self._remote.get(c, 0.0), len(c), c))
        rows = banned + [self._row(c, local.get(c, 0.0)) for c in top]
        return rows if limit is None else rows[:limit]

    def summary(self, now_s: float) -> dict[str, int]:
        """For the class's status: clients counted (in the windows here, or the kernel's that the
        last tick looked at), throttled, banned."""
        return {"tracked": len(self._windows) or len(self._local), "throttled": len(self._shares),
                "banned": sum(1 for b in self._bans.values() if b.in_force(now_s))}

    # -- inside

    def _row(self, client: Client, local: float) -> ClientRow:
        remote = self._remote.get(client, 0.0)
        hosts = ([self.node_id] if local > 0 else []) + self._seen.get(client, [])
        share = self._shares.get(client)
        return ClientRow(self.rule.key.network(client), local + remote, local,
                         "ok" if share is None else "throttled", share, hosts=tuple(hosts))

    def _valid(self, client: Client) -> bool:
        return self.rule.key.owns(client) and not self.rule.is_exempt(client)

    def _banned(self, client: Client, now_s: float) -> bool:
        ban = self._bans.get(client)
        return ban is not None and ban.in_force(now_s)

    def _countable(self, deltas: Mapping[Client, float], now_s: float) -> Mapping[Client, float]:
        """Banned traffic is the ban's: it does not fill a window.  The kernel drops it uncounted;
        this also covers the interval before a new ban reaches the kernel."""
        banned = {c for c, b in self._bans.items() if b.in_force(now_s)}
        return {c: d for c, d in deltas.items() if c not in banned} if banned else deltas

    def _expire(self, now_s: float) -> None:
        for peer in [p for p, r in self._peers.items() if now_s - r.at_s > self.max_age_s]:
            del self._peers[peer]
        # An ended ban is kept for one liveness timeout: a peer's late note of it (clocks drift by
        # the gossip delay) then merges into it instead of banning the client again.
        for client in [c for c, b in self._bans.items() if b.until_s + self.max_age_s <= now_s]:
            del self._bans[client]

    def _sum_peers(self, now_s: float) -> None:
        remote: dict[Client, float] = {}
        seen: dict[Client, list[str]] = {}
        for peer, report in sorted(self._peers.items()):
            for client, count in report.counts.items():
                if count > 0 and not self._banned(client, now_s):
                    remote[client] = remote.get(client, 0.0) + count
                    seen.setdefault(client, []).append(peer)
        self._remote, self._seen = remote, seen

    def _watched(self, counted: Mapping[Client, float], n_hosts: int) -> Iterable[Client] | None:
        """The clients whose count can matter this tick: counted now, heavy before, reported by a
        peer, or throttled.  A client with nothing new only loses count, so one below the line
        stays below it; all of them (None) when N changed, which moved the line, or when most
        clients were counted anyway (one scan of the table is cheaper than a set of them)."""
        if n_hosts != self._n_hosts or 2 * len(counted) >= len(self._windows):
            self._n_hosts = n_hosts
            return None
        return self._heavy.union(counted, self._remote, self._limited)

    def _decide(self, now_s: float, n_hosts: int) -> list[Client]:
        """Throttle: enter at the limit, leave below RELEASE_FRACTION of it.  Ban: issue at the
        limit.  Only clients at or above the reporting line here, reported by a peer, or
        throttled can be over the limit: the others' local count is all there is of them."""
        limit, issued = self.rule.limit, []
        self._shares = {}
        for client in self._heavy | set(self._remote) | self._limited:
            local = self._local.get(client, 0.0)
            total = local + self._remote.get(client, 0.0)
            if self.rule.action == "ban":
                if total >= limit:
                    self._issue(client, now_s)
                    issued.append(client)
                continue
            if total >= limit or (client in self._limited and total >= RELEASE_FRACTION * limit):
                self._limited.add(client)
                n = max(n_hosts, 1 + len(self._seen.get(client, ())))
                self._shares[client] = throttle_share(limit, local, total, n)
            else:
                self._limited.discard(client)
        return issued

    def _issue(self, client: Client, now_s: float) -> None:
        """[RLDesign] "Banning clients based on request rates": until the window is over, plus
        the ban duration."""
        old = self._bans.get(client)
        until_s = self._windows.window_end_s(now_s) + self.rule.ban_duration_s
        self._bans[client] = _Ban(old.version + 1 if old else 1, until_s)
        self._reset(client)

    def _merge_ban(self, note: BanNote, now_s: float) -> None:
        """The higher version wins; at one version a tombstone beats a ban, two bans keep the
        later end.  A change of state restarts the client's count on this host."""
        if note.remaining_s <= 0:
            return
        until_s = now_s + note.remaining_s
        old = self._bans.get(note.client)
        if old is None or note.version > old.version or (note.version == old.version and note.lifted
                                                         and not old.lifted):
            self._bans[note.client] = _Ban(note.version, until_s, note.lifted)
            self._reset(note.client)
        elif note.version == old.version and note.lifted == old.lifted:
            old.until_s = max(old.until_s, until_s)

    def _reset(self, client: Client) -> None:
        """A ban or an unban ends the client's window: it is judged on what it does next."""
        self._windows.clear(client)
        self._resets.add(client)
        self._limited.discard(client)
        for report in self._peers.values():
            report.counts.pop(client, None)
        for table in (self._local, self._remote, self._shares):
            table.pop(client, None)
        self._heavy.discard(client)

    def _report(self, now_s: float) -> ClientReport:
        """The top REPORT_K clients at or above the reporting line (REPORT_FRACTION of a fair
        share), or seen here at all while a peer reports them or they are throttled; then
        MAX_BAN_NOTES ban notes, the least recently sent first, so every ban goes round."""
        local = self._local                         # a client banned on this tick has left it
        wanted = {c for c in (*self._heavy, *self._remote, *self._limited) if c in local}
        top = sorted(((c, local[c]) for c in wanted), key=lambda cv: (-cv[1], cv[0]))[:REPORT_K]
        live = [(c, b) for c, b in self._bans.items() if b.until_s > now_s]
        bans = sorted(live, key=lambda cb: (cb[1].announced_s, cb[0]))[:MAX_BAN_NOTES]
        for _, ban in bans:
            ban.announced_s = now_s
        notes = tuple(BanNote(c, b.version, b.until_s - now_s, b.lifted) for c, b in bans)
        return ClientReport(self._lengths, tuple(top), notes)
