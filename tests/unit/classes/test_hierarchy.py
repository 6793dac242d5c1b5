"""Nested classes' arithmetic (agent/classes/hierarchy.py): pure, no root.

The properties are checked on random trees (depth <= 4, fan-out <= 5) against
``reference``, an independent solver: recursion from the roots and a bisection on
each fill's level instead of the module's sort."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.classes.hierarchy import (IDLE_RESERVE, HierarchyError, Node, Tree, allocate, build_tree, fill,
                                         split)

M = 1e6 / 8         # 1 Mbit/s in bytes/s
EPS = 1e-9


def example() -> Tree:
    """docs/hierarchy.md's: customer-x 30 Mbit/s; video 20 up to 30, api 5 up to 10, rest 0 up to 30."""
    return build_tree({"customer-x": Node(limit=30 * M),
                       "video": Node(parent="customer-x", rate=20 * M),
                       "api": Node(parent="customer-x", rate=5 * M, ceil=10 * M),
                       "rest": Node(parent="customer-x")})


@pytest.mark.parametrize("demand, expected", [
    # everyone greedy: the guarantees (20, 5, 0), then the 5 left split evenly
    ((100, 100, 100), (20 + 5 / 3, 5 + 5 / 3, 5 / 3)),
    # video idle: it keeps 1/8 of its 20, api borrows up to its ceil 10, rest the remainder
    ((0, 100, 100), (2.5, 10, 17.5)),
    # video above its rate borrows what api leaves; api's unused guarantee returns to it (fill 3)
    ((25, 2, 0), (25, 5, 0)),
    # light load: every guarantee back, and the 2 nobody wants as headroom up to each ceil
    ((5, 2, 3), (20 + 2 / 3, 5 + 2 / 3, 3 + 2 / 3)),
    # only rest: it takes all but the idle guarantees' reserves
    ((0, 0, 100), (2.5, 0.625, 26.875)),
])
def test_the_worked_example(demand, expected):
    shares = allocate(example(), {n: d * M for n, d in zip(("video", "api", "rest"), demand)})
    assert [shares[n].limit / M for n in ("video", "api", "rest")] == pytest.approx(expected, rel=1e-12)
    assert shares["customer-x"].limit == 30 * M


def test_lent_and_borrowed_in_the_example():
    shares = allocate(example(), {"video": 0, "api": 100 * M, "rest": 100 * M})
    assert shares["video"].lent == pytest.approx(20 * M * (1 - IDLE_RESERVE))
    assert shares["api"].borrowed == pytest.approx(5 * M) and shares["rest"].borrowed == pytest.approx(17.5 * M)
    assert shares["video"].borrowed == shares["api"].lent == shares["rest"].lent == 0


def test_three_levels_customer_service_endpoint():
    tree = build_tree({"cust": Node(limit=100.0), "svc": Node(parent="cust", rate=60.0), "other": Node(parent="cust"),
                       "ep1": Node(parent="svc", rate=40.0), "ep2": Node(parent="svc", rate=10.0, weight=3.0)})
    shares = allocate(tree, {"ep1": 1000.0, "ep2": 1000.0, "other": 1000.0})
    # svc: 60 + half of the 40 its sibling 'other' (rate 0) competes for; inside, ep1 40, ep2 10 + 3/4 of 30
    assert shares["svc"].limit == pytest.approx(80.0) and shares["other"].limit == pytest.approx(20.0)
    assert shares["ep1"].limit == pytest.approx(47.5) and shares["ep2"].limit == pytest.approx(32.5)
    assert tree.depth("ep2") == 3


def test_fill_is_max_min_by_weight():
    alloc, left = fill([0, 0, 0], [1, 10, 10], [1, 1, 2], 10)
    assert alloc == pytest.approx([1, 3, 6]) and left == 0
    assert fill([0, 0], [1, 2], [1, 1], 5) == ([1, 2], 2)


def test_an_idle_child_keeps_a_reserve_and_gets_its_rate_back_when_nobody_borrows():
    assert split(10, want=[0, 10], rate=[8, 0], ceil=[10, 10], weight=[1, 1]) == pytest.approx([1, 9])
    assert split(10, want=[0, 1], rate=[8, 0], ceil=[10, 10], weight=[1, 1]) == pytest.approx([8.5, 1.5])


