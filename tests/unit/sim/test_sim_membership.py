"""Joins and leaves are written twice too: ``Membership.set_peers`` (a registry's
watch, agent/gossip/membership.py) and ``ViewTable.leave``/``join`` (sim/views.py).  Fed the
same datagrams and the same member changes, both show node ``a`` the same view."""
from __future__ import annotations

import numpy as np

from drl.agent.gossip.core import Received
from drl.agent.gossip.membership import Membership
from drl.agent.gossip.wire import Batch, ClassValue, Header
from drl.sim.network import Updates
from drl.sim.views import ViewTable

from viewharness import summary      # one view summary for both comparisons

IDS = ("a", "b", "c", "d", "e")          # e is not a member at first
INTERVAL_S = 0.125
TIMEOUT_TICKS = 3

# tick -> events: ("update", sender, value) | ("leave", id) | ("join", id)
SCRIPT = {
    0: [("update", "b", 1000.0), ("update", "c", 2000.0), ("update", "d", 500.0)],
    1: [("leave", "c")],                                   # gone at once, not stale
    2: [("join", "e")],                                    # a member, stale until heard
    3: [("update", "e", 700.0), ("update", "b", 1100.0)],
    4: [("join", "c")],                                    # back under its old id: a fresh slot
    5: [("update", "c", 900.0)],
    6: [("leave", "b"), ("update", "d", 600.0)],
}
TICKS = 12


class Both:
    def __init__(self):
        self.table = ViewTable(IDS, INTERVAL_S, TIMEOUT_TICKS + 1, members=np.array([m != "e" for m in IDS]))
        self.peers = ["b", "c", "d"]
        self.members = Membership("a", self.peers, TIMEOUT_TICKS * INTERVAL_S, names={p: p for p in self.peers})
        self.seq = dict.fromkeys(IDS, 0)

    def tick(self, t: int, events) -> None:
        self.table.expire(t)
        for kind, node, *value in events:
            j = IDS.index(node)
            if kind == "leave":
                self.peers.remove(node)
                self.table.leave(j, t)
            elif kind == "join":
                self.peers.append(node)
                self.table.join(j)
                self.seq[node] = 0
            else:
                self.seq[node] += 1
                header = Header(cluster="c", node=node, seq=self.seq[node], incarnation=1, sent_at=t * INTERVAL_S)
                self.members.observe(Received(header, Batch((ClassValue(0, self.seq[node], value[0]),)), node),
                                     t * INTERVAL_S)
                self.table.receive(Updates(np.array([j]), np.array([0]), np.array([value[0]]),
                                           np.array([self.seq[node]])), t)
            if kind != "update":
                self.members.set_peers({p: p for p in self.peers})

    def views(self, t: int):
        return self.members.view(0, t * INTERVAL_S), self.table.view(0, t)


def test_leave_and_join_agree_with_membership_at_every_tick():
    both = Both()
    seen = {}
    for t in range(TICKS):
        both.tick(t, SCRIPT.get(t, []))
        agent, sim = both.views(t)
        assert summary(sim) == summary(agent), f"tick {t}"
        seen[t] = summary(sim)
    assert "c" not in seen[1]["members"] and seen[1]["remote_sum"] == 1500.0     # c's value gone at once
    assert seen[2]["peers"]["e"] == (0.0, False, "never") and seen[3]["peers"]["e"][1]
    assert seen[4]["peers"]["c"] == (0.0, False, "never")                       # back: nothing remembered
    assert "b" not in seen[6]["members"] and seen[6]["n_alive"] == 3
