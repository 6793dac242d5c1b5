"""The tick loop: the agent's allocators and estimator over sim.network.

    setup = Setup(allocator="fps", n_nodes=100, global_Bps=parse_rate("50mbit"), loss=0.01)
    sim = Simulation(setup, demand=TcpFluid(flows, 100, rng))
    sim.at(200, lambda s: s.crash([3, 4]))              # events: crash, rejoin, leave, join, partition, heal
    trace = sim.run(600, progress=print_progress)

One tick is one estimate interval, and does what the agent's daemon does on
every node, in the same order (docs/design.md, "one tick"):

1. deliver what the network lets through: gossip Updates into every node's
   view (sim.views), point-to-point Envelopes into its inbox;
2. measure: the node's own ``agent.estimator.Estimator`` turns the demand
   model's counters and flow table into a ``Local``;
3. allocate: ``agent.step.class_step``, the function the agent's tick runs (tree sums,
   the allocator built by ``agent.allocators.create``, the heard cap);
4. publish: ``decision.publish`` to ``branching`` random peers (or to the
   graph neighbours), the outbox to its destinations, through the network;
5. enforce: the demand model runs one interval under every node's Decision.

With a gossip branching below N - 1, an allocator that reads only the peers' sum (FPS, GRD)
gets it from agent.gossip.tree's SumTree, one per node, as the agent does: its LEAF, PARTIAL and
TOTAL messages go through the network as point-to-point messages, and each node's view takes
the tree's remote sum where the tree covers its alive peers (``SumTree.apply``).

Only steps 3's inputs and outputs cross into allocator code; nothing of an
allocator is re-implemented here.

Membership changes the way a registry makes them (docs/sim.md, "The model"): the
first ``Setup.founders`` ids are the members at start, the others wait
outside; ``leave`` takes a node out of every view at once and stops it,
``join`` starts a node (fresh, or back under its old id) and makes it a
member.  A node that was a member before restarts from its saved state
(``dump_state``/``load_state`` when the allocator has them, as the agent's
state file), a new one with ``join=True`` (the allocators' joiner option).
A node gossips to its graph neighbours and to every peer it exchanged a
point-to-point message with (a joiner's random neighbours).
"""
from __future__ import annotations

import contextlib
import gc
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from drl.agent.allocators import create
from drl.agent.allocators.graph import Graph
from drl.agent.estimator import Estimator
from drl.agent.gossip.core import Cycle
from drl.agent.gossip.membership import liveness_timeout
from drl.agent.gossip.tree import SumTree, tree_wanted
from drl.agent.gossip.wire import Sums
from drl.agent.model import Envelope, Mode
from drl.agent.step import ClassInput, class_step, safe_rate_Bps

from .network import Network
from .tcp import Enforcement
from .trace import Trace
from .views import ViewTable
from .wiretap import CLASS_ID, WireTap


def _anyone(node_id: str) -> bool:
    """Every member can be sent to: the simulated network routes by index."""
    return True


