"""Static 1/N, GRD and CTB against their formulas, numbers worked by hand
(and every allocator module's docstring example).

GRD: [Raghavan07] Fig. 1 (drop prob = (demand - limit)/demand) with
the §5.6 stale policy; static: global/N; CTB: the global limit.
"""
from __future__ import annotations

import doctest
import importlib

import pytest
from hypothesis import given, strategies as st

from drl.agent.allocators import common, create
from drl.agent.model import Local, Mode, PeerState, Snapshot

MBIT = 1e6 / 8   # bytes/s


def snapshot(local_Bps: float, peers: dict[str, tuple[float, bool]], global_Bps: float = 10 * MBIT,
             members: tuple[str, ...] | None = None) -> Snapshot:
    """Node "a" measuring ``local_Bps``; ``peers`` maps id -> (published value, alive)."""
    states = [PeerState(pid, value, alive, 0.05 if alive else 10.0) for pid, (value, alive) in peers.items()]
    view = common.peer_view(members or ("a", *peers), states)
    return Snapshot(now=1.0, node_id="a", interval_s=0.05, global_Bps=global_Bps,
                    local=Local(demand_Bps=local_Bps), view=view)


def run(name: str, snap: Snapshot):
    alloc = create(name)
    return alloc.step(alloc.initial_state(snap.node_id, snap.view.members), snap).decision


@pytest.mark.parametrize("module", ["common", "static", "ctb", "gtb", "grd", "fps"])
def test_module_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(f"drl.agent.allocators.{module}"))
    assert result.attempted > 0 and result.failed == 0


# --- static 1/N ---------------------------------------------------------------

def test_static_is_global_over_configured_n():
    d = run("static", snapshot(7 * MBIT, {"b": (3 * MBIT, True), "c": (0.0, True), "d": (1.0, True)}))
    assert d.mode == Mode.BUCKET
    assert d.limit_Bps == pytest.approx(10 * MBIT / 4)     # 2.5 Mbit/s
    assert d.publish == 7 * MBIT                            # its demand, for status


def test_static_ignores_stale_peers():
    # Two of four peers stale: static still enforces global/4, never more.
    d = run("static", snapshot(7 * MBIT, {"b": (3 * MBIT, False), "c": (0.0, False), "d": (1.0, True)}))
    assert d.limit_Bps == pytest.approx(10 * MBIT / 4)


@pytest.mark.parametrize("reserved, share", [(2 * 10 * MBIT / 4, 10 * MBIT / 4),     # their own 1/N each
                                             (2 * 16 * MBIT / 4, 1 * MBIT),           # a limit lowered from 16
                                             (0.0, 10 * MBIT / 4)])                   # gone, not stale
def test_static_leaves_stale_peers_what_their_datapaths_may_still_pass(reserved, share):
    """A dead peer's kernel keeps the fail-safe of the limit it knew: 1/N of a lowered limit
    each for the others would let the hosts pass more than the new one."""
    snap = snapshot(7 * MBIT, {"b": (3 * MBIT, False), "c": (0.0, False), "d": (1.0, True)})
    snap = snap._replace(view=snap.view._replace(reserved_Bps=reserved))
    d = run("static", snap)
    assert d.limit_Bps == pytest.approx(share)
    assert 2 * d.limit_Bps + reserved <= 10 * MBIT * (1 + 1e-9)


# --- CTB ----------------------------------------------------------------------

def test_ctb_is_one_bucket_at_the_global_rate():
    d = run("ctb", snapshot(12 * MBIT, {}))
    assert (d.mode, d.limit_Bps, d.publish) == (Mode.BUCKET, 10 * MBIT, 12 * MBIT)


# --- GRD ----------------------------------------------------------------------

def test_grd_over_limit_drops_the_excess_share():
    # Local 4 + remote 8 = 12 Mbit/s against 10: p = (12 - 10)/12 = 1/6.
    d = run("grd", snapshot(4 * MBIT, {"b": (8 * MBIT, True)}))
    assert d.mode == Mode.DROP
    assert d.drop_probability == pytest.approx(1 / 6)
    assert d.limit_Bps == pytest.approx(4 * MBIT * 5 / 6)   # what this node forwards
    assert d.publish == 4 * MBIT                            # r_i, Fig. 1
    assert d.info["global_demand_Bps"] == pytest.approx(12 * MBIT)


def test_grd_under_limit_drops_nothing():
    d = run("grd", snapshot(3 * MBIT, {"b": (6 * MBIT, True)}))
    assert d.drop_probability == 0.0
    assert d.limit_Bps == pytest.approx(3 * MBIT)


def test_grd_idle_cluster_drops_nothing():
    assert run("grd", snapshot(0.0, {"b": (0.0, True)})).drop_probability == 0.0


def test_grd_stale_peer_counts_zero_and_cuts_limit_by_one_nth():
    # N = 4, peer d stale with a (stale) 5 Mbit/s: it counts 0 and L = 10 * 3/4 = 7.5.
    # Demand 4 + 3 + 2 = 9: p = (9 - 7.5)/9 = 1/6.
    d = run("grd", snapshot(4 * MBIT, {"b": (3 * MBIT, True), "c": (2 * MBIT, True), "d": (5 * MBIT, False)}))
    assert d.info["global_limit_Bps"] == pytest.approx(7.5 * MBIT)
    assert d.info["global_demand_Bps"] == pytest.approx(9 * MBIT)
    assert d.drop_probability == pytest.approx(1 / 6)


rates = st.floats(0, 1e9, allow_nan=False)


@given(local=rates, remote=st.lists(rates, max_size=6), global_Bps=st.floats(1, 1e9))
def test_grd_forwards_at_most_the_limit(local, remote, global_Bps):
    """Every node seeing the same demands forwards sum(d_i)(1 - p) = min(sum, L)."""
    peers = {f"p{i}": (r, True) for i, r in enumerate(remote)}
    d = run("grd", snapshot(local, peers, global_Bps))
    assert 0.0 <= d.drop_probability < 1.0
    total = local + sum(remote)
    assert total * (1 - d.drop_probability) == pytest.approx(min(total, global_Bps), rel=1e-9, abs=1e-6)
