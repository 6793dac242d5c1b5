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
sends about N/FAN_IN + FAN_IN.

Trust.  Sums are authenticated like every datagram and must come from the node id bound to
their address (agent/gossip/core.py), but any member holds the cluster key, so what one says is
bounded where it is used, not only at decode (wire.py): a member that is no chosen summer moves
a remote sum by at most its own share (its value, 0 .. MAX_VALUE), and a chosen summer cannot
take one below the gossip floor (tests/unit/gossip/test_tree_liars.py):

* From a member only (of ``round``'s members); a LEAF counts one limiter, a PARTIAL at most its
  sender's group, a TOTAL at most the other members; each sum at most its count x MAX_VALUE.
* A TOTAL counts only from the summer we chose.  A PARTIAL counts only from its group's
  *first summing member*: no member of the sender's group (our groups) that sorts before it
  sums, as far as we know, i.e. is us summing or sent us a PARTIAL within FRESH intervals.
  That is the summer its group's leaves choose while the first is up, or the next once the
  first is down; a member that merely claims to sum changes nothing while the real one speaks.
  The cost: while two members sum one group (a leaf passed the first over), the second's
  leaves are missing from the others' totals, which then cover fewer limiters than are alive,
  so ``apply`` falls back to per-peer gossip there, as when a summer fails.
* The gossip floor.  The Batch values per-peer gossip brought us within FRESH intervals
  (``heard``) are a lower bound on the sum of the others, of the same freshness as a TOTAL, so
  ``apply`` reads the larger of the two: a summer that leaves values out cannot take the sum
  below what we heard ourselves.  (Per-peer gossip's own sum, every alive peer's last value,
  would more often give the smaller limit, but it holds a value that fell for up to a gossip
  cycle, the staleness the tree exists to avoid; FRESH intervals is the tree's own.)
* Lies.  A TOTAL counting more limiters than there are other members, or below half the floor
  left by the peers but our summer (its own value is its to say) for SWITCH intervals in a
  row, is a lie: we pass that summer over as a silent one, and read per-peer gossip for the
  liveness timeout (``lies`` counts them; status shows the summer passed over).  Half and
  SWITCH intervals leave room for values that fell since gossip brought them (an idle
  class's, snapped to 0, or a leaver's); a smaller lie is held to the floor instead.
* A summer counts at most every member, however many its leaves and PARTIALs claim.

What a liar sent is gone FRESH intervals after it stopped, as every LEAF, PARTIAL, TOTAL and
gossip value is, and what honest summers summed from it with their next message (a class they
leave out ages out, FRESH intervals a hop); passing over lasts the liveness timeout.
"""
from __future__ import annotations

import functools
import hashlib
import math
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, NamedTuple, Sequence

from drl.agent.model import PeerView
from drl.agent.gossip.wire import MAX_VALUE, Batch, Sums, SumKind, sendable

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

    def merge(self, sums: Sums, now: float, most: int) -> None:
        """Merge ``sums``, counting at most ``most`` limiters, each at most MAX_VALUE."""
        self.at, self.nodes = now, min(sums.nodes, most)
        cap = self.nodes * MAX_VALUE
        self.values.update((key, (sendable(value, cap, 0.0), now)) for key, value in sums.values)
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
        self._gossip: dict[str, dict[int, tuple[float, float]]] = {}   # peer -> class -> (value, when)
        self._summed: frozenset[int] = frozenset()                      # the classes we sum
        self._floor: tuple[float, dict[int, float]] = (math.nan, {})   # the gossip floor, at
        self._low = 0                        # reads in a row our summer's TOTAL was below the floor
        self._doubt = -math.inf              # until when we read per-peer gossip: a summer lied
        self.lies = 0

    def subscribe(self, dispatch: Dispatch) -> None:
        dispatch.on(Sums, lambda rx, now: self.receive(rx.header.node, rx.payload, now))
        dispatch.watch(Batch, lambda rx, now: self.heard(rx.header.node, rx.payload, now))

    def receive(self, sender: str, sums: Sums, now: float) -> None:
        """One accepted Sums from ``sender``, a member; a TOTAL counts only from our summer.  A
        LEAF or PARTIAL of no limiter takes back the sender's last (it chose another summer, or
        stopped summing), so its values are not counted twice while they age out."""
        group = self._groups.get(sender)
        if group is None:
            return
        if sums.kind != SumKind.TOTAL:
            leaf = sums.kind == SumKind.LEAF
            heard = self._leaves if leaf else self._partials
            if sums.nodes:
                heard.setdefault(sender, _Heard()).merge(sums, now, 1 if leaf else len(group))
            else:
                heard.pop(sender, None)
        elif sender == self._summer:
            if sums.nodes >= len(self._members):
                return self._lied(now)
            self._total.merge(sums, now, len(self._members) - 1)
            self._asked = now
            self._read = (math.nan, None)

    def heard(self, sender: str, batch: Batch, now: float) -> None:
        """A member's Batch (per-peer gossip): its values of the classes we sum, for the floor."""
        if sender in self._groups:
            values = self._gossip.setdefault(sender, {})
            for v in batch.values:
                if v.key in self._summed:
                    values[v.key] = (sendable(v.value, MAX_VALUE, 0.0), now)
            self._floor = (math.nan, {})

    def floor(self, now: float, without: str | None = None) -> dict[int, float]:
        """Per class, the sum of the members' gossip values heard within FRESH intervals (all
        but ``without``'s); the full one worked out once per ``now``."""
        if self._floor[0] != now or without is not None:
            since = now - FRESH * self.interval_s
            floor: dict[int, float] = {}
            for node, values in self._gossip.items():
                if node != without:
                    for key, (value, at) in values.items():
                        if at >= since:
                            floor[key] = floor.get(key, 0.0) + value
            if without is not None:
                return floor
            self._floor = (now, floor)
        return self._floor[1]

    def _lied(self, now: float) -> None:
        """Our summer lied: pass it over, and read per-peer gossip for the liveness timeout."""
        self._passed[self._summer] = self._doubt = now + self.timeout_s
        self._total, self._low, self._read = _Heard(), 0, (math.nan, None)
        self.lies += 1

    def remote(self, now: float) -> Remote | None:
        """Our remote sums while at most FRESH intervals old, else None (worked out once per
        ``now``: a tick applies it to thousands of classes)."""
        if self._read[0] != now:
            since = now - FRESH * self.interval_s
            if now < self._doubt:
                got = None
            elif self._summer == self.node_id:
                got = self._own if self._own is not None and self._own.at >= since else None
            elif self._total.at < since:
                got = None
            else:
                got = Remote(self._total.at, self._total.nodes, self._total.current(since))
                got = self._checked(got, now)
            self._read = (now, got)
        return self._read[1]

    def _checked(self, got: Remote, now: float) -> Remote | None:
        """Our summer's TOTAL, or None once it has been below half the floor of the others (its
        own value aside) for SWITCH reads in a row (a lie: module docstring)."""
        low = self.floor(now, without=self._summer)
        if any(got.values.get(key, 0.0) < value / 2 for key, value in low.items()):
            self._low += 1
            if self._low >= SWITCH:
                self._lied(now)
                return None
        else:
            self._low = 0
        return got

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
        remote = max(got.values.get(key, 0.0), self.floor(now).get(key, 0.0))
        silent = max(0, view.n_nodes - 1 - got.nodes)
        if silent >= view.n_stale:
            return view._replace(remote_sum=remote)
        reserved = None if view.reserved_Bps is None else sum(view.stale_reserves[:silent])
        return view._replace(remote_sum=remote, n_alive=view.n_nodes - 1 - silent,
                             reserved_Bps=reserved, stale_reserves=view.stale_reserves[:silent])

    def round(self, members: tuple[str, ...], own: Mapping[int, float], now: float,
              usable: Callable[[str], bool]) -> list[tuple[str, Sums]]:
        """This interval's Sums: (node id, Sums) to send.  ``members``: every member id sorted,
        ours included; ``own``: our values by class (only classes whose values are summed);
        ``usable``: whether a peer can be sent to (its address is known)."""
        if members is not self._members and members != self._members:    # the groups change, few members move
            self._members, self._groups = members, groups(tuple(members))
            self._mine = frozenset(self._groups.get(self.node_id, ()))
        self._summed = frozenset(own)
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
        self._gossip = {node: fresh for node, values in self._gossip.items() if node in self._groups
                        and (fresh := {k: vt for k, vt in values.items() if vt[1] >= since})}
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
        others = self._first_summing()
        to = {*filter(None, (self._first_usable(g, usable) for g in _distinct(self._members))), *self._partials}
        members = self._groups.keys()
        for heard in self._partials.values():
            to.update(members & heard.summers)    # a set operation: groups x summers a tick
        self._told = tuple(sorted(node for node in to if node != self.node_id and usable(node)))
        sent = Sums(SumKind.PARTIAL, nodes, tuple(partial.items()), (self.node_id, *sorted(others)))
        out = [(node, sent) for node in self._told]
        total = _add([heard.current(since) for heard in others.values()], partial)
        # a liar may count itself as our leaf and in its PARTIAL: never more than there are members
        nodes = min(len(self._members), nodes + sum(heard.nodes for heard in others.values()))
        out += [(leaf, Sums(SumKind.TOTAL, nodes - 1, _less(total, values))) for leaf, values in leaves.items()]
        if mine:
            self._own = Remote(now, nodes - 1, dict(_less(total, own)))
        return out

    def _first_summing(self) -> dict[str, _Heard]:
        """The PARTIALs that count: each from its group's first summing member (we sum)."""
        summing = {*self._partials, self.node_id}
        out = {}
        for node, heard in self._partials.items():
            group = self._groups[node]
            if not summing.intersection(group[:group.index(node)]):
                out[node] = heard
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
