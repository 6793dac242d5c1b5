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
flight == C`` exactly (see transfer.py for the proof).

Capacity is held and moved as integer *parts* of the global limit
(:data:`PARTS` of them make C), not as B/s: a node enforces its parts times
the global limit it knows now.  So a change of the limit (``drlctl set``, a
reload, etcd) rescales every node's limit on its next tick, with no
transfer, and transfers in flight keep their meaning across it; a ledger in
B/s would keep enforcing shares of the old limit for good.  The edge terms
are computed in B/s (the indicators compare demand with capacity) and
converted; ``info`` gives both (``capacity_Bps``, ``accountable_Bps``; the
exact ``accountable_parts``).

Indicators (:data:`INDICATORS`) must decrease as capacity grows (Assumption 1):

* ``spare``: q = demand - C_i, eq. 14 (the paper's "spare bandwidth"; it is
  the negative of the spare capacity, which is what makes it decreasing);
* ``drop``: q = max(0, demand - C_i) / demand, the share a bucket at C_i drops;
* ``fillratio``: q = -C_i / demand, [Ramsden] eq. 1 (negated); the default.

Why not the paper's ``spare``: Assumption 1 wants q_i = f_i(C_i) for a fixed
demand, and the arrivals a limiter measures are fixed only for open-loop
traffic.  TCP behind a policer arrives at what its limit passes plus what is
dropped, more the harder it is squeezed, so a host's spare q = arrivals - C
followed its capacity: on three hosts with identical TCP load the holder's q
(16.4 Mbit/s arriving at a 12 Mbit/s limit: +4.4) stayed above the starved
ones' (0.6 arriving at 0: +0.6), and one limiter kept all 12 Mbit/s for good.
With the fill ratio a starved host shows 0, the best possible, and the holder
-0.73, and the ratios are what one central bucket would make equal (it
passes C * d_i / sum d, the same C_i/d_i at every host).  ``spare`` stays for
open-loop demand (the simulator's [Stanojevic09] §III runs).

When the arrivals follow the limit the ratio hardly changes with C either
(C_i/d_i = 1 - loss), so a ratio indicator alone lets identical hosts drift
apart at random.  ``equal_bias`` (0.3; 0 = off, as ``fillratio`` the allocator
keeps [Ramsden] exact) adds -equal_bias * C_i / (C/N) to a ratio indicator:
where demand cannot tell hosts apart the one with less capacity gets more.  It
moves an open-loop allocation a little towards the equal split (demands 2/8/6
at 12: 1.92/5.52/4.57 instead of 1.5/6/4.5).  Three hosts with 4 TCP flows each
behind a 12 Mbit/s limit (tests/kernel/test_allocators.py) held limits within
2 % of each other with it and the per-second eta below.

``slope_i`` = -dC_i/dq_i (1 for ``spare``, demand for the others, less with
``equal_bias``) turns the
indicator difference back into B/s, so eq. 15's bound eta <= 1/(2d) holds for
every indicator.  ``eta`` defaults to 1/(2d) (Theorem 1, the paper's choice
eta = 1/4 on the ring) per second: a tick of dt < 1 s steps dt x 1/(2d).  The
paper updates every few seconds, from estimates over as long (§IV "Communication
delays"); our ticks are 100 ms apart on a 1-second EWMA, and ten full steps per
estimate made three hosts' limits under TCP swing by up to 15 % (kernel test)
where 1/(2d) per second kept them within 2 %.  An eta given explicitly is a
step per tick.  A larger eta raises :class:`EtaAboveBoundError` unless
``force_eta`` is set, in which case ``info["warning"]`` says so.

Membership follows the PeerView every tick (transfer.follow_members); what
each change does, with ``sum C_i + in flight == C`` kept throughout:

* Founders: the members a node is started with (``initial_state``) are the
  *genesis*; each founder starts with its genesis share C/N.  Every founder
  must be given the same list (``--peers``, or the registry's members when
  the cluster is first started).
* Join: ``join=True`` starts a node that is not in the genesis with zero
  capacity and ``degree`` random neighbours among the members it sees
  ([Ramsden] §3.3); its first (empty) transfer opens the links, and it gains
  capacity by diffusion.  A new member never takes a share of its own.
* Failure: a neighbour dead for ``dead_after_s`` has its link settled (its
  counter taken back) and the failed node's genesis share goes to its best
  friend, the next member in ring order ([Stanojevic09] §IV "Node Failures").
  Shorter silences change nothing.
* Leave: a member gone from ``view.members`` is a failure seen at once: its
  links are settled and its best friend claims its genesis share now.  A
  joiner has no share; its links return everything it was given.
* Rejoin under the old id: the node restarts as a *rejoiner* holding 0 and
  sends hellos to its graph neighbours.  Its neighbours see it back (in the
  members again, or a new incarnation in ``PeerState.incarnation``), settle
  what was still open with its old life and open fresh links; its best
  friend claims its share if it had not yet (a restart faster than
  ``dead_after_s``) and returns it as an acknowledged endowment return
  (endowment.return_endowments), with the shares of the members down behind
  it, whose best friend it is again; the rejoiner credits up to that amount.
  Until the return is applied the sum is below C, never above.  A share
  nobody holds (every node restarted at once) comes back by asking: see
  ``_whole_restart``.
  docs/allocators.md lists the double faults that lose a share (below C).

Restart or first start?  A node cannot tell from the network whether the
cluster is starting (take the genesis share) or it is restarting (take
nothing: its share is with its best friend).  The decision rests on the
node's own saved state: the agent writes ``dump_state`` to its state
directory every tick and, on start, gives a saved state to ``load_state``
(agent/service/class_table.py StateFile); ``load_state`` returns a *rejoiner*.  No saved
state and ``join=False``: a founder.  So a cluster started afresh must start
with empty state directories, and a node added later is started with ``join``;
a cluster restarted as a whole gets its shares back from ``_whole_restart``.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

from drl.agent.model import Decision, Envelope, Mode, Report, Snapshot, Step
from .common import ParameterError, check_range
from .graph import Graph
from .endowment import claim_endowments, heir, heir_watch, owed_amount, return_endowments, share, start_elsewhere
from .transfer import (Ledger, follow_members, is_alive, is_down, link_info, note_lives, receive, retransmit, send,
                       settle_failed)


PARTS = 10**9       # C in ledger units: 12.5 B/s a part at 100 Gbit/s, finer below
# A rejoiner asks the members up for its share; each that holds none of it says so ("Rejoin" in
# the module docstring, _whole_restart).  Both are a Report with consumed=0 (no return),
# told apart by ``free``.
ASK_SHARE, NOTHING_HELD = 1.0, 2.0
# The default eta, 1/(2d), is a step per ETA_PER_S of ticks (module docstring, "eta").
ETA_PER_S = 1.0


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
    rejoined: bool = False          # restarted from a saved state: its share comes back as a return
    returned: int = 0               # of that share, what has come back so far
    known_lives: frozenset[str] = frozenset()   # members whose earlier life this one saw end
    started_elsewhere: frozenset[str] = frozenset()   # members down behind us when we started
    cleared: frozenset[str] = frozenset()   # a rejoiner: members that said they hold none of its share


@dataclass(frozen=True)
class Gdrl:
    name: ClassVar[str] = "gdrl"
    needs_member_ids: ClassVar[bool] = True    # state depends on who the members are
    genesis_shares: ClassVar[bool] = True      # founders take C/N: every node must start from one list
    eta: float | None = None            # None: 1/(2d), [Stanojevic09] eq. 15
    indicator: str = "fillratio"       # not the paper's "spare": see "Indicators" in the module docstring
    graph: str = "ring"
    degree: int = 2
    seed: int = 0
    edges: tuple[tuple[str, str], ...] = ()
    force_eta: bool = False
    dead_after_s: float = 30.0
    min_demand_Bps: float = 1000.0      # demand floor for the ratio indicators
    join: bool = False
    equal_bias: float = 0.3             # ratio indicators: -equal_bias * C_i / (C/N) added ("Indicators")

    def __post_init__(self) -> None:
        if self.indicator not in INDICATORS:
            raise ParameterError(f"indicator must be one of {', '.join(INDICATORS)}, got {self.indicator!r}")
        check_range("dead_after_s", self.dead_after_s, 0.0, float("inf"))
        check_range("min_demand_Bps", self.min_demand_Bps, 0.0, float("inf"), low_open=True)
        check_range("equal_bias", self.equal_bias, 0.0, 1.0)
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
        """``members``: the founders.  A node not among them joins (an agent with a registry
        starts a class from the founders etcd keeps, agent/cluster/registry.py)."""
        members = tuple(sorted(members))
        if self.join or node_id not in members:
            others = [m for m in members if m != node_id]
            picks = random.Random(f"{self.seed}:{node_id}").sample(others, min(self.degree, len(others)))
            return DiffusionState(node_id=node_id, genesis=(), neighbours=tuple(sorted(picks)),
                                  eta=self.gain(self.degree))
        topology = self._topology()
        return DiffusionState(node_id=node_id, genesis=members, neighbours=topology.neighbours(node_id, members),
                              eta=self.gain(topology.degree_of(members)))

    def step(self, state: DiffusionState, snap: Snapshot) -> Step:
        return diffusion_step(self, state, snap)

    # The agent saves this every tick and hands it back on a restart (agent/service/class_table.py).
    def dump_state(self, state: DiffusionState) -> dict[str, Any]:
        return {"node_id": state.node_id, "genesis": list(state.genesis), "neighbours": list(state.neighbours),
                "eta": state.eta}

    def load_state(self, data: Mapping[str, Any]) -> DiffusionState:
        """A restart: the same place in the graph, but a rejoiner holding nothing
        (module docstring); a joiner stays a joiner.  Never a founder again, even if
        it had not ticked yet: its best friend may have seen it missing and inherited
        its share, and a rejoiner is only ever short of its share, never over."""
        genesis = tuple(data["genesis"])
        return DiffusionState(node_id=data["node_id"], genesis=genesis, neighbours=tuple(data["neighbours"]),
                              eta=float(data["eta"]), rejoined=bool(genesis))


def diffusion_step(alloc: Gdrl, state: DiffusionState, snap: Snapshot) -> Step:
    """One GDRL round: follow the members, apply the inbox, handle failures and
    returns, give to worse-off neighbours.  Amounts are parts of C (module docstring)."""
    total = PARTS
    part_Bps = max(0.0, snap.global_Bps) / PARTS     # what one part is worth now
    founder = not state.rejoined and state.node_id in state.genesis
    if state.ledger is None:
        led = _first_ledger(state, founder, total, snap, alloc.dead_after_s)
        state = dataclasses.replace(state, started_elsewhere=led.elsewhere)
    else:
        led = state.ledger
    watch = heir_watch(state.genesis, state.node_id, snap.view, alloc.dead_after_s)
    led, churn = follow_members(led, snap.view, watch)
    if churn.restarted or churn.back:
        state = dataclasses.replace(state, known_lives=state.known_lives | churn.restarted | churn.back)
    led, acks, returned = receive(led, snap.inbox)
    state, led = _credit_return(state, led, returned, total)
    state, led, answers = _whole_restart(alloc, state, led, snap, total)
    led = settle_failed(led, snap.view, alloc.dead_after_s)
    led = claim_endowments(led, state.node_id, state.genesis, total, snap.view, alloc.dead_after_s,
                           restarted=churn.restarted)
    led, returns = return_endowments(led, state.genesis, total, snap.view, churn.back, alloc.dead_after_s)

    ind = INDICATORS[alloc.indicator]
    demand = max(snap.local.demand_Bps, alloc.min_demand_Bps)
    # A share we owe a member that came back is set aside: not enforced, not given away,
    # and our indicator shows its absence, so the neighbours fill it up and we can pay.
    reserved = owed_amount(led, state.genesis, total, snap.view, alloc.dead_after_s)
    capacity_Bps = (led.holding - reserved) * part_Bps
    q_own = ind.value(demand, capacity_Bps)
    slope = ind.slope(demand)
    bias = alloc.equal_bias if alloc.indicator != "spare" else 0.0
    fair_Bps = max(0.0, snap.global_Bps) / max(1, snap.view.n_nodes)
    if bias > 0.0 and fair_Bps > 0.0:
        # the tie-break of "Indicators": -dq/dC grows by bias / fair, so slope shrinks to keep
        # eta * slope * dq/dC under eq. 15's bound
        q_own -= bias * capacity_Bps / fair_Bps
        slope = 1.0 / (1.0 / slope + bias / fair_Bps)
    neighbours = sorted((set(state.neighbours) | set(led.links)) - led.closed)
    # joiners open links to us beyond the graph's degree: eta stays under 1/(2d) of the
    # degree we have now (eq. 15), or a node many joined would give away more than it holds
    eta = state.eta if alloc.force_eta else min(state.eta, _bound(len(neighbours)))
    if alloc.eta is None:
        eta *= min(1.0, snap.interval_s / ETA_PER_S)
    out: list[Envelope] = list(acks) + list(returns) + answers
    sent_to = []
    for peer in neighbours:
        amount = _pairwise_amount(led.holding - reserved, snap, peer, q_own, eta * slope, part_Bps)
        if amount > 0 or (state.rounds == 0 and not founder):  # a (re)joiner's hello opens the link
            led, env = send(led, peer, amount)
            out.append(env)
            sent_to.append(peer)
    out.extend(retransmit(led, sent_to, snap.view))
    # links opened this tick (a transfer or return received, a hello sent) get their peer's
    # life now, or a restart of that peer before our next tick goes unseen on them
    led = note_lives(led, snap.view)
    usable = max(0, led.holding - reserved)

    info: dict[str, Any] = {"indicator": alloc.indicator, "q": q_own, "eta": eta, "capacity_Bps": usable * part_Bps,
                            "accountable_Bps": led.accountable * part_Bps, "accountable_parts": led.accountable,
                            "claimed": sorted(led.claimed), "owed": sorted(led.owed), "rejoined": state.rejoined,
                            "returned_Bps": state.returned * part_Bps,
                            "neighbours": link_info(led, snap.view, unit="_Bps", scale=part_Bps)}
    if alloc.indicator == "fillratio":
        info["fill_ratio"] = -q_own
    if state.eta > _bound(len(state.neighbours)):
        info["warning"] = f"eta {state.eta:g} above the 1/(2d) bound (forced)"
    decision = Decision(mode=Mode.BUCKET, limit_Bps=usable * part_Bps, publish=q_own, info=info)
    return Step(state=dataclasses.replace(state, ledger=led, rounds=state.rounds + 1),
                decision=decision, outbox=tuple(out))


def _first_ledger(state: DiffusionState, founder: bool, total: int, snap: Snapshot, dead_after_s: float) -> Ledger:
    """A founder starts with its genesis share, a (re)joiner with nothing."""
    if founder:
        return Ledger(holding=share(total, state.genesis, state.node_id), reports_in_net=False)
    return start_elsewhere(Ledger(holding=0, reports_in_net=False), state.genesis, state.node_id, snap.view,
                           dead_after_s)


def _whole_restart(alloc: Gdrl, state: DiffusionState, led: Ledger, snap: Snapshot,
                   total: int) -> tuple[DiffusionState, Ledger, list[Envelope]]:
    """A share nobody holds: after a restart of every node (or of a node and its best friend)
    no live node inherited the rejoiners' shares, and they would wait for returns nobody
    owes (the whole class held 1 % of its limit).  A rejoiner still short of its share asks
    every founder that is up, every tick until each has answered; one that holds none of it
    (``_holds_share_of``) says so, and once every one has, the rejoiner takes its share (with
    those it found down behind it) itself.  Every founder, not only its best friend: when a
    node and its best friend were down together, the next one up holds both shares, and
    the best friend, back as well, cannot know it (it answered for a share still held, and
    the live nodes held 7/6 of C until the holder's return was paid).  A return arriving
    later is dropped by _credit_return's cap: below C, never above."""
    genesis, me, dead = state.genesis, state.node_id, alloc.dead_after_s
    out: list[Envelope] = []
    for env in snap.inbox:
        body = env.body
        if not isinstance(body, Report) or body.consumed != 0 or env.src not in genesis:
            continue
        if body.free == ASK_SHARE and not _holds_share_of(state, led, env.src, snap, dead):
            out.append(Envelope(Report(consumed=0, free=NOTHING_HELD), dst=env.src))
        elif body.free == NOTHING_HELD and state.rejoined:
            state = dataclasses.replace(state, cleared=state.cleared | {env.src})
    expected = sum(share(total, genesis, m) for m in {me} | led.elsewhere)
    if state.rejoined and state.returned < expected:
        asked = [m for m in genesis if m != me and m not in state.cleared and not is_down(snap.view, m, dead)]
        if asked:
            out += [Envelope(Report(consumed=0, free=ASK_SHARE), dst=m) for m in asked]
        else:
            state, led = _credit_return(state, led, expected - state.returned, total)
    return state, led, out


def _holds_share_of(state: DiffusionState, led: Ledger, node: str, snap: Snapshot, dead_after_s: float) -> bool:
    """Whether we hold (or may yet return) some of ``node``'s share: we claimed it or owe it;
    or we are its best friend and saw an earlier life of it end (we claim and return that
    life's share as usual) or started with it down behind us (our own best friend may
    hold it)."""
    if node in led.claimed | led.owed:
        return True
    return heir(state.genesis, node, snap.view, dead_after_s, state.node_id) == state.node_id \
        and node in state.known_lives | state.started_elsewhere


def _credit_return(state: DiffusionState, led: Ledger, returned: int,
                   total: int) -> tuple[DiffusionState, Ledger]:
    """A rejoiner credits what comes back up to its own share plus those it found down
    behind it at start (``elsewhere``), which are its to hold once they are in; any
    other node has nothing owed to it, so a return reaching it (a netsplit mistaken
    for a restart) is dropped: capacity lost, never created."""
    if not state.rejoined or returned <= 0:
        return state, led
    expected = sum(share(total, state.genesis, m) for m in {state.node_id} | led.elsewhere)
    credit = min(returned, expected - state.returned)
    if credit <= 0:
        return state, led
    led = dataclasses.replace(led, holding=led.holding + credit)
    if state.returned + credit == expected:
        led = dataclasses.replace(led, claimed=led.claimed | led.elsewhere, elsewhere=frozenset())
    return dataclasses.replace(state, returned=state.returned + credit), led


def _bound(degree: int) -> float:
    return 1.0 / (2 * max(1, degree))


def _pairwise_amount(usable: int, snap: Snapshot, peer: str, q_own: float, gain_Bps: float,
                     part_Bps: float) -> int:
    """The edge term eta * slope * (q_j - q_i) in parts (of ``part_Bps`` each), paid by this
    node when positive and never more than it may use (so no limit goes negative)."""
    if not is_alive(snap.view, peer) or part_Bps <= 0:
        return 0
    diff = snap.view.peers[peer].value - q_own
    if diff <= 0:
        return 0
    return max(0, min(usable, int(gain_Bps * diff / part_Bps)))