# --- the refusals ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, name, key, needle", [
    ({"a": Node(parent="nope", rate=1.0)}, "a", "parent", "parent 'nope' is not a class"),
    ({"a": Node(parent="b"), "b": Node(parent="a")}, "a", "parent", "cycle: a -> b -> a"),
    ({"a": Node(parent="a")}, "a", "parent", "cycle: a -> a"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", rate=8.0), "b": Node(parent="r", rate=4.0)},
     "r", "global", "children's rates sum to 96 bit/s (a 64 bit/s, b 32 bit/s), above its global limit 80 bit/s"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", rate=5.0), "b": Node(parent="a", rate=6.0, ceil=8.0)},
     "a", "rate", "above its rate"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", ceil=11.0)}, "a", "ceil", "above its parent 'r''s limit"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", ceil=5.0), "b": Node(parent="a", ceil=6.0)}, "b", "ceil",
     "above its parent 'a''s limit 40 bit/s"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", rate=6.0, ceil=5.0)}, "a", "rate", "rate 48 bit/s is above its ceil"),
    ({"r": Node(limit=10.0), "a": Node(parent="r", limit=5.0)}, "a", "global", "write ceil"),
    ({"r": Node(limit=10.0, rate=5.0)}, "r", "rate", "rate is a child's key: give parent"),
    ({"r": Node(weight=2.0, limit=1.0)}, "r", "weight", "weight is a child's key"),
    ({"r": Node()}, "r", "global", "missing global limit"),
])
def test_a_tree_that_cannot_hold_is_refused_naming_the_class_and_key(nodes, name, key, needle):
    with pytest.raises(HierarchyError) as e:
        build_tree(nodes)
    assert (e.value.name, e.value.key) == (name, key) and needle in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"class {name!r}: ")


# --- an independent solver and the properties ---------------------------------------------------------------

def _bisect_fill(alloc, cap, weight, amount):
    """One fill by bisection on the level; -> (allocations, left)."""
    room = [max(0.0, c - a) for a, c in zip(alloc, cap)]
    if amount <= 0:
        return list(alloc), max(amount, 0.0)
    if sum(room) <= amount:
        return [a + r for a, r in zip(alloc, room)], amount - sum(room)
    lo, hi = 0.0, max(r / w for r, w in zip(room, weight))
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(min(r, w * mid) for r, w in zip(room, weight)) < amount:
            lo = mid
        else:
            hi = mid
    return [a + min(r, w * hi) for a, r, w in zip(alloc, room, weight)], 0.0


def reference(spec: dict[str, dict], demand: dict[str, float]) -> dict[str, float]:
    """Each node's limit, recursively from the roots; ``spec``: name -> parent, limit/rate, ceil, weight."""
    kids = {n: [c for c in spec if spec[c]["parent"] == n] for n in spec}

    def want(n):
        own = sum(want(c) for c in kids[n]) if kids[n] else demand.get(n, 0.0)
        return min(spec[n]["ceil"], own)

    out = {}

    def down(n, limit):
        out[n] = limit
        cs = kids[n]
        if not cs:
            return
        w, r = [want(c) for c in cs], [spec[c]["rate"] for c in cs]
        alloc = [min(wi, ri) + IDLE_RESERVE * max(0.0, ri - wi) for wi, ri in zip(w, r)]
        left = limit - sum(alloc)
        weights = [spec[c]["weight"] for c in cs]
        for cap in ([max(a, wi) for a, wi in zip(alloc, w)], r, [spec[c]["ceil"] for c in cs]):
            alloc, left = _bisect_fill(alloc, cap, weights, left)
        for c, a in zip(cs, alloc):
            down(c, a)

    for n in spec:
        if spec[n]["parent"] is None:
            down(n, spec[n]["ceil"])
    return out


# built once: a strategy made per draw costs more than the test (hypothesis validates each)
LIMITS, SHARES = st.floats(1.0, 1e9), st.sampled_from([0.0, 1.0]) | st.floats(0, 1)
CEILS, WEIGHTS = st.sampled_from([None, 1.0]) | st.floats(0, 1), st.sampled_from([None, 0.5, 2.0]) | st.floats(0.01, 100)
FANOUT, FEW, ROOTS = st.integers(0, 5), st.integers(0, 2), st.integers(1, 2)
DEMANDS = st.sampled_from([0.0]) | st.floats(0, 2e9)


