"""The shared transfer machinery (agent/allocators/transfer.py) and graphs (graph.py)."""
import dataclasses
import random

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.allocators.graph import Graph, GraphError, bfs_levels
from drl.agent.allocators.endowment import claim_endowments, down_run, return_endowments, share
from drl.agent.allocators.transfer import (Ledger, follow_members, note_lives, receive, replace_src, retransmit, send,
                                           settle)
from drl.agent.model import PeerState, PeerView, Report, TransferAck


def _view(dead=(), age=100.0, members=("a", "b", "c"), lives=None):
    lives = lives or {}
    peers = {m: PeerState(m, 0.0, alive=m not in dead, age_s=0.0 if m not in dead else age,
                          incarnation=lives.get(m, 1)) for m in members}
    return PeerView(members=members, peers=peers, remote_sum=0.0, n_alive=len(members) - len(dead))


def test_lost_transfer_is_covered_by_the_next_and_old_ones_change_nothing():
    a, b = Ledger(holding=100), Ledger(holding=0)
    a, first = send(a, "b", 10)
    a, second = send(a, "b", 5)
    b, acks, _ = receive(b, [replace_src(second, "a")])          # the first was lost
    assert b.holding == 15 and acks[0].body.link_total == 15
    b, _, _ = receive(b, [replace_src(first, "a"), replace_src(second, "a")])   # late and duplicate
    assert b.holding == 15
    a, _, _ = receive(a, [replace_src(acks[0], "b")])
    assert not a.links["b"].unacked and a.holding + b.holding == 100


def test_unacked_transfer_is_resent_to_alive_peers_only():
    a, _ = send(Ledger(holding=10), "b", 4)
    [env] = retransmit(a, [], _view())
    assert env.dst == "b" and env.body.link_total == 4
    assert retransmit(a, [], _view(dead=("b",))) == ()
    assert retransmit(a, ["b"], _view()) == ()


def test_refused_transfer_makes_the_sender_settle_its_side():
    a, env = send(Ledger(holding=10), "b", 4)
    b = settle(Ledger(holding=0), "a")                           # b declared a failed
    b, acks, _ = receive(b, [replace_src(env, "a")])
    assert b.holding == 0 and not acks[0].body.accepted
    a, _, _ = receive(a, [replace_src(acks[0], "b")])
    assert a.holding == 10 and "b" in a.closed


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 50)), max_size=40),
       seed=st.integers(0, 10**6), loss=st.floats(0, 0.6), dup=st.floats(0, 0.5))
def test_any_loss_duplication_and_order_conserves_and_drains(ops, seed, loss, dup):
    """sum(holding) + sum(link counters) is the total after every delivery, and once
    loss stops, retransmission leaves nothing unacked and everything held."""
    rng = random.Random(seed)
    names = ["a", "b", "c"]
    led = {n: Ledger(holding=100) for n in names}
    wire = []                                    # (dst, envelope as received)

    def post(env, src, p_loss):
        if rng.random() >= p_loss:
            wire.extend([(env.dst, replace_src(env, src))] * (2 if rng.random() < dup else 1))

    def deliver_one():
        dst, env = wire.pop(rng.randrange(len(wire)))       # any order
        led[dst], acks, _ = receive(led[dst], [env])
        for ack in acks:
            post(ack, dst, loss)

    for i, j, amount in ops:
        giver = names[i]
        if i != j and amount <= led[giver].holding:
            led[giver], env = send(led[giver], names[j], amount)
            post(env, giver, loss)
        if wire:
            deliver_one()
        assert sum(x.accountable for x in led.values()) == 300
    loss = 0.0
    for _ in range(50):
        for n in names:
            for env in retransmit(led[n], [], _view()):
                post(env, n, 0.0)
        while wire:
            deliver_one()
    assert all(not link.unacked for x in led.values() for link in x.links.values())
    assert sum(x.holding for x in led.values()) == 300


def test_genesis_shares_add_up_exactly():
    genesis = ("a", "b", "c")
    assert [share(10, genesis, m) for m in genesis] == [4, 3, 3]
    assert share(10, genesis, "joiner") == 0


def test_heir_is_the_next_member_alive_and_claims_once():
    genesis = ("a", "b", "c", "d")
    assert down_run(genesis, "c", _view(dead=("b",), members=genesis), 10) == (["b"], "a")
    assert down_run(genesis, "d", _view(dead=("b", "c"), members=genesis), 10) == (["c", "b"], "a")
    assert down_run(genesis, "a", _view(dead=("d",), members=genesis[:3]), 10) == (["d"], "c")  # d left
    view = _view(dead=("b", "c"), members=genesis)
    led = claim_endowments(Ledger(holding=0), "d", genesis, 100, view, dead_after_s=10)
    assert led.holding == 50 and led.claimed == {"b", "c"}
    assert claim_endowments(led, "d", genesis, 100, view, dead_after_s=10) == led
    young = _view(dead=("b",), age=1.0, members=genesis)     # a short silence is not a failure
    assert claim_endowments(Ledger(holding=0), "c", genesis, 100, young, dead_after_s=10).holding == 0
    unborn = _view(dead=("b",), age=float("inf"), members=genesis)   # never heard from: maybe still starting
    assert claim_endowments(Ledger(holding=0), "c", genesis, 100, unborn, dead_after_s=10).holding == 0


