"""The sum tree in the daemon (agent/gossip/tree.py): twelve in-memory agents gossiping with
branching 2, so per-peer news takes 6 intervals, read their FPS peers' weight sum from the tree."""
from __future__ import annotations

import time

import pytest

from daemon_harness import FakeDatapath, agent, config
from drl.cli.ctl import render

N = 12


def _addr(i: int) -> tuple[str, int]:
    return (f"10.0.1.{i + 1}", 7470)


def _cluster(tmp_path, *args):
    agents = []
    for i in range(N):
        peers = ",".join(f"a{j:02d}@{_addr(j)[0]}:7470" for j in range(N) if j != i)
        (tmp_path / f"a{i}").mkdir()
        cfg = config(tmp_path / f"a{i}", "--node-id", f"a{i:02d}", "--listen", f"{_addr(i)[0]}:7470",
                     "--peers", peers, "--allocator", "fps", "--global", "12mbit", "--peer-timeout", "1h", *args)
        agents.append(agent(cfg, FakeDatapath()))
    return agents


def _tick(agents, sending):
    """One interval: every agent hears what was sent to it, ticks, and its datagrams go out."""
    for i, a in enumerate(agents):
        a.dp.send(sending[i])
        a.receive()
        a.tick(time.monotonic())
    by_addr = {_addr(i): a for i, a in enumerate(agents)}
    for i, a in enumerate(agents):
        for addr, data in a.transport.sent:
            by_addr[addr].transport.arrive([(addr, data)], _addr(i))
        a.transport.sent = []


def test_twelve_agents_at_branching_2_read_their_peers_exact_weight_sum_from_the_tree(tmp_path):
    agents = _cluster(tmp_path, "--branching", "2")
    try:
        sending = [20_000 * (1 + i % 3) for i in range(N)]
        history = []
        for _ in range(6):
            _tick(agents, sending)
            history.append([a.status()["allocator_state"]["weight"] for a in agents])
        status = [a.status() for a in agents]
        assert status[0]["sum_tree"] == {"summer": "a00", "leaves": N - 1, "covers": N - 1, "passed_over": []}
        assert all(s["sum_tree"]["summer"] == "a00" and s["sum_tree"]["covers"] == N - 1 for s in status)
        assert "sum tree    sums its group, 11 leaves, reads a sum of 11 peers" in render(status[0])
        assert "sum tree    sends to a00, 0 leaves, reads a sum of 11 peers" in render(status[5])
        # per-peer gossip brings each agent 2 of its 11 peers' weights a tick; the tree brings all
        # of them.  A weight published in tick k reaches the summer's allocator in k + 2 (heard in
        # k + 1 after its step, summed then); a leaf's, through the summer's TOTAL, in k + 2 too,
        # with the summer's own of k + 1
        for i, s in enumerate(status):
            want = sum(history[-3]) - history[-3][i]
            if i:
                want += history[-2][0] - history[-3][0]
            assert s["allocator_state"]["remote_weights"] == pytest.approx(want, rel=1e-6)
    finally:
        for a in agents:
            a.__exit__(None, None, None)


def test_a_full_mesh_runs_no_tree(tmp_path):
    agents = _cluster(tmp_path)           # the default branching 16 covers 11 peers
    try:
        for _ in range(3):
            _tick(agents, [20_000] * N)
        assert all(a.status()["sum_tree"] is None for a in agents)
        assert "sum tree" not in render(agents[0].status())
    finally:
        for a in agents:
            a.__exit__(None, None, None)


def test_a_round_that_throws_is_counted_and_the_classes_read_per_peer_sums(tmp_path, monkeypatch):
    agents = _cluster(tmp_path, "--branching", "2")
    try:
        for _ in range(4):
            _tick(agents, [20_000] * N)
        assert agents[3].tree_on
        monkeypatch.setattr(agents[3].tree, "round", lambda *a: 1 / 0)
        _tick(agents, [20_000] * N)
        st = agents[3].status()
        assert not agents[3].tree_on and st["sum_tree"] is None
        assert {"class": "", "stage": "sum_tree", "count": 1} in st["tick"]["errors_by"]
        _tick(agents, [20_000] * N)          # every other class and agent went on
        assert all(a.tree_on for a in agents[:3] + agents[4:])
    finally:
        for a in agents:
            a.__exit__(None, None, None)