@st.composite
def trees(draw):
    """(spec for ``reference``, Nodes for build_tree, leaf demands): a few roots, depth <= 4, fan-out <= 5."""
    spec: dict[str, dict] = {}
    nodes: dict[str, Node] = {}

    def grow(name, parent, depth):
        if parent is None:
            limit = draw(LIMITS)
            spec[name] = dict(parent=None, rate=limit, ceil=limit, weight=1.0)
            nodes[name] = Node(limit=limit)
        else:
            p = spec[parent]
            room = p["rate"] - sum(spec[c]["rate"] for c in spec if spec[c]["parent"] == parent)
            rate = draw(SHARES) * max(0.0, room)
            ceil = draw(CEILS)
            ceil_abs = p["ceil"] if ceil is None else min(p["ceil"], rate + ceil * (p["ceil"] - rate))
            weight = draw(WEIGHTS)
            spec[name] = dict(parent=parent, rate=rate, ceil=ceil_abs, weight=weight or 1.0)
            nodes[name] = Node(parent=parent, rate=rate, ceil=None if ceil is None else ceil_abs, weight=weight)
        if depth < 4:
            for i in range(draw(FANOUT if depth < 3 else FEW)):
                grow(f"{name}.{i}", name, depth + 1)

    for r in range(draw(ROOTS)):
        grow(f"r{r}", None, 1)
    leaves = [n for n in spec if not any(spec[c]["parent"] == n for c in spec)]
    demand = {n: draw(DEMANDS) for n in leaves}
    return spec, nodes, demand


def _close(a, b, scale):
    """Within 1e-6 relative; amounts a billion times below the tree's limit count as 0."""
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), scale * 1e-9)


@settings(max_examples=200, deadline=None)
@given(trees())
def test_the_properties_on_random_trees(case):
    spec, nodes, demand = case
    tree = build_tree(nodes)
    shares = allocate(tree, demand)
    ref = reference(spec, demand)
    scale = max(tree.ceil.values())
    for n, kids in tree.children.items():
        s = shares[n]
        assert _close(s.limit, ref[n], scale), (n, s.limit, ref[n])
        assert s.limit <= tree.ceil[n] * (1 + EPS)                                  # ceilings
        if tree.parent[n] is not None:
            assert s.limit >= min(s.want, tree.rate[n]) * (1 - EPS)                # guarantees
        if not kids:
            continue
        total = sum(shares[k].limit for k in kids)
        assert total <= s.limit * (1 + EPS) + EPS                                   # conservation
        assert total == pytest.approx(min(s.limit, sum(tree.ceil[k] for k in kids)), rel=1e-9, abs=1e-6)
        if any(shares[k].want > shares[k].limit * (1 + 1e-9) for k in kids):       # work-conserving
            assert total == pytest.approx(s.limit, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(trees(), st.data())
def test_more_demand_never_lowers_ones_own_limit(case, data):
    spec, nodes, demand = case
    tree = build_tree(nodes)
    leaf = data.draw(st.sampled_from(sorted(demand)))
    more = {**demand, leaf: demand[leaf] + data.draw(st.floats(0, 2e9))}
    before, after = allocate(tree, demand)[leaf].limit, allocate(tree, more)[leaf].limit
    assert after >= before * (1 - 1e-9) - 1e-6, (leaf, before, after)


def test_docs_hierarchy_table_is_what_the_module_computes():
    text = (Path(__file__).parents[3] / "docs" / "hierarchy.md").read_text()
    rows = [line.split("|")[1:5] for line in text.splitlines() if re.match(r"\| [0-9]+, [0-9]+, [0-9]+ \|", line)]
    assert len(rows) >= 3
    for cells in rows:
        demand = [float(d) * M for d in cells[0].split(",")]
        shares = allocate(example(), dict(zip(("video", "api", "rest"), demand)))
        got = [shares[n].limit / M for n in ("video", "api", "rest")]
        assert got == pytest.approx([float(c) for c in cells[1:]], abs=5e-4), cells