def test_ring_and_given_edges():
    members = ("a", "b", "c", "d", "e")
    assert Graph().neighbours("a", members) == ("b", "e")
    assert Graph(kind="edges", edges=(("a", "b"), ("b", "c"))).neighbours("b", members) == ("a", "c")
    with pytest.raises(GraphError, match="two different members"):
        Graph(kind="edges", edges=(("a", "zz"),)).neighbours("a", members)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 60), degree=st.integers(2, 8), seed=st.integers(0, 1000))
def test_random_regular_graph_is_regular_connected_and_seeded(n, degree, seed):
    members = tuple(f"n{i:02d}" for i in range(n))
    graph = Graph(kind="regular", degree=degree, seed=seed)
    if degree >= n or (n * degree) % 2:
        with pytest.raises(GraphError):
            graph.adjacency(members)
        return
    adj = graph.adjacency(members)
    assert all(len(nbrs) == degree for nbrs in adj.values())
    assert all(a in adj[b] for a in adj for b in adj[a])
    assert len(bfs_levels(members[0], adj)) == n
    assert Graph(kind="regular", degree=degree, seed=seed).adjacency(members) == adj


def test_unknown_graph_kind_is_refused():
    with pytest.raises(GraphError, match="graph kind"):
        Graph(kind="star")


def test_a_leaver_is_settled_at_once_and_reopened_when_back():
    a, env = send(Ledger(holding=100), "b", 30)
    gone, churn = follow_members(a, _view(members=("a", "c")))
    assert gone.holding == 100 and "b" in gone.closed and "b" in gone.left and not churn.back
    back, churn = follow_members(gone, _view(members=("a", "b", "c")))
    assert churn.back == {"b"} and "b" not in back.closed and back.holding == 100 and "b" not in back.links


def test_a_new_incarnation_settles_the_old_life_and_opens_a_fresh_link():
    a, _ = send(Ledger(holding=100), "b", 30)
    a, _ = follow_members(a, _view(members=("a", "b")))            # learns b's life 1
    a, churn = follow_members(a, _view(members=("a", "b"), lives={"b": 2}))
    assert churn.restarted == {"b"} and churn.back == {"b"}
    assert a.holding == 100 and "b" not in a.closed and "b" not in a.links and a.lives["b"] == 2


def test_a_restart_right_after_a_link_was_opened_by_a_receipt_settles_it():
    """A link opened by a transfer received after follow_members looked: a restart of the
    sender before the next tick is seen, so what its old life gave is taken back."""
    b, env = send(Ledger(holding=100), "a", 30)
    a, _ = follow_members(Ledger(holding=0), _view(members=("a", "b")))   # b not followed yet
    a, _, _ = receive(a, [replace_src(env, "b")])
    a = note_lives(a, _view(members=("a", "b")))
    assert a.holding == 30 and a.lives["b"] == 1
    a, churn = follow_members(a, _view(members=("a", "b"), lives={"b": 2}))
    assert churn.restarted == {"b"} and a.holding == 0 and "b" not in a.links


def test_an_endowment_return_moves_h_is_resent_until_acked_and_credited_once():
    genesis, view = ("a", "b"), _view(members=("a", "b"))
    heir = Ledger(holding=700, claimed=frozenset({"a"}), reports_in_net=False)
    heir, out = return_endowments(heir, genesis, 1000, view, back={"a"}, dead_after_s=10)
    assert heir.holding == 200 and heir.accountable == 200 and "a" not in heir.claimed   # H moved out
    assert [(e.dst, e.body) for e in out] == [("a", Report(consumed=500, free=0))]
    again = retransmit(heir, [], view)
    assert [e.body for e in again] == [Report(consumed=500, free=0)]
    rejoiner = Ledger(holding=0, reports_in_net=False)
    rejoiner, acks, returned = receive(rejoiner, [replace_src(out[0], "b")] * 2)   # a duplicate
    assert returned == 500 and rejoiner.accountable == 0                            # the caller credits it
    assert [a.body for a in acks] == [TransferAck(xfer_id=0, link_total=500)]
    heir, _, _ = receive(heir, [replace_src(acks[0], "a")])
    assert retransmit(heir, [], view) == ()


def test_a_return_waits_until_the_holding_covers_it():
    genesis, view = ("a", "b"), _view(members=("a", "b"))
    heir = Ledger(holding=100, claimed=frozenset({"a"}), reports_in_net=False)
    heir, out = return_endowments(heir, genesis, 1000, view, back={"a"}, dead_after_s=10)
    assert out == () and heir.owed == {"a"} and heir.claimed == {"a"}
    heir, out = return_endowments(dataclasses.replace(heir, holding=600), genesis, 1000, view, back=(),
                                  dead_after_s=10)
    assert [e.body.consumed for e in out] == [500] and heir.owed == frozenset() and heir.holding == 100


def test_a_return_brings_back_the_shares_of_the_down_members_behind_it():
    genesis = ("a", "b", "c")
    view = _view(members=("b", "c"))                                 # a left; b is back
    heir = Ledger(holding=1000, claimed=frozenset({"a", "b"}), reports_in_net=False)
    heir, out = return_endowments(heir, genesis, 900, view, back={"b"}, dead_after_s=10)
    assert [e.body.consumed for e in out] == [600] and heir.claimed == frozenset()
