"""Communication graphs for the transfer-based allocators (GDRL, fill ratio, DQMP).

Every node derives the same graph from the same sorted member list, so no
message is needed to agree on who talks to whom::

    >>> members = ("a", "b", "c", "d")
    >>> Graph().neighbours("a", members)                    # ring, d = 2
    ('b', 'd')
    >>> g = Graph(kind="regular", degree=3, seed=7)         # random 3-regular, seeded
    >>> all(len(g.neighbours(m, members)) == 3 for m in members)
    True
    >>> Graph(kind="edges", edges=(("a", "c"),)).neighbours("c", members)
    ('a',)

Kinds: ``ring`` ([Stanojevic09] Fig. 2, [Ramsden]
§2.2), ``regular`` (the random d-regular graphs of [Stanojevic09] §III-C) and ``edges``
(given by the operator).  A bad combination raises :class:`GraphError`.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from .common import ParameterError

KINDS = ("ring", "regular", "edges")

Adjacency = dict[str, tuple[str, ...]]


class GraphError(ParameterError):
    """A graph that cannot be built for these members (one-line message)."""


@dataclass(frozen=True)
class Graph:
    kind: str = "ring"
    degree: int = 2
    seed: int = 0
    edges: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GraphError(f"graph kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def neighbours(self, node_id: str, members: tuple[str, ...]) -> tuple[str, ...]:
        """``node_id``'s neighbours, sorted; () when it is not a member."""
        return self.adjacency(tuple(sorted(members))).get(node_id, ())

    def degree_of(self, members: tuple[str, ...]) -> int:
        """The largest degree in the graph (the d of eta < 1/(2d), [Stanojevic09] eq. 15)."""
        return max((len(n) for n in self.adjacency(tuple(sorted(members))).values()), default=0)

    def adjacency(self, members: tuple[str, ...]) -> Adjacency:
        return _adjacency(self, members)


@lru_cache(maxsize=64)
def _adjacency(graph: Graph, members: tuple[str, ...]) -> Adjacency:
    # Cached: every node of a simulated cluster asks for the same graph each tick.
    if graph.kind == "ring":
        pairs = _ring_pairs(list(members))
    elif graph.kind == "regular":
        pairs = _regular_pairs(members, graph.degree, graph.seed)
    else:
        pairs = _given_pairs(members, graph.edges)
    adj: dict[str, set[str]] = {m: set() for m in members}
    for a, b in pairs:
        adj[a].add(b)
        adj[b].add(a)
    return {m: tuple(sorted(n)) for m, n in adj.items()}


def _ring_pairs(order: list[str]) -> set[tuple[str, str]]:
    n = len(order)
    if n < 2:
        return set()
    return {_pair(order[k], order[(k + 1) % n]) for k in range(n)}


def _circulant_pairs(order: list[str], degree: int) -> set[tuple[str, str]]:
    """Each node linked to the degree//2 next ones in ``order`` (plus the opposite
    one for odd degree): connected and ``degree``-regular by construction."""
    n = len(order)
    pairs = {_pair(order[k], order[(k + off) % n]) for k in range(n) for off in range(1, degree // 2 + 1)}
    if degree % 2:
        pairs |= {_pair(order[k], order[(k + n // 2) % n]) for k in range(n // 2)}
    return pairs


def _regular_pairs(members: tuple[str, ...], degree: int, seed: int) -> set[tuple[str, str]]:
    n = len(members)
    if not 1 <= degree < n or (n * degree) % 2:
        raise GraphError(f"no {degree}-regular graph on {n} nodes (need 1 <= d < N and N*d even)")
    rng = random.Random(f"{seed}:{n}:{degree}")
    order = list(members)
    rng.shuffle(order)
    base = _circulant_pairs(order, degree)
    # Degree-preserving double-edge swaps randomise the circulant further; a
    # swap sequence that disconnects the graph is dropped (GDRL needs G connected,
    # 003 Theorem 1 Step 4), so the result is always connected.
    for _ in range(8):
        pairs = _swapped(base, rng, swaps=4 * len(base))
        if _connected(members, pairs):
            return pairs
    return base


def _swapped(pairs: set[tuple[str, str]], rng: random.Random, swaps: int) -> set[tuple[str, str]]:
    edges = sorted(pairs)
    present = set(pairs)
    for _ in range(swaps):
        i, j = rng.randrange(len(edges)), rng.randrange(len(edges))
        (a, b), (c, d) = edges[i], edges[j]
        new1, new2 = _pair(a, d), _pair(c, b)
        if len({a, b, c, d}) < 4 or new1 in present or new2 in present:
            continue
        present -= {edges[i], edges[j]}
        present |= {new1, new2}
        edges[i], edges[j] = new1, new2
    return present


def _given_pairs(members: tuple[str, ...], edges: tuple[tuple[str, str], ...]) -> set[tuple[str, str]]:
    known = set(members)
    for a, b in edges:
        if a == b or a not in known or b not in known:
            raise GraphError(f"edge {a}-{b} must join two different members")
    return {_pair(a, b) for a, b in edges}


def _connected(members: tuple[str, ...], pairs: set[tuple[str, str]]) -> bool:
    adj: dict[str, list[str]] = {m: [] for m in members}
    for a, b in pairs:
        adj[a].append(b)
        adj[b].append(a)
    return len(bfs_levels(members[0], adj)) == len(members) if members else True


def bfs_levels(root: str, adj: dict[str, list[str]] | Adjacency) -> dict[str, int]:
    """Hop distance from ``root`` to every node it reaches (DQMP's tree levels, [Behl12] §4.2)."""
    levels = {root: 0}
    queue = deque([root])
    while queue:
        node = queue.popleft()
        for nxt in adj.get(node, ()):
            if nxt not in levels:
                levels[nxt] = levels[node] + 1
                queue.append(nxt)
    return levels


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)
