"""The stale-peer rule is written once (agent/gossip/membership.py ``alive`` and ``reported``)
and kept by two tables, one agent's (agent/gossip/membership.py) and 10,000 simulated ones'
(sim/views.py): fed the same datagrams, both must show node ``a`` the same PeerView at every
tick, and both must get their answers from the one rule."""
from __future__ import annotations

import sys

import numpy as np

from drl.agent.gossip import membership
from drl.agent.gossip.core import Received
from drl.agent.gossip.membership import Membership, liveness_timeout
from drl.agent.gossip.wire import Batch, ClassValue, Header
from drl.sim.engine import Setup
from drl.sim.network import Updates
from drl.sim.views import ViewTable
from viewharness import summary

IDS = ("a", "b", "c", "d")
# A power of two: tick * interval is exact, so both sides reach the timeout on the same tick.
INTERVAL_S = 0.125
BRANCHING = 3          # a full mesh: the timeout is 3 intervals

# tick -> what node a receives: (kind, sender, value, seq); seq None = the sender's next one.
SCRIPT = {
    0: [("update", "b", 1000.0, None), ("update", "c", 2000.0, None)],
    1: [("update", "b", 1500.0, None)],
    2: [("heartbeat", "c", None, None), ("heartbeat", "d", None, None)],   # d: alive, value 0
    3: [("update", "b", 1500.0, None), ("update", "d", 3000.0, None)],
    4: [("restart", "d", None, None)],                   # until its new life is heard, d's value stays
    5: [("heartbeat", "d", None, None)],                 # d's new life: its old value is forgotten
    # c silent from tick 2: alive through tick 5, stale at 6; b silent from tick 3: stale at 7
    8: [("update", "b", 1600.0, None), ("update", "c", 2500.0, None)],   # both heard again
    9: [("restart", "b", None, None)],
    10: [("update", "b", 700.0, None), ("update", "d", 3500.0, None)],   # b's new life starts at seq 1
    11: [("update", "c", 2600.0, 6), ("update", "b", 800.0, None)],
    12: [("update", "b", 900.0, None), ("update", "c", 2550.0, 5)],      # c's seq 5 arrives late
    13: [("update", "b", 900.0, None)],
}
TICKS = 20             # silence to the end: everyone goes stale


class Both:
    """Node a's view kept by agent.membership and by sim.views side by side."""

    def __init__(self):
        setup = Setup(allocator="static", n_nodes=len(IDS), global_Bps=1.0, interval_s=INTERVAL_S,
                      branching=BRANCHING)
        self.table = ViewTable(IDS, INTERVAL_S, setup.stale_ticks())
        peers = IDS[1:]
        self.members = Membership("a", peers, liveness_timeout(INTERVAL_S, len(peers), BRANCHING),
                                  names={p: p for p in peers})
        self.incarnation = dict.fromkeys(peers, 1)
        self.seq = dict.fromkeys(peers, 0)

    def tick(self, t: int, events) -> None:
        self.table.expire(t)       # the engine's order: expire, then deliver
        updates, touched = [], []
        for kind, src, value, seq in events:
            j = IDS.index(src)
            if kind == "restart":
                self.table.restart(j)
                self.incarnation[src] += 1
                self.seq[src] = 0
                continue
            self.seq[src] = seq if seq is not None else self.seq[src] + 1
            header = Header(cluster="c", node=src, seq=self.seq[src], incarnation=self.incarnation[src],
                            sent_at=t * INTERVAL_S)
            payload = Batch((ClassValue(0, self.seq[src], value),) if kind == "update" else ())
            self.members.observe(Received(header, payload, src), t * INTERVAL_S)
            (updates if kind == "update" else touched).append((j, value, self.seq[src]))
        if updates:
            src, value, seq = (np.array(col) for col in zip(*updates))
            self.table.receive(Updates(src, np.zeros_like(src), value, seq), t)
        if touched:
            src = np.array([j for j, _, _ in touched])
            self.table.touch(np.zeros_like(src), src, t)

    def views(self, t: int):
        return self.members.view(0, t * INTERVAL_S), self.table.view(0, t)


def test_membership_and_sim_views_agree_at_every_tick():
    both = Both()
    for t in range(TICKS):
        both.tick(t, SCRIPT.get(t, []))
        agent, sim = both.views(t)
        assert summary(sim) == summary(agent), f"tick {t}"


def test_both_sides_ask_the_one_rule(monkeypatch):
    """A side that wrote the rule out again would agree today and drift tomorrow: every table
    must call membership.alive and membership.reported itself."""
    callers: dict[str, set[str]] = {"alive": set(), "reported": set()}
    for name, rule in [(name, getattr(membership, name)) for name in callers]:
        def spy(*args, _name=name, _rule=rule):
            callers[_name].add(sys._getframe(1).f_globals["__name__"])
            return _rule(*args)
        monkeypatch.setattr(membership, name, spy)
    both = Both()
    for t in range(TICKS):
        both.tick(t, SCRIPT.get(t, []))
        agent, sim = both.views(t)
        assert summary(sim) == summary(agent), f"tick {t}"
    sides = {"drl.agent.gossip.membership", "drl.sim.views"}
    assert callers == {"alive": sides, "reported": sides}


def test_the_script_exercises_every_case():
    """Stale, revived, restarted and late senders all occur, so agreement is not vacuous."""
    both, seen = Both(), {}
    for t in range(TICKS):
        both.tick(t, SCRIPT.get(t, []))
        seen[t] = {p: (s.value, s.alive) for p, s in both.views(t)[0].peers.items()}
    assert seen[5]["c"][1] and not seen[6]["c"][1] and seen[8]["c"][1]    # timeout, then heard again
    assert not seen[7]["b"][1] and seen[8]["b"][1]
    assert seen[4]["d"] == (3000.0, True) and seen[5]["d"] == (0.0, True)
    assert seen[15]["c"] == (2600.0, True) and not seen[16]["c"][1]       # the late update counted
    assert not any(alive for _, alive in seen[TICKS - 1].values())
    assert [row["incarnation"] for row in both.members.status(0.0)] == [2, 1, 2]
