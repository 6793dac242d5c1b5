"""The sum tree: every limiter learns the sum of all limiters' values within three intervals,
whatever the gossip branching.

    tree = SumTree("n07", interval_s=0.1, timeout_s=members.timeout_s)
    tree.receive(rx.header.node, rx.payload, now)              # a Sums datagram gossip accepted
    view = tree.apply(members.view(key, now), key, now)        # remote_sum from the tree, if it covers
    for node_id, sums in tree.round(view.members, {key: value, ...}, now, usable):
        transport.send_sums(node_id, sums, now)

Why.  FPS's line 10 and GRD's aggregate demand read only the *sum* of the peers' values
(``PeerView.remote_sum``).  Per-peer gossip with branching b brings each peer's value once every
ceil((N-1)/b) intervals: 16.7 s at 1,000 limiters, 50 ms and b = 3, and while a change travels
the local limits sum to 1.4-2.8 x the global limit (bench/RESULTS.md, "envelope by gossip
branching").  A sum can travel in aggregate, in a fixed number of hops.

How, every interval, after the allocators have decided:

* The members form ceil(N / FAN_IN) groups, each member's chosen by a consistent hash of its id
  (``groups``: a join or a leave moves no other member).  A limiter sends its values (LEAF) to
  its group's *summer*: the group's first member by id that it can reach and that has not
  failed it (itself, for the first member).
* A summer (a limiter that chose itself, or that some leaf chose) sends a PARTIAL, the sum of
  the LEAFs it had within FRESH intervals (and of its own values if it chose itself), to the
  first usable member of every group and to every limiter whose PARTIAL it had within FRESH
  intervals; and to each of its leaves a TOTAL: its own partial and every fresh partial it
  has, less that leaf's own value.
* Every limiter sends its values to exactly one summer, so the partials are sums over
  disjoint sets and their sum counts every limiter once, whoever sums: two limiters that both
  sum a group (their views differ for a while) send two partials, over disjoint leaves.
* A leaf whose summer sent no TOTAL for SWITCH intervals passes it over for the liveness
  timeout and sends to the group's next member, which then sums.
* ``apply``: a limiter's remote sum is its TOTAL (a summer that chose itself works its own
  out) while that is at most FRESH intervals old and counts at least as many other limiters as
  per-peer gossip shows alive; else per-peer gossip's sum, as without the tree.  A tree that
  lost a partial counts fewer (a summer just failed), and so does one that a restarted
  limiter has not joined yet.

A value reaches its summer in one interval and every other summer in two, so a TOTAL is at
most three intervals old when it is read.  A class whose value is 0 is left out of every
Sums, so it costs nothing while idle; a value not heard again within FRESH intervals counts 0.
Cost per interval: a leaf sends one datagram (more for many classes) and gets one; a summer
sends about N/FAN_IN + FAN_IN.  Trust: Sums are authenticated like every datagram and must
come from the node id bound to their address (agent/gossip/core.py); a TOTAL counts only from
the summer we chose.  A member may lie in a PARTIAL as it may about its own value: it holds
the cluster key.
"""
from __future__ import annotations

import functools
import hashlib
import math
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, NamedTuple, Sequence

from drl.agent.model import PeerView
from drl.agent.gossip.wire import Sums, SumKind

if TYPE_CHECKING:
    from drl.agent.gossip.dispatch import Dispatch

FAN_IN = 32        # members per group: two levels up to 1,024 limiters, ~60 datagrams a summer sends
FRESH = 3          # intervals a LEAF, PARTIAL or TOTAL counts after it arrived
SWITCH = 5         # intervals without a TOTAL after which a leaf passes its summer over


class _Heard:
    """What one sender's Sums of one kind said: per class (value, when), and its node count.
    A multi-datagram message updates the classes it carries; the others age out."""
    __slots__ = ("at", "nodes", "values", "summers")

    def __init__(self) -> None:
        self.at, self.nodes = -math.inf, 0
        self.values: dict[int, tuple[float, float]] = {}
        self.summers: tuple[str, ...] = ()

    def merge(self, sums: Sums, now: float) -> None:
        self.at, self.nodes = now, sums.nodes
        self.values.update((key, (value, now)) for key, value in sums.values)
        if sums.summers:
            self.summers = sums.summers

    def current(self, since: float) -> dict[int, float]:
        """The classes heard since ``since``; older ones are forgotten."""
        self.values = {k: vt for k, vt in self.values.items() if vt[1] >= since}
        return {k: v for k, (v, _) in self.values.items()}


class Remote(NamedTuple):
    """The sum over every other limiter, per class (a class missing is 0), and their number."""
    at: float
    nodes: int
    values: Mapping[int, float]


def tree_wanted(n_peers: int, branching: int, reads_sum: bool) -> bool:
    """Whether a limiter runs the tree: when some class's allocator reads only the peers' sum and
    per-peer gossip takes more than one interval to reach every peer."""
    return reads_sum and branching < n_peers


