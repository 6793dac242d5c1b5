"""Nested classes: a tree of global limits, and what each node may use now (docs/hierarchy.md).

    tree = build_tree({"customer-x": Node(limit=30e6 / 8),
                       "video": Node(parent="customer-x", rate=20e6 / 8),
                       "api": Node(parent="customer-x", rate=5e6 / 8, ceil=10e6 / 8),
                       "rest": Node(parent="customer-x")})
    shares = allocate(tree, {"video": 25e6 / 8, "api": 0.0, "rest": 10e6 / 8})
    shares["video"].limit                   # bytes/s, across all hosts together

Pure arithmetic on global rates (bytes/s): no clock, no host, no state.  A root's
limit is its global limit, whatever its demand.  A parent's limit is split among its
children in four fills, each max-min fair by weight over what it adds (a child's
increment is ``weight × level``, up to the fill's cap):

1. **guarantees**: each child gets ``min(want, rate)``, where ``want`` is its demand
   capped by its ceil (an inner node's: its children's wants summed, capped by its
   ceil), plus ``IDLE_RESERVE`` of the guarantee it leaves unused;
2. **borrowing**: what that leaves goes to the children that want more, up to their want;
3. **return**: what is still left first restores guarantees (up to each rate);
4. **headroom**: the rest up to each ceil, so the limits sum to the parent's limit
   (or to the children's ceils, if smaller).

Why the reserve, and why fills 3 and 4.  A limit here follows demand with a lag: the
agents measure demand under the limit of the last interval, and the limit of the
next interval is computed from it.  A child whose guarantee was lent must get it
back within a few intervals of its traffic returning, yet its whole guarantee
cannot stay reserved while it is lent (the limits would sum above the parent's).
So an idle child keeps 1/8 of its unused guarantee as its limit, enough to start
sending at once, and lends the other 7/8; its demand (arrivals: what it sent
plus what was dropped) then exceeds that limit, fill 1 gives it back ``min(demand,
rate)`` the next interval, and with the estimator's headroom (a limited class's
demand is at least its limit) it is back at its rate in a few intervals: 1/8 -> 1
in three doublings.  When nobody borrows it, fill 3 gives an idle child its whole
rate at once, and fill 4 gives every child room to grow up to its ceil, so a
parent that is not saturated never holds a child to what it used last interval.

Properties (tests/unit/classes/test_hierarchy.py, against an independent solver):
children's limits sum to at most their parent's; each limit is within its ceil;
a child gets at least ``min(want, rate)``; work-conserving (while a child wants
more than its limit, its siblings' limits use up the parent's); and monotone in
one's own demand: more demand for a leaf never lowers that leaf's limit (it may
lower its siblings' and cousins' limits: their borrowing and headroom shrink).

A tree is checked once (:func:`build_tree`, :class:`HierarchyError` names the class
and the key), so :func:`allocate` cannot fail on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Mapping, Sequence

from drl.agent.units import format_rate

IDLE_RESERVE = 1 / 8        # share of an unused guarantee a child keeps as its limit (see above)
KEYS = ("parent", "rate", "ceil", "weight")      # a child's keys; a root has "limit" (its global)


class HierarchyError(ValueError):
    """A tree that cannot hold; one line naming the class, and the key to change (``.key``)."""

    def __init__(self, name: str, key: str, what: str):
        super().__init__(f"class {name!r}: {what}")
        self.name, self.key = name, key


@dataclass(frozen=True)
class Node:
    """A class as configured (bytes/s): a root has a ``limit``, a child a ``parent``; a child's
    ``rate`` defaults to 0, its ``ceil`` to its parent's ceil (a root's: its limit), ``weight`` to 1."""
    parent: str | None = None
    limit: float | None = None
    rate: float | None = None
    ceil: float | None = None
    weight: float | None = None


@dataclass(frozen=True)
class Tree:
    """A checked tree, defaults resolved; a root's rate and ceil are its limit."""
    parent: Mapping[str, str | None]
    rate: Mapping[str, float]
    ceil: Mapping[str, float]
    weight: Mapping[str, float]
    children: Mapping[str, tuple[str, ...]]
    order: tuple[str, ...]          # every node after its parent

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(n for n in self.order if not self.children[n])

    def depth(self, name: str) -> int:
        """A root is at depth 1."""
        parent = self.parent[name]
        return 1 if parent is None else 1 + self.depth(parent)


@dataclass(frozen=True)
class Share:
    """One node's allocation (bytes/s, global)."""
    limit: float        # what it may use now, all hosts together
    want: float         # its demand capped by its ceil (an inner node's: its children's, capped)
    lent: float         # the guarantee it does not use and leaves to its siblings
    borrowed: float     # what it is given for its demand above its rate


def build_tree(nodes: Mapping[str, Node]) -> Tree:
    """Check and resolve a tree; raises HierarchyError naming the class and key."""
    for name, node in nodes.items():
        _check_node(name, node, nodes)
    order = _top_down(nodes)
    rate, ceil, weight = {}, {}, {}
    for name in order:
        node = nodes[name]
        if node.parent is None:
            rate[name] = ceil[name] = node.limit
        else:
            ceil[name] = node.ceil if node.ceil is not None else ceil[node.parent]
            rate[name] = node.rate or 0.0
            if ceil[name] > ceil[node.parent]:
                raise HierarchyError(name, "ceil", f"ceil {format_rate(ceil[name])} is above its parent "
                                     f"{node.parent!r}'s limit {format_rate(ceil[node.parent])}")
            if rate[name] > ceil[name]:
                raise HierarchyError(name, "rate", f"rate {format_rate(rate[name])} is above its ceil "
                                     f"{format_rate(ceil[name])}")
        weight[name] = node.weight if node.weight is not None else 1.0
    children = {name: tuple(c for c in order if nodes[c].parent == name) for name in order}
    for name, kids in children.items():
        _check_rates(name, kids, nodes, rate)
    return Tree(parent={n: nodes[n].parent for n in order}, rate=rate, ceil=ceil, weight=weight,
                children=children, order=order)