@contextlib.contextmanager
def _few_collections():
    """A tick at 1,000 limiters allocates ~40,000 short-lived objects over a heap of long-lived
    per-node state, and under the default thresholds the cyclic collector took 12 % of a run.
    As the agent does (agent/service/startup.py tune_gc): the heap built so far is frozen out
    of the collections and the young generation collected less often, for the run only."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Demand(Protocol):
    """What a demand model gives the engine (sim.tcp, sim.openloop, sim.quota)."""
    passed: np.ndarray     # bytes forwarded per node, cumulative
    dropped: np.ndarray    # bytes refused per node, cumulative

    def advance(self, now_s: float, interval_s: float, enforce: Enforcement, alive: np.ndarray) -> None: ...
    def counters(self, i: int) -> Any: ...
    def flow_records(self, i: int, now_s: float) -> list: ...


@dataclass
class Setup:
    allocator: str
    n_nodes: int
    global_Bps: float
    params: dict = field(default_factory=dict)     # allocator parameters, as for create()
    interval_s: float = 0.05                        # [Raghavan07] §5.1: 50 ms estimate interval
    branching: int = 3                              # peers gossiped to per interval ([Raghavan07] §5.6)
    graph: Graph | None = None                      # gossip only along its edges (GDRL, DQMP)
    loss: float = 0.0
    delay_s: float = 0.02                           # one way; [Raghavan07] §5.6: 40 ms inter-limiter RTT
    jitter_s: float = 0.0
    stale_s: float | None = None                    # None: agent.membership.liveness_timeout
    estimator_ewma: float = 0.1                     # per second, agent.estimator.Estimator's default
    seed: int = 0
    founders: int | None = None                     # members at start (the first ids); None: all
    sum_tree: bool | None = None                    # None: where the agent uses it (tree.tree_wanted)

    def node_ids(self) -> tuple[str, ...]:
        width = len(str(self.n_nodes - 1))
        return tuple(f"n{i:0{width}d}" for i in range(self.n_nodes))

    def founder_ids(self) -> tuple[str, ...]:
        return self.node_ids()[:self.founders]

    def neighbours(self) -> list[list[int]] | None:
        """Each node's graph neighbours as indexes (the allocator's own Graph over the
        founders; a later node has none until it opens links)."""
        if self.graph is None:
            return None
        ids = self.node_ids()
        index = {nid: i for i, nid in enumerate(ids)}
        adj = self.graph.adjacency(self.founder_ids())
        return [[index[m] for m in adj.get(nid, ())] for nid in ids]

    def uses_tree(self) -> bool:
        if self.sum_tree is not None:
            return self.sum_tree
        reads_sum = getattr(create(self.allocator, **self.params), "reads_sum", False)
        return self.graph is None and tree_wanted(self.n_nodes - 1, self.branching, reads_sum)

    def effective_branching(self) -> int:
        return min(self.branching, self.n_nodes - 1)

    def stale_ticks(self) -> int:
        """Ticks after which a silent peer is stale: the agent's liveness timeout
        (alive while silent <= timeout, so stale from timeout/interval + 1 ticks).
        On a graph a node's peers are its neighbours and it updates them all."""
        if self.stale_s is not None:
            timeout = self.stale_s
        elif self.graph is not None:
            timeout = liveness_timeout(self.interval_s, n_peers=1, branching=1)
        else:
            timeout = liveness_timeout(self.interval_s, self.n_nodes - 1, self.effective_branching())
        return int(timeout / self.interval_s + 1e-9) + 1


