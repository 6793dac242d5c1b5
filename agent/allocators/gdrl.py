"""GDRL: capacity moves along graph edges from where a performance indicator is
good to where it is bad ([Stanojevic09]).

    >>> from drl.agent.allocators import create
    >>> alloc = create("gdrl", indicator="spare", graph="ring")   # eta = 1/(2d) = 1/4
    >>> state = alloc.initial_state("n1", ("n1", "n2", "n3"))

Each tick, for every neighbour j whose published indicator q_j is worse than
ours (q_j > q_i), this node gives ``eta * slope_i * (q_j - q_i)`` of its
capacity to j as an acknowledged pairwise transfer (agent/allocators/transfer.py).
That is the update of Fig. 1 line 4 / eq. 7, C_i += eta * sum_j (q_i - q_j),
split into its per-edge terms and carried out by the giver, which is the
asynchronous pairwise form of the Appendix (Theorem 2): a lost message delays
one edge's term, it never creates or destroys capacity.  ``sum C_i + in
flight == C`` exactly (integer B/s, see transfer.py for the proof).

Indicators (:data:`INDICATORS`) must decrease as capacity grows (Assumption 1):

* ``spare``: q = demand - C_i, eq. 14 (the paper's "spare bandwidth"; it is
  the negative of the spare capacity, which is what makes it decreasing);
* ``drop``: q = max(0, demand - C_i) / demand, the share a bucket at C_i drops;
* ``fillratio``: q = -C_i / demand, [Ramsden] eq. 1 (negated).

``slope_i`` = -dC_i/dq_i (1 for ``spare``, demand for the others) turns the
indicator difference back into B/s, so eq. 15's bound eta <= 1/(2d) holds for
every indicator.  ``eta`` defaults to 1/(2d) (Theorem 1, the paper's choice
eta = 1/4 on the ring); a larger eta raises :class:`EtaAboveBoundError` unless
``force_eta`` is set, in which case ``info["warning"]`` says so.

Failures: a neighbour dead for ``dead_after_s`` has its link settled (its
counter taken back) and the failed node's genesis share goes to its best
friend, the next member in ring order ([Stanojevic09] §IV "Node Failures").  Shorter
silences change nothing.  ``join=True`` starts a node that was not in the
others' genesis member list with zero capacity and ``degree`` random
neighbours ([Ramsden] §3.3).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

from drl.agent.model import Decision, Envelope, Mode, Snapshot, Step
from .common import ParameterError, check_range
from .graph import Graph
from .transfer import (Ledger, claim_endowments, is_alive, link_info, receive, retransmit, send,
                       settle_failed, share)


class EtaAboveBoundError(ParameterError):
    """eta above 1/(2d), where 003 Theorem 1 no longer guarantees convergence."""


class Indicator(NamedTuple):
    value: Callable[[float, float], float]   # (demand_Bps, capacity_Bps) -> q, decreasing in capacity
    slope: Callable[[float], float]          # demand_Bps -> -dC/dq, B/s per unit of q


INDICATORS: dict[str, Indicator] = {
    "spare": Indicator(value=lambda d, c: d - c, slope=lambda d: 1.0),
    "drop": Indicator(value=lambda d, c: max(0.0, d - c) / d, slope=lambda d: d),
    "fillratio": Indicator(value=lambda d, c: -c / d, slope=lambda d: d),
}


@dataclass(frozen=True)
class DiffusionState:
    node_id: str
    genesis: tuple[str, ...]        # members that started with a share; () for a joiner
    neighbours: tuple[str, ...]     # from the graph, or a joiner's random picks
    eta: float                      # the gain, checked against the graph's degree
    ledger: Ledger | None = None    # None until the first tick brings the global limit
    rounds: int = 0


@dataclass(frozen=True)
class Gdrl:
    name: ClassVar[str] = "gdrl"
    needs_member_ids: ClassVar[bool] = True    # state depends on who the members are
    eta: float | None = None            # None: 1/(2d), [Stanojevic09] eq. 15
    indicator: str = "spare"
    graph: str = "ring"
    degree: int = 2
    seed: int = 0
    edges: tuple[tuple[str, str], ...] = ()
    force_eta: bool = False
    dead_after_s: float = 30.0
    min_demand_Bps: float = 1000.0      # demand floor for the ratio indicators
    join: bool = False

    def __post_init__(self) -> None:
        if self.indicator not in INDICATORS:
            raise ParameterError(f"indicator must be one of {', '.join(INDICATORS)}, got {self.indicator!r}")
        check_range("dead_after_s", self.dead_after_s, 0.0, float("inf"))
        check_range("min_demand_Bps", self.min_demand_Bps, 0.0, float("inf"), low_open=True)
        if self.eta is not None:
            check_range("eta", self.eta, 0.0, 1.0, low_open=True)
        self._topology()  # a bad graph is refused when built, not at the first tick
        if self.graph != "edges":
            self.gain(2 if self.graph == "ring" else self.degree)

    def _topology(self) -> Graph:
        return Graph(kind=self.graph, degree=self.degree, seed=self.seed, edges=tuple(map(tuple, self.edges)))

    def gain(self, degree: int) -> float:
        """eta for a graph of maximum degree ``degree``, checked against [Stanojevic09] eq. 15."""
        bound = _bound(degree)
        if self.eta is None:
            return bound
        if self.eta > bound and not self.force_eta:
            raise EtaAboveBoundError(f"eta {self.eta:g} is above 1/(2d) = {bound:g} for degree {degree}, "
                                     f"where GDRL may oscillate; lower it or set force_eta")
        return self.eta

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> DiffusionState:
        members = tuple(sorted(members))
        if self.join:
            others = [m for m in members if m != node_id]
            picks = random.Random(f"{self.seed}:{node_id}").sample(others, min(self.degree, len(others)))
            return DiffusionState(node_id=node_id, genesis=(), neighbours=tuple(sorted(picks)),
                                  eta=self.gain(self.degree))
        topology = self._topology()
        return DiffusionState(node_id=node_id, genesis=members, neighbours=topology.neighbours(node_id, members),
                              eta=self.gain(topology.degree_of(members)))

    def step(self, state: DiffusionState, snap: Snapshot) -> Step:
        return diffusion_step(self, state, snap)


def diffusion_step(alloc: Gdrl, state: DiffusionState, snap: Snapshot) -> Step:
    """One GDRL round: apply the inbox, handle failures, give to worse-off neighbours."""
    total = int(round(snap.global_Bps))
    led = state.ledger or Ledger(holding=share(total, state.genesis, state.node_id))
    led, acks, _ = receive(led, snap.inbox)
    led = settle_failed(led, snap.view, alloc.dead_after_s)
    led = claim_endowments(led, state.node_id, state.genesis, total, snap.view, alloc.dead_after_s)

    ind = INDICATORS[alloc.indicator]
    demand = max(snap.local.demand_Bps, alloc.min_demand_Bps)
    q_own = ind.value(demand, led.holding)
    neighbours = sorted((set(state.neighbours) | set(led.links)) - led.closed)
    out: list[Envelope] = list(acks)
    sent_to = []
    for peer in neighbours:
        amount = _pairwise_amount(led, snap, peer, q_own, state.eta * ind.slope(demand))
        if amount > 0 or (state.rounds == 0 and not state.genesis):  # a joiner's hello opens the link
            led, env = send(led, peer, amount)
            out.append(env)
            sent_to.append(peer)
    out.extend(retransmit(led, sent_to, snap.view))

    info: dict[str, Any] = {"indicator": alloc.indicator, "q": q_own, "eta": state.eta, "capacity_Bps": led.holding,
                            "accountable_Bps": led.accountable, "claimed": sorted(led.claimed),
                            "neighbours": link_info(led, snap.view, unit="_Bps")}
    if alloc.indicator == "fillratio":
        info["fill_ratio"] = -q_own
    if state.eta > _bound(len(state.neighbours)):
        info["warning"] = f"eta {state.eta:g} above the 1/(2d) bound (forced)"
    decision = Decision(mode=Mode.BUCKET, limit_Bps=float(max(0, led.holding)), publish=q_own, info=info)
    return Step(state=dataclasses.replace(state, ledger=led, rounds=state.rounds + 1),
                decision=decision, outbox=tuple(out))


def _bound(degree: int) -> float:
    return 1.0 / (2 * max(1, degree))


def _pairwise_amount(led: Ledger, snap: Snapshot, peer: str, q_own: float, gain_Bps: float) -> int:
    """The edge term eta * slope * (q_j - q_i), paid by this node when positive and
    never more than it holds (so no limit goes negative)."""
    if not is_alive(snap.view, peer):
        return 0
    diff = snap.view.peers[peer].value - q_own
    if diff <= 0:
        return 0
    return max(0, min(led.holding, int(gain_Bps * diff)))