def allocate(tree: Tree, demand: Mapping[str, float], reserve: float = IDLE_RESERVE) -> dict[str, Share]:
    """Every node's Share, given each leaf's global demand (bytes/s; a leaf not named: 0).
    An inner node's demand is its children's; a demand given for one is not read."""
    want = wants(tree, demand)
    limit = {n: tree.ceil[n] for n in tree.order if tree.parent[n] is None}
    for name in tree.order:
        kids = tree.children[name]
        if kids:
            limit.update(zip(kids, split(limit[name], [want[k] for k in kids], [tree.rate[k] for k in kids],
                                         [tree.ceil[k] for k in kids], [tree.weight[k] for k in kids], reserve)))
    return {n: Share(limit=limit[n], want=want[n], lent=(1 - reserve) * max(0.0, tree.rate[n] - want[n])
                     if tree.parent[n] else 0.0, borrowed=max(0.0, min(limit[n], want[n]) - tree.rate[n])
                     if tree.parent[n] else 0.0)
            for n in tree.order}


def wants(tree: Tree, demand: Mapping[str, float]) -> dict[str, float]:
    """Each node's demand capped by its ceil; an inner node's is its children's, summed."""
    want: dict[str, float] = {}
    for name in reversed(tree.order):
        kids = tree.children[name]
        own = sum(want[k] for k in kids) if kids else max(0.0, demand.get(name, 0.0))
        want[name] = min(tree.ceil[name], own)
    return want


def split(limit: float, want: Sequence[float], rate: Sequence[float], ceil: Sequence[float],
          weight: Sequence[float], reserve: float = IDLE_RESERVE) -> list[float]:
    """One parent's ``limit`` among its children: the four fills of the module's docstring."""
    alloc = [min(w, r) + reserve * max(0.0, r - w) for w, r in zip(want, rate)]
    left = limit - sum(alloc)
    for cap in ([max(a, w) for a, w in zip(alloc, want)], list(rate), list(ceil)):
        alloc, left = fill(alloc, cap, weight, left)
    return alloc


def fill(alloc: Sequence[float], cap: Sequence[float], weight: Sequence[float],
         amount: float) -> tuple[list[float], float]:
    """Add ``min(cap - alloc, weight × level)`` to each, the one level that hands out
    ``amount`` (or everything up to the caps); -> (new allocations, what is left)."""
    room = [max(0.0, c - a) for a, c in zip(alloc, cap)]
    if amount <= 0 or not any(room):
        return list(alloc), max(0.0, amount)
    if sum(room) <= amount:
        return [a + r for a, r in zip(alloc, room)], amount - sum(room)
    # the children in the order their room runs out as the level rises; below the k-th's
    # level, the first k are full and the others' weights (summed, not subtracted) take the rest
    by_level = sorted((i for i in range(len(alloc)) if room[i] > 0), key=lambda i: room[i] / weight[i])
    suffix = list(accumulate(weight[i] for i in reversed(by_level)))[::-1]
    full = 0.0
    for i, weights in zip(by_level, suffix):
        if full + room[i] / weight[i] * weights >= amount:
            level = (amount - full) / weights
            return [a + min(r, w * level) for a, r, w in zip(alloc, room, weight)], 0.0
        full += room[i]
    return [a + r for a, r in zip(alloc, room)], 0.0        # the rooms sum to the amount, up to rounding


def _check_node(name: str, node: Node, nodes: Mapping[str, Node]) -> None:
    if node.parent is None:
        child_key = next((k for k in KEYS[1:] if getattr(node, k) is not None), None)
        if child_key:
            raise HierarchyError(name, child_key, f"{child_key} is a child's key: give parent = \"...\" too")
        if node.limit is None:
            raise HierarchyError(name, "global", "missing global limit (a class without parent is a root)")
        return
    if node.limit is not None:
        raise HierarchyError(name, "global", f"a child has no global limit of its own: its parent "
                             f"{node.parent!r} bounds it; write ceil for the most it may use")
    if node.parent not in nodes:
        raise HierarchyError(name, "parent", f"parent {node.parent!r} is not a class")
    seen = [name]
    while (up := nodes[seen[-1]].parent) in nodes:      # a missing one is refused at its child
        if up in seen:
            raise HierarchyError(name, "parent", f"parent {node.parent!r} makes a cycle: "
                                 f"{' -> '.join(seen[seen.index(up):] + [up])}")
        seen.append(up)


def _top_down(nodes: Mapping[str, Node]) -> tuple[str, ...]:
    """Parents before children, in the order given otherwise (so the same on every agent)."""
    placed: dict[str, None] = {}

    def place(name: str) -> None:
        parent = nodes[name].parent
        if parent is not None and parent not in placed:
            place(parent)
        placed.setdefault(name)

    for name in nodes:
        place(name)
    return tuple(placed)


def _check_rates(name: str, kids: tuple[str, ...], nodes: Mapping[str, Node], rate: Mapping[str, float]) -> None:
    """The children's guarantees fit in their parent's: its rate (a root's: its global limit)."""
    total = sum(rate[k] for k in kids)
    if total > rate[name] * (1 + 1e-12):
        key = "global" if nodes[name].parent is None else "rate"
        parts = ", ".join(f"{k} {format_rate(rate[k])}" for k in kids if rate[k])
        raise HierarchyError(name, key, f"its children's rates sum to {format_rate(total)} ({parts}), "
                             f"above its {'global limit' if key == 'global' else 'rate'} {format_rate(rate[name])}")
