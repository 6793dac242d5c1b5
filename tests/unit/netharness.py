"""A small lossy message network that drives n allocators' step() in lock-step ticks.

    net = Net(create("gdrl"), ["a", "b", "c"], global_Bps=3e6, loss=0.2, dup=0.1, max_delay=2, seed=1)
    net.run(50)
    net.crash("b"); net.run(10)

Each tick every live node gets the messages due for it (random loss, duplication
and extra delay of up to ``max_delay`` ticks, which reorders them) and a peer view
built from what the others published one tick earlier, as float32, the way gossip would
deliver it.  A crashed node stops and keeps its last state for the accounting;
a partitioned pair loses all messages both ways and sees each other as dead.

Membership changes as a registry makes them: ``leave`` stops a node and takes it
out of every view at once, ``join`` adds a node (or brings a left one back),
``restart`` starts a stopped or running node's next life from its saved state
(``dump_state``/``load_state``, as the agent's state file) with a new
incarnation in every view.  What is in flight to or from a node's old life is
dropped, as gossip would.
"""
from __future__ import annotations

import random
import struct
from collections import defaultdict
from typing import Any, Callable

from drl.agent.allocators.common import peer_view
from drl.agent.model import Decision, Envelope, Local, PeerState, Snapshot


class Net:
    def __init__(self, alloc: Any, members: list[str], global_Bps: float, *, interval_s: float = 1.0,
                 loss: float = 0.0, dup: float = 0.0, max_delay: int = 0, seed: int = 0) -> None:
        self.alloc = {m: alloc for m in members}
        self.members = tuple(sorted(members))
        self.genesis = self.members
        self.life = dict.fromkeys(members, 1)
        self.gone: set[str] = set()                # left the members
        self.global_Bps = global_Bps
        self.interval_s = interval_s
        self.loss, self.dup, self.max_delay = loss, dup, max_delay
        self.rng = random.Random(seed)
        self.tick_no = 0
        self.state = {m: alloc.initial_state(m, self.members) for m in members}
        self.decision: dict[str, Decision] = {}
        self.local: dict[str, Local] = {m: Local(demand_Bps=0.0) for m in members}
        self.crashed: dict[str, int] = {}          # node -> tick it crashed
        self.cut: set[frozenset[str]] = set()      # partitioned pairs
        self.queue: dict[int, list[Envelope]] = defaultdict(list)
        self.cut_at = 0

    @property
    def live(self) -> list[str]:
        return [m for m in self.state if m not in self.crashed and m not in self.gone]

    def add(self, node: str, alloc: Any, members: tuple[str, ...] | None = None) -> None:
        """A node that joins later with its own configuration (e.g. join=True): a member
        for everyone from now on, started with ``members`` (default: the current ones)."""
        self.members = tuple(sorted(set(self.members) | {node}))
        self.alloc[node] = alloc
        self.state[node] = alloc.initial_state(node, members or self.members)
        self.local[node] = Local(demand_Bps=0.0)
        self.life.setdefault(node, 1)

    def leave(self, node: str) -> None:
        """``node`` leaves the registry: stopped, and no member for anyone any more."""
        self.gone.add(node)
        self.members = tuple(m for m in self.members if m != node)
        self._purge(node)

    def restart(self, node: str) -> None:
        """``node``'s next life (back in the members if it had left), from its saved state."""
        alloc, old = self.alloc[node], self.state[node]
        self.state[node] = alloc.load_state(alloc.dump_state(old)) if hasattr(alloc, "load_state") \
            else alloc.initial_state(node, self.members)
        self.crashed.pop(node, None)
        self.decision.pop(node, None)
        if node in self.gone:
            self.gone.discard(node)
            self.members = tuple(sorted(set(self.members) | {node}))
        self.life[node] += 1
        self._purge(node)

    def _purge(self, node: str) -> None:
        for tick, envs in self.queue.items():
            self.queue[tick] = [e for e in envs if node not in (e.src, e.dst)]

    def crash(self, node: str) -> None:
        self.crashed[node] = self.tick_no

    def restore(self, node: str, state: Any) -> None:
        """Restart a crashed node from a saved state."""
        self.crashed.pop(node, None)
        self.state[node] = state

    def run(self, ticks: int, each: Callable[["Net"], None] | None = None) -> None:
        for _ in range(ticks):
            self.tick()
            if each:
                each(self)

    def tick(self) -> None:
        due = self.queue.pop(self.tick_no, [])
        inbox: dict[str, list[Envelope]] = defaultdict(list)
        for env in due:
            inbox[env.dst].append(env)
        outgoing = []
        views = {node: self._view(node) for node in self.live}     # all from last tick's values
        for node in sorted(self.live):
            snap = Snapshot(now=self.tick_no * self.interval_s, node_id=node, interval_s=self.interval_s,
                            global_Bps=self.global_Bps, local=self.local[node], view=views[node],
                            inbox=tuple(Envelope(e.body, src=e.src) for e in inbox[node]))
            step = self.alloc[node].step(self.state[node], snap)
            self.state[node], self.decision[node] = step.state, step.decision
            outgoing += [Envelope(e.body, dst=e.dst, src=node) for e in step.outbox]
        for env in outgoing:
            self._post(env)
        self.tick_no += 1

    def _post(self, env: Envelope) -> None:
        if frozenset((env.src, env.dst)) in self.cut or self.rng.random() < self.loss:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            self.queue[self.tick_no + 1 + self.rng.randint(0, self.max_delay)].append(env)

    def _view(self, node: str):
        peers = []
        for other in self.members:
            if other == node:
                continue
            dead_since = self.crashed.get(other)
            if frozenset((node, other)) in self.cut:
                dead_since = self.cut_at
            alive = dead_since is None
            age = 0.0 if alive else (self.tick_no - dead_since) * self.interval_s
            value = as_float32(self.decision[other].publish) if other in self.decision else 0.0
            peers.append(PeerState(other, value, alive=alive, age_s=age, incarnation=self.life[other]))
        return peer_view(self.members, peers)

    def partition(self, side: set[str]) -> None:
        """Cut every link between ``side`` and the rest (a netsplit)."""
        self.cut_at = self.tick_no
        self.cut = {frozenset((a, b)) for a in side for b in self.state if b not in side}

    def heal(self) -> None:
        self.cut = set()


def as_float32(value: float) -> float:
    """``value`` as a peer reads it: the wire carries published values as protobuf floats
    (agent/gossip/drl.proto), so 1e-49 arrives as 0.0."""
    return struct.unpack("f", struct.pack("f", value))[0]


def diffusion_accounted(net: Net) -> int:
    """GDRL / fill ratio accounting, in parts of C: the live nodes' accountable amounts plus
    the genesis share of every failed node that no live node has inherited yet.
    transfer.py shows this is exactly gdrl.PARTS after every tick."""
    from drl.agent.allocators.gdrl import PARTS
    from drl.agent.allocators.endowment import share
    live = [net.state[m] for m in net.live if net.state[m].ledger is not None]
    claimed = set().union(*(s.ledger.claimed for s in live))
    genesis = net.genesis
    waiting = sum(share(PARTS, genesis, d) for d in net.crashed if d in genesis and d not in claimed)
    return sum(s.ledger.accountable for s in live) + waiting