@functools.lru_cache(maxsize=8)       # the simulator's nodes all ask for the same members
def groups(members: tuple[str, ...], fan_in: int = FAN_IN) -> dict[str, tuple[str, ...]]:
    """Each member's group (sorted ids): ceil(N / fan_in) groups, a member's chosen by a jump
    consistent hash of its id (Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash
    Algorithm", 2014), so that a member joining or leaving moves no other member to another
    group but when the number of groups changes, and then about 1 in that number."""
    n_groups = max(1, -(-len(members) // fan_in))
    out: dict[int, list[str]] = {}
    for node in members:
        out.setdefault(_jump(_key(node), n_groups), []).append(node)
    return {node: tuple(sorted(group)) for group in out.values() for node in group}


@functools.lru_cache(maxsize=8)
def _distinct(members: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Every group once: a summer sends its PARTIAL to each group, every interval, and a scan
    of every member's group per summer and interval costs as much as the rest of the tree."""
    return tuple({group[0]: group for group in groups(members).values()}.values())


@functools.lru_cache(maxsize=1 << 16)
def _key(node: str) -> int:
    """A node id's 64-bit key, the same in every process (str's hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "big")


def _jump(key: int, buckets: int) -> int:
    """Jump consistent hash: ``key``'s bucket in [0, buckets)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (2**31 / ((key >> 33) + 1)))
    return b


class SumTree:
    def __init__(self, node_id: str, interval_s: float, timeout_s: float) -> None:
        self.node_id, self.interval_s, self.timeout_s = node_id, interval_s, timeout_s
        self._leaves: dict[str, _Heard] = {}
        self._partials: dict[str, _Heard] = {}
        self._total = _Heard()               # the TOTAL of the summer we chose
        self._own: Remote | None = None      # our remote sums, when we sum our own group
        self._summer: str | None = None      # whom we send our LEAF (ourselves: we sum)
        self._asked = -math.inf              # since when, without a TOTAL back
        self._passed: dict[str, float] = {}  # summers passed over, until when
        self._read: tuple[float, Remote | None] = (math.nan, None)
        self._members: tuple[str, ...] = ()
        self._groups: dict[str, tuple[str, ...]] = {}      # member -> its group
        self._mine: frozenset[str] = frozenset()           # our group, for the leaves' test
        self._told: tuple[str, ...] = ()     # whom our last PARTIAL went to

    def subscribe(self, dispatch: Dispatch) -> None:
        dispatch.on(Sums, lambda rx, now: self.receive(rx.header.node, rx.payload, now))

    def receive(self, sender: str, sums: Sums, now: float) -> None:
        """One accepted Sums from ``sender``; a TOTAL counts only from our summer.  A LEAF or
        PARTIAL of no limiter takes back the sender's last (it chose another summer, or
        stopped summing), so its values are not counted twice while they age out."""
        if sums.kind != SumKind.TOTAL:
            heard = self._leaves if sums.kind == SumKind.LEAF else self._partials
            if sums.nodes:
                heard.setdefault(sender, _Heard()).merge(sums, now)
            else:
                heard.pop(sender, None)
        elif sender == self._summer:
            self._total.merge(sums, now)
            self._asked = now
            self._read = (math.nan, None)

    def remote(self, now: float) -> Remote | None:
        """Our remote sums while at most FRESH intervals old, else None (worked out once per
        ``now``: a tick applies it to thousands of classes)."""
        if self._read[0] != now:
            since = now - FRESH * self.interval_s
            if self._summer == self.node_id:
                got = self._own if self._own is not None and self._own.at >= since else None
            elif self._total.at < since:
                got = None
            else:
                got = Remote(self._total.at, self._total.nodes, self._total.current(since))
            self._read = (now, got)
        return self._read[1]

    def apply(self, view: PeerView, key: int, now: float) -> PeerView:
        """``view`` with the tree's remote sum for class ``key``, if the tree covers at least the
        peers per-peer gossip shows alive; ``view`` unchanged otherwise.  A peer the tree counts is
        alive (it sent its value within FRESH intervals), so only as many peers as the tree misses
        keep a reservation for what their datapaths may pass (effective_limit), the largest ones:
        else a peer per-peer gossip has not heard yet would count twice, by its value in the sum
        and by its reservation (a joiner, for up to two gossip cycles)."""
        got = self.remote(now)
        if got is None or got.nodes < view.n_alive:
            return view
        silent = max(0, view.n_nodes - 1 - got.nodes)
        if silent >= view.n_stale:
            return view._replace(remote_sum=got.values.get(key, 0.0))
        reserved = None if view.reserved_Bps is None else sum(view.stale_reserves[:silent])
        return view._replace(remote_sum=got.values.get(key, 0.0), n_alive=view.n_nodes - 1 - silent,
                             reserved_Bps=reserved, stale_reserves=view.stale_reserves[:silent])

    def round(self, members: tuple[str, ...], own: Mapping[int, float], now: float,
              usable: Callable[[str], bool]) -> list[tuple[str, Sums]]:
        """This interval's Sums: (node id, Sums) to send.  ``members``: every member id sorted,
        ours included; ``own``: our values by class (only classes whose values are summed);
        ``usable``: whether a peer can be sent to (its address is known)."""
        if members is not self._members and members != self._members:    # the groups change, few members move
            self._members, self._groups = members, groups(tuple(members))
            self._mine = frozenset(self._groups.get(self.node_id, ()))
        was = self._summer
        summer = self._choose(self._groups.get(self.node_id, ()), now, usable)
        out: list[tuple[str, Sums]] = []
        if was not in (None, summer, self.node_id) and usable(was):
            out.append((was, Sums(SumKind.LEAF, 0)))         # take our value back from the old one
        own = {k: v for k, v in own.items() if v > 0.0}
        if summer != self.node_id:
            out.append((summer, Sums(SumKind.LEAF, 1, tuple(own.items()))))
            own = {}
        since = now - FRESH * self.interval_s
        group = self._mine     # a leaf outside our group (it moved) is its new summer's
        self._leaves = {node: h for node, h in self._leaves.items() if h.at >= since and node in group}
        self._partials = {node: h for node, h in self._partials.items()     # a member's: one gone sums nothing
                          if h.at >= since and node in self._groups}
        self._read = (math.nan, None)
        self._own = None
        if summer == self.node_id or self._leaves:
            return out + self._sum(own, now, usable)
        out += [(node, Sums(SumKind.PARTIAL, 0)) for node in self._told]    # we no longer sum
        self._told = ()
        return out

    def _sum(self, own: Mapping[int, float], now: float, usable: Callable[[str], bool]) -> list[tuple[str, Sums]]:
        """A summer's PARTIAL to the others, and a TOTAL to each of its leaves; ``own``: our
        values if we chose ourselves, else nothing (they are in our summer's partial)."""
        since = now - FRESH * self.interval_s
        leaves = {node: heard.current(since) for node, heard in self._leaves.items()}
        mine = self._summer == self.node_id
        partial = _add(leaves.values(), own)
        nodes = len(leaves) + mine
        others = self._partials
        to = {*filter(None, (self._first_usable(g, usable) for g in _distinct(self._members))), *others}
        for heard in others.values():
            to.update(heard.summers)
        self._told = tuple(sorted(node for node in to if node != self.node_id and usable(node)))
        sent = Sums(SumKind.PARTIAL, nodes, tuple(partial.items()), (self.node_id, *sorted(others)))
        out = [(node, sent) for node in self._told]
        total = _add([heard.current(since) for heard in others.values()], partial)
        nodes += sum(heard.nodes for heard in others.values())
        out += [(leaf, Sums(SumKind.TOTAL, nodes - 1, _less(total, values))) for leaf, values in leaves.items()]
        if mine:
            self._own = Remote(now, nodes - 1, dict(_less(total, own)))
        return out

    def _choose(self, group: Sequence[str], now: float, usable: Callable[[str], bool]) -> str:
        """Our summer this interval: a new one when the current sent no TOTAL for SWITCH intervals."""
        if self._summer not in (None, self.node_id) and now - self._asked > SWITCH * self.interval_s:
            self._passed[self._summer] = now + self.timeout_s
        if self._passed:
            self._passed = {node: until for node, until in self._passed.items() if until > now}
        summer = self._first_usable(group, usable) or self.node_id
        if summer != self._summer:      # the old one's TOTAL still counts while fresh
            self._summer, self._asked = summer, now
        return summer

    def _first_usable(self, group: Sequence[str], usable: Callable[[str], bool]) -> str | None:
        """The group's first member we may send to (we are always one), not passed over."""
        return next((node for node in group
                     if node == self.node_id or (node not in self._passed and usable(node))), None)

    def status(self, now: float) -> dict:
        """For drlctl status: whom we send to, how many leaves we sum, how many others the tree covers."""
        got = self.remote(now)
        return {"summer": self._summer, "leaves": len(self._leaves),
                "covers": None if got is None else got.nodes, "passed_over": sorted(self._passed)}


def _add(parts: Iterable[Mapping[int, float]], start: Mapping[int, float]) -> dict[int, float]:
    out = dict(start)
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def _less(total: Mapping[int, float], values: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """``total`` less ``values`` per class, never below 0 (rounding), classes at 0 left out."""
    out = ((key, sum_ - values.get(key, 0.0)) for key, sum_ in total.items())
    return tuple((key, v) for key, v in out if v > 0.0)
