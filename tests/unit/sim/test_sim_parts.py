"""sim/ building blocks: views, network, wire tap (fast, no root)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from drl.agent.gossip import wire
from drl.agent.model import Transfer
from drl.sim.network import Network, Updates
from drl.sim.views import ViewTable
from drl.sim.wiretap import IP_UDP_BYTES, KEY, WireTap


def _brute_force(table: ViewTable, tick: int) -> tuple[np.ndarray, np.ndarray]:
    alive = (table.heard != -1) & (tick - table.heard < table.stale_ticks)
    np.fill_diagonal(alive, False)
    return np.where(alive, table.values.astype(float), 0.0).sum(axis=1), alive.sum(axis=1)


_pairs = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.floats(0, 1e6)), max_size=6),
                          _pairs), min_size=1, max_size=25),
       st.integers(1, 4))
def test_incremental_sums_match_the_tables(ticks, stale):
    """remote_sum / n_alive kept per message equal a full recomputation, every tick, with other
    datagrams (touch: point-to-point, the sum tree's) from the same peers in the same ticks."""
    table = ViewTable([f"n{i}" for i in range(5)], interval_s=0.05, stale_ticks=stale)
    seq = np.zeros((5, 5), dtype=np.int64)
    for k, (msgs, touches) in enumerate(ticks):
        msgs = [(s, d, v) for s, d, v in msgs if s != d]
        src = np.array([m[0] for m in msgs], dtype=np.int64)
        dst = np.array([m[1] for m in msgs], dtype=np.int64)
        for s, d in zip(src, dst):
            seq[s, d] += 1
        table.expire(k)
        table.receive(Updates(src, dst, np.array([m[2] for m in msgs]), seq[src, dst]), k)
        touches = [(s, d) for s, d in touches if s != d]
        if touches:
            table.touch(np.array([d for _, d in touches]), np.array([s for s, _ in touches]), k)
        want_sum, want_alive = _brute_force(table, k)
        np.testing.assert_allclose(table.remote_sum, want_sum, rtol=1e-9, atol=1e-3)
        np.testing.assert_array_equal(table.n_alive, want_alive)


def test_older_update_never_overwrites_a_newer_one():
    table = ViewTable(["a", "b"], interval_s=0.05, stale_ticks=10)
    one = np.array([1])
    zero = np.array([0])
    table.receive(Updates(one, zero, np.array([5.0]), np.array([2])), 0)
    table.receive(Updates(one, zero, np.array([9.0]), np.array([1])), 1)   # late, reordered
    assert table.view(0, 1).peers["b"].value == 5.0
    assert table.view(0, 1).remote_sum == 5.0


def test_stale_peer_counts_zero_and_is_not_alive():
    table = ViewTable(["a", "b"], interval_s=0.05, stale_ticks=3)
    table.receive(Updates(np.array([1]), np.array([0]), np.array([7.0]), np.array([1])), 0)
    for k in range(1, 4):
        table.expire(k)
    view = table.view(0, 3)
    assert (view.n_alive, view.remote_sum) == (0, 0.0)
    assert not view.peers["b"].alive and view.peers["b"].value == 0.0


def test_network_loss_partition_and_crash():
    rng = np.random.default_rng(0)
    net = Network(4, 0.05, rng, loss=0.1)
    n = 20000
    src, dst = np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    net.send_updates(src, dst, np.ones(n), np.arange(1, n + 1), tick=0)
    got = len(net.due_updates(1).src)
    assert 0.88 * n < got < 0.92 * n
    net.loss = 0.0
    net.partition(np.array([0, 0, 1, 1]))
    net.send_updates(np.array([0, 0]), np.array([1, 2]), np.ones(2), np.ones(2, dtype=np.int64), tick=1)
    assert net.due_updates(2).dst.tolist() == [1]
    net.heal()
    net.crash([3])
    net.send_updates(np.array([0, 3]), np.array([3, 0]), np.ones(2), np.ones(2, dtype=np.int64), tick=2)
    assert len(net.due_updates(3).src) == 0


def test_delay_is_whole_ticks_at_least_one():
    net = Network(2, 0.05, np.random.default_rng(0), delay_s=0.12)
    net.send_updates(np.array([0]), np.array([1]), np.ones(1), np.ones(1, dtype=np.int64), tick=5)
    assert len(net.due_updates(7).src) == 0 and len(net.due_updates(8).src) == 1


def test_sizes_are_the_agent_encoders():
    ids = ("n0", "n1")
    tap = WireTap(ids, np.random.default_rng(0))
    h = wire.Header(cluster="sim", node="n0", dst="n1", seq=300, incarnation=tap.incarnation, sent_at=2.5)
    update = wire.Batch((wire.ClassValue(1, 300, 123.0),))
    want = len(wire.encode(wire.Message(h, update), KEY)) + IP_UDP_BYTES
    assert tap.updates_sent(np.array([300])) == want
    from drl.agent.model import Envelope
    env = Envelope(Transfer(xfer_id=3, amount=10.0, link_total=10.0), dst="n1")
    body = wire.Message(wire.Header(cluster="sim", node="n0", dst="n1", seq=4, incarnation=tap.incarnation,
                                    sent_at=2.5, class_id=1), env.body)
    assert tap.envelope_sent("n0", env, 4, 2.5) == len(wire.encode(body, KEY)) + IP_UDP_BYTES


def test_loss_detection_is_the_agents_seq_window():
    tap = WireTap(("a", "b"), np.random.default_rng(0), monitors=2)
    seqs = np.array([1, 2, 4, 5, 9])      # 3, 6, 7, 8 lost
    tap.received(np.zeros(5, dtype=np.int64), np.ones(5, dtype=np.int64), seqs)
    assert tap.lost == 4 and tap.accepted == 5
    tap.received(np.array([0]), np.array([1]), np.array([3]))   # a late one is not lost after all
    assert tap.lost == 3