class Simulation:
    def __init__(self, setup: Setup, demand: Demand):
        self.setup, self.demand = setup, demand
        n = setup.n_nodes
        self.rng = np.random.default_rng(setup.seed)
        self.ids = setup.node_ids()
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.alloc = create(setup.allocator, **setup.params)
        self.joiner = create(setup.allocator, **{**setup.params, "join": True})
        self.net = Network(n, setup.interval_s, self.rng, setup.loss, setup.delay_s, setup.jitter_s)
        founders = setup.founder_ids()
        starting = np.arange(n) < len(founders)
        self.net.alive &= starting
        self.views = ViewTable(self.ids, setup.interval_s, setup.stale_ticks(), members=starting)
        self.tap = WireTap(self.ids, self.rng)
        self.states: list[Any] = [self.alloc.initial_state(nid, founders) if i < len(founders) else None
                                  for i, nid in enumerate(self.ids)]
        self.estimators = [Estimator(ewma=setup.estimator_ewma) for _ in range(n)]
        self.inbox: list[list[Envelope]] = [[] for _ in range(n)]
        self.update_seq = np.zeros((n, n), dtype=np.int32)   # agent.gossip: per (sender, receiver)
        self.neighbours = setup.neighbours()
        self.cycles = [self._cycle() for _ in range(n)]
        self.decisions: list = [None] * n
        self.publish = np.zeros(n)
        self.control_bytes = 0          # point-to-point bytes sent this tick
        self.events: dict[int, list[Callable[["Simulation"], None]]] = {}
        self.trees = ([SumTree(nid, setup.interval_s, self.views.stale_ticks * setup.interval_s) for nid in self.ids]
                      if setup.uses_tree() else None)
        self.tick = 0

    def _cycle(self) -> Cycle:
        """agent.gossip's shuffled round robin over a node's N-1 peers."""
        return Cycle(self.setup.n_nodes - 1, random.Random(int(self.rng.integers(2**63))))

    # --- events -------------------------------------------------------
    def at(self, tick: int, event: Callable[["Simulation"], None]) -> None:
        self.events.setdefault(tick, []).append(event)

    def crash(self, nodes: Sequence[int]) -> None:
        self.net.crash(nodes)
        for i in nodes:
            self.decisions[i] = None

    def rejoin(self, nodes: Sequence[int]) -> None:
        """A restarted agent: its saved state, a fresh estimator and view; it keeps its id."""
        self.net.rejoin(nodes)
        for i in nodes:
            self.states[i] = self._restarted_state(i)
            self.estimators[i] = Estimator(ewma=self.setup.estimator_ewma)
            self.views.restart(i)
            self.tap.restart(i)
            self.net.purge(i, self.ids[i])
            self.update_seq[i, :] = 0
            self.cycles[i] = self._cycle()
            self.inbox[i] = []
            if self.trees:
                self.trees[i] = SumTree(self.ids[i], self.setup.interval_s, self.trees[i].timeout_s)

    def leave(self, nodes: Sequence[int]) -> None:
        """Nodes that leave the registry: stopped, and no member for anyone from now on."""
        self.crash(nodes)
        for i in nodes:
            self.views.leave(i, self.tick)
            self.net.purge(i, self.ids[i])

    def join(self, nodes: Sequence[int]) -> None:
        """Nodes that join the registry: new ones start as joiners, former members restart."""
        for i in nodes:
            self.views.join(i)
        self.rejoin(nodes)

    def _restarted_state(self, i: int) -> Any:
        nid, old = self.ids[i], self.states[i]
        if old is None:
            return self.joiner.initial_state(nid, self.views.view(i, self.tick).members)
        if hasattr(self.alloc, "load_state"):
            return self.alloc.load_state(self.alloc.dump_state(old))
        return self.alloc.initial_state(nid, self.views.view(i, self.tick).members)

    # --- the loop -----------------------------------------------------
    def run(self, n_ticks: int, progress: Callable[[int, int], None] | None = None) -> Trace:
        trace = Trace(self.setup, n_ticks, self.demand, start_s=self.tick * self.setup.interval_s)
        with _few_collections():
            for k in range(n_ticks):
                self.step(trace, k)
                if progress:
                    progress(k + 1, n_ticks)
        return trace

    def step(self, trace: Trace, row: int) -> None:
        """One tick; ``row`` is where ``trace`` records it."""
        s, k = self.setup, self.tick
        now = k * s.interval_s
        for event in self.events.pop(k, []):
            event(self)
        self._deliver(k)
        enforce = self._allocate(now, k)
        control = self._publish(k, now)
        self.demand.advance(now, s.interval_s, enforce, self.net.alive)
        trace.record(row, self, enforce, control)
        self.tick += 1

    def _deliver(self, k: int) -> None:
        batch = self.net.due_updates(k)
        self.tap.received(batch.dst, batch.src, batch.seq)
        self.views.expire(k)            # first: an update arriving right now revives the peer
        self.views.receive(batch, k)
        arrived = self.net.due_envelopes(k)
        if not arrived:
            return
        now, trees, inbox, index = k * self.setup.interval_s, self.trees, self.inbox, self.index
        dsts, srcs, seqs = [], [], []
        for dst, env, seq in arrived:
            body = env.body
            if type(body) is Sums:
                trees[dst].receive(env.src, body, now)
            else:
                inbox[dst].append(env)
            dsts.append(dst)
            srcs.append(index[env.src])
            seqs.append(seq)
        dst_a, src_a = np.array(dsts), np.array(srcs)
        self.tap.received(dst_a, src_a, np.array(seqs))
        self.views.touch(dst_a, src_a, k)

    def _allocate(self, now: float, k: int) -> Enforcement:
        s, n = self.setup, self.setup.n_nodes
        # per node into lists, into arrays once: numpy's scalar stores cost ~1 us each
        # (and the loop's lookups hoisted: it runs 1,000 times a tick)
        mode, limit, drop, quota = [int(Mode.PASS)] * n, [0.0] * n, [0.0] * n, [np.inf] * n
        publish = self.publish.tolist()
        now_ns, interval_s, global_Bps = int(now * 1e9), s.interval_s, s.global_Bps
        counters, flow_records, view_of = self.demand.counters, self.demand.flow_records, self.views.view
        estimators, states, inbox, ids, alloc = self.estimators, self.states, self.inbox, self.ids, self.alloc
        neighbours, trees = self.neighbours, self.trees
        for i in np.flatnonzero(self.net.alive).tolist():
            local = estimators[i].update(now, counters(i), flow_records(i, now), now_ns)
            view = view_of(i, k, neighbours[i] if neighbours else None)
            given = ClassInput(now, ids[i], interval_s, global_Bps, local, view, inbox[i],
                               safe_rate_Bps(global_Bps, view.n_nodes), CLASS_ID)
            _, out = class_step(alloc, states[i], given, trees[i] if trees else None)
            inbox[i] = []
            states[i], d = out.state, out.decision
            self.decisions[i] = d
            mode[i], limit[i], drop[i] = int(d.mode), d.limit_Bps, d.drop_probability
            quota[i] = np.inf if d.quota_bytes is None else d.quota_bytes
            publish[i] = d.publish
            if out.outbox:
                self._send_outbox(i, out.outbox, k, now)
        self.publish = np.array(publish, dtype=float)
        return Enforcement(np.array(mode), np.array(limit), np.array(drop), np.array(quota))

    def _send_outbox(self, i: int, outbox: Sequence[Envelope], k: int, now: float) -> None:
        for env in outbox:
            dst = self.index.get(env.dst)
            if dst is None:
                continue   # the agent's gossip drops a message to an unknown peer the same way
            self._partners(i, dst)
            self.update_seq[i, dst] += 1        # one sequence stream per (sender, receiver)
            seq = int(self.update_seq[i, dst])
            self.control_bytes += self.tap.envelope_sent(self.ids[i], env, seq, now)
            self.net.send_envelope(i, dst, Envelope(env.body, dst=env.dst, src=self.ids[i]), seq, k)

    def _partners(self, i: int, j: int) -> None:
        """Gossip along a link an allocator opened outside the graph (a joiner's picks)."""
        if self.neighbours is not None and j not in self.neighbours[i]:
            self.neighbours[i].append(j)
            self.neighbours[j].append(i)

    def _targets(self, senders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of this tick's Updates: every graph neighbour, or ``branching``
        peers chosen by each node's gossip cycle (agent.gossip.GossipCore.targets)."""
        n, k = self.setup.n_nodes, self.setup.effective_branching()
        if len(senders) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.neighbours is None and k < n - 1:
            # one array for all senders (k each): an array per sender cost ~1 us
            picks = np.array([self.cycles[i].take(k) for i in senders.tolist()], dtype=np.int64)
            return np.repeat(senders, k), ((senders[:, None] + 1 + picks) % n).ravel()
        if self.neighbours is not None:
            dst = [np.asarray(self.neighbours[i], dtype=np.int64) for i in senders]
        else:
            dst = [np.delete(np.arange(n), i) for i in senders]
        src = np.repeat(senders, [len(d) for d in dst])
        return src, np.concatenate(dst).astype(np.int64)

    def _publish(self, k: int, now: float) -> int:
        """Gossip every alive node's published value; returns the control bytes of this tick."""
        senders = np.flatnonzero(self.net.alive)
        src, dst = self._targets(senders)
        self.update_seq[src, dst] += 1
        seq = self.update_seq[src, dst].astype(np.int64)
        value = self.publish[src]
        self.net.send_updates(src, dst, value, seq, k)
        if self.trees:
            self._sum_round(senders, k, now)
        control = self.tap.updates_sent(seq) + self.control_bytes
        self.control_bytes = 0
        return control

    def _sum_round(self, senders: np.ndarray, k: int, now: float) -> None:
        """Every alive node's sum-tree messages (agent.gossip.tree), point to point."""
        members = self.views.view(0, k).members
        src, dst, envs = [], [], []
        index, ids, publish = self.index, self.ids, self.publish.tolist()
        for i in senders.tolist():
            for to, sums in self.trees[i].round(members, {CLASS_ID: publish[i]}, now, _anyone):
                src.append(i)
                dst.append(index[to])
                envs.append(Envelope(sums, dst=to, src=ids[i]))
        if envs:
            src_a, dst_a = np.array(src), np.array(dst)
            seq_a = self._next_seq(src_a, dst_a)
            self.control_bytes += self.tap.sums_sent(envs, seq_a, now)
            self.net.send_envelopes(src_a, dst_a, envs, seq_a, k)

    def _next_seq(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The sequence numbers of messages (src[m], dst[m]) in their order, one stream per
        (sender, receiver) as agent.gossip numbers them; a pair may send several a tick."""
        pair = src * self.setup.n_nodes + dst
        order = np.argsort(pair, kind="stable")
        ranked = pair[order]
        first = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
        rank = np.arange(len(pair)) - np.repeat(first, np.diff(np.r_[first, len(pair)]))
        seq = np.empty(len(pair), dtype=np.int64)
        seq[order] = self.update_seq[src[order], dst[order]] + 1 + rank
        np.add.at(self.update_seq, (src, dst), 1)
        return seq
