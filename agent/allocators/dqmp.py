"""DQMP: a global byte volume quota (e.g. ``--quota 10TB/30d``) whose free part
diffuses between neighbours ([Behl12]).

    >>> from drl.agent.allocators import create
    >>> alloc = create("dqmp", quota_bytes=10 * 10**12, period_s=30 * 86400.0)
    >>> state = alloc.initial_state("n1", ("n1", "n2", "n3"))

* Quota manager: the lowest member id (or ``manager``) starts with the whole
  quota; everyone else starts empty and diffusion spreads it ([Behl12] §4.2
  "Quota Balancing").  It is the root of the level tree (levels = hops from
  it over live nodes, uplink = a neighbour one level up, [Behl12] Fig. 3/4).
* Local grant: each tick the node tops its datapath allowance
  (``Decision.quota_bytes``) up to ``grant_ticks`` ticks of demand out of its
  free quota, with no message ([Behl12] §5.1: local grants < 0.2 ms).  Granted
  bytes count as consumed.
* Balancing: a node richer than a neighbour by more than ``unit_bytes`` gives
  it ceil((q_i - q_j)/2) ([Behl12] §4.1), neighbours one after the other with the
  free quota left (Fig. 5), one transfer in flight per link (a balance is one
  round trip, §4.2).  Smaller differences move with probability
  ``migrate_p`` (probabilistic migration, §4.1) so no gradient stays stuck.
* Consumed quota goes up the uplink as a Report; the link counters on both
  sides move by it, so a crash never hands consumed quota out again (§4.3).
* A neighbour dead for ``dead_after_s`` is settled from its link counter
  (Fig. 6).  Links to the manager are *initial links* and never settled: the
  manager is restored from its snapshot instead (:func:`to_dict`,
  :func:`from_dict`; the daemon must write the snapshot after ``step`` and
  before sending its outbox, so a restored manager has sent nothing it does
  not know of).
* Period: every ``period_s`` the manager frees again what the tree reported
  consumed in that period, so usage is per period and the quota is never
  exceeded: free + consumed + in flight == ``quota_bytes`` at every step
  (:func:`accountable`).  Consumption a node granted but had not yet
  reported when it crashed is forgotten by the others (DQMP's limit too).

Membership ([Behl12] §4.3 keeps it in a node registry; here the PeerView is
that registry, followed every tick by transfer.follow_members):

* The graph and the level tree are built over the current ``view.members``,
  so every node that sees the same members uses the same graph.  Links opened
  earlier stay open until their peer goes.
* Join: a new member starts with no free quota (only the manager ever starts
  with any) and its neighbours balance quota to it.  The manager is fixed
  when a node starts: set ``manager`` in a cluster whose members change, or
  a new member with a lower id would take itself for the manager.
* Leave: a member gone from the members is settled at once from its link
  counters, as a crash is after ``dead_after_s`` (Fig. 6).  A non-manager's
  quota all came over links, so its neighbours' counters take back exactly
  what it held.
* Rejoin: a non-manager restarts empty (``load_state`` discards its old
  ledger, whose quota its neighbours take back); its neighbours settle what
  was open with its old life (a new incarnation) and open fresh links.  The
  manager is restored with its links and is never settled.

Mode PASS with the byte allowance, or BUCKET at ``rate_Bps`` as well when set.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Mapping

from drl.agent.model import Decision, Envelope, Mode, PeerView, Snapshot, Step
from .common import check_range
from .graph import Graph, bfs_levels
from .transfer import (Ledger, follow_members, has_failed, is_alive, ledger_from_dict, ledger_to_dict, link_info,
                       note_lives, receive, report, retransmit, send, settle_failed)

_REPORT_EVERY = 5   # rounds between repeats of an unchanged cumulative report (covers lost ones)


@dataclass(frozen=True)
class DqmpState:
    node_id: str
    manager: str
    members: tuple[str, ...]
    neighbours: tuple[str, ...]
    ledger: Ledger | None = None
    consumed: int = 0            # consumed here or reported from below, not yet passed up (Table 1)
    granted_total: int = 0       # bytes ever granted to this node's datapath
    period_used: int = 0         # manager only: consumption reported in this period
    period_start: float | None = None
    rounds: int = 0


@dataclass(frozen=True)
class Dqmp:
    name: ClassVar[str] = "dqmp"
    needs_member_ids: ClassVar[bool] = True    # state depends on who the members are
    genesis_shares: ClassVar[bool] = True      # the founders name the manager: one list for all
    quota_bytes: int = 10**12
    period_s: float = 30 * 86400.0
    manager: str = ""              # "": the lowest member id
    graph: str = "regular"
    degree: int = 6                # [Behl12] §5: at most 6 neighbours
    seed: int = 0
    unit_bytes: int = 1_000_000    # differences up to one unit are not balanced
    migrate_p: float = 0.1
    grant_ticks: float = 2.0
    rate_Bps: float = 0.0          # > 0: also a token bucket at this rate
    dead_after_s: float = 30.0

    def __post_init__(self) -> None:
        check_range("quota_bytes", self.quota_bytes, 0, float("inf"))
        check_range("period_s", self.period_s, 0.0, float("inf"), low_open=True)
        check_range("unit_bytes", self.unit_bytes, 1, float("inf"))
        check_range("migrate_p", self.migrate_p, 0.0, 1.0)
        check_range("grant_ticks", self.grant_ticks, 0.0, float("inf"))
        check_range("rate_Bps", self.rate_Bps, 0.0, float("inf"))

    def _topology(self, n: int) -> Graph:
        # A small cluster cannot have 6 neighbours each: use the densest graph it can.
        degree = min(self.degree, n - 1)
        if (n * degree) % 2:
            degree -= 1
        return Graph(kind=self.graph, degree=degree, seed=self.seed) if degree >= 2 else Graph()

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> DqmpState:
        members = tuple(sorted(members))
        return DqmpState(node_id=node_id, manager=self.manager or members[0], members=members,
                         neighbours=self._neighbours(node_id, members))

    def _neighbours(self, node_id: str, members: tuple[str, ...]) -> tuple[str, ...]:
        return self._topology(len(members)).neighbours(node_id, members)

    def step(self, state: DqmpState, snap: Snapshot) -> Step:
        is_manager = state.node_id == state.manager
        led = state.ledger or Ledger(holding=int(self.quota_bytes) if is_manager else 0)
        st = _follow(self, dataclasses.replace(state, period_start=_first(state.period_start, snap.now)),
                     snap.view)
        led, _ = follow_members(led, snap.view, keep=(state.manager,))
        st = dataclasses.replace(st, ledger=led)
        led, acks, consumed_in = receive(led, snap.inbox)
        led = settle_failed(led, snap.view, self.dead_after_s, keep=(state.manager,))
        st = dataclasses.replace(st, ledger=led, consumed=st.consumed + consumed_in)
        st = self._grant(st, snap)
        if is_manager:
            st = self._close_period(st, snap.now)
        level, uplink = _tree(st, snap.view, self)
        st, reports = self._report_up(st, snap, uplink)
        st, transfers, sent_to = self._balance(st, snap)
        out = acks + reports + transfers + retransmit(st.ledger, sent_to, snap.view)
        # links opened this tick get their peer's life, so its restart next tick is seen
        st = dataclasses.replace(st, ledger=note_lives(st.ledger, snap.view))
        allowance = max(0, st.granted_total - snap.local.sent_total_bytes)
        decision = Decision(mode=Mode.BUCKET if self.rate_Bps > 0 else Mode.PASS, limit_Bps=self.rate_Bps,
                            publish=float(st.ledger.holding), quota_bytes=allowance,
                            info=self._info(st, snap, allowance, level, uplink))
        return Step(state=dataclasses.replace(st, rounds=st.rounds + 1), decision=decision, outbox=out)

    # The agent keeps a snapshot of any allocator that has these two (agent/service/daemon.py).
    def dump_state(self, state: DqmpState) -> dict[str, Any]:
        return to_dict(state)

    def load_state(self, data: Mapping[str, Any]) -> DqmpState:
        """The manager resumes from its snapshot; any other node restarts empty, as its
        neighbours take back what it held when they see it restart or leave."""
        state = from_dict(data)
        if state.node_id == state.manager:
            return state
        return self.initial_state(state.node_id, state.members)

    def _grant(self, st: DqmpState, snap: Snapshot) -> DqmpState:
        """The local grant: top the allowance up from free quota, no message needed."""
        want = math.ceil(snap.local.demand_Bps * snap.interval_s * self.grant_ticks)
        left = st.granted_total - snap.local.sent_total_bytes
        grant = max(0, min(st.ledger.holding, want - left))
        if grant == 0:
            return st
        led = dataclasses.replace(st.ledger, holding=st.ledger.holding - grant)
        return dataclasses.replace(st, ledger=led, granted_total=st.granted_total + grant,
                                   consumed=st.consumed + grant)

    def _close_period(self, st: DqmpState, now: float) -> DqmpState:
        """At the manager: what was consumed in the ended period(s) becomes free again.
        Reports from below reach the root here; it has no uplink to pass them to."""
        used = st.period_used + st.consumed
        ended = int((now - st.period_start) // self.period_s)
        if ended <= 0:
            return dataclasses.replace(st, consumed=0, period_used=used)
        led = dataclasses.replace(st.ledger, holding=st.ledger.holding + used)
        return dataclasses.replace(st, ledger=led, consumed=0, period_used=0,
                                   period_start=st.period_start + ended * self.period_s)

    def _report_up(self, st: DqmpState, snap: Snapshot, uplink: str | None) -> tuple[DqmpState, tuple[Envelope, ...]]:
        if uplink is None or not is_alive(snap.view, uplink):
            return st, ()
        link = st.ledger.links.get(uplink)
        repeat = link is not None and link.rep_sent > 0 and st.rounds % _REPORT_EVERY == 0
        if st.consumed == 0 and not repeat:
            return st, ()
        led, env = report(st.ledger, uplink, st.consumed, st.ledger.holding)
        return dataclasses.replace(st, ledger=led, consumed=0), (env,)

    def _balance(self, st: DqmpState, snap: Snapshot) -> tuple[DqmpState, tuple[Envelope, ...], list[str]]:
        led, out, sent_to = st.ledger, [], []
        for peer in sorted((set(st.neighbours) | set(led.links)) - led.closed):
            link = led.links.get(peer)
            if not is_alive(snap.view, peer) or (link is not None and link.unacked):
                continue
            amount = self._move(led.holding, snap.view.peers[peer].value, st, peer)
            if amount > 0:
                led, env = send(led, peer, amount)
                out.append(env)
                sent_to.append(peer)
        return dataclasses.replace(st, ledger=led), tuple(out), sent_to

    def _move(self, free: int, peer_free: float, st: DqmpState, peer: str) -> int:
        diff = free - int(peer_free)
        if diff > self.unit_bytes:
            return math.ceil(diff / 2)                     # [Behl12] §4.1
        if diff > 0 and _coin(self.seed, st.node_id, peer, st.rounds) < self.migrate_p:
            return diff                                    # probabilistic migration, [Behl12] §4.1
        return 0

    def _info(self, st: DqmpState, snap: Snapshot, allowance: int, level: int | None,
              uplink: str | None) -> dict[str, Any]:
        return {"manager": st.manager, "level": level, "uplink": uplink,
                "free_bytes": st.ledger.holding, "allowance_bytes": allowance, "consumed_unreported": st.consumed,
                "granted_total": st.granted_total, "period_used_bytes": st.period_used,
                "accountable_bytes": accountable(st), "neighbours": link_info(st.ledger, snap.view)}


def _follow(alloc: Dqmp, st: DqmpState, view: PeerView) -> DqmpState:
    """The graph over the current members (recomputed only when they change)."""
    if view.members == st.members:
        return st
    return dataclasses.replace(st, members=view.members, neighbours=alloc._neighbours(st.node_id, view.members))


def _tree(st: DqmpState, view: PeerView, alloc: Dqmp) -> tuple[int | None, str | None]:
    """(level, uplink) over the live part of the graph ([Behl12] §4.2; a new uplink
    after the old one failed, §4.3).  The manager counts as live: it is restored."""
    failed = frozenset(m for m in st.members if m != st.manager and has_failed(view, m, alloc.dead_after_s))
    levels = _levels(alloc, st.members, st.manager, failed)
    mine = levels.get(st.node_id)
    if not mine:
        return mine, None
    return mine, min((n for n in st.neighbours if levels.get(n) == mine - 1), default=None)


@lru_cache(maxsize=256)
def _levels(alloc: Dqmp, members: tuple[str, ...], manager: str, failed: frozenset[str]) -> dict[str, int]:
    # Cached: the tree only changes when the set of failed nodes does.
    adj = alloc._topology(len(members)).adjacency(members)
    return bfs_levels(manager, {m: [n for n in ns if n not in failed] for m, ns in adj.items() if m not in failed})


def _first(value: float | None, default: float) -> float:
    return default if value is None else value


def _coin(seed: int, node: str, peer: str, rounds: int) -> float:
    """A seeded draw that is a function of the state, so snapshots replay it."""
    return random.Random(f"{seed}:{node}:{peer}:{rounds}").random()


def accountable(st: DqmpState) -> int:
    """free + consumed not yet passed up + link counters (+ the manager's period
    usage); summed over all nodes it is the global quota (transfer.py)."""
    if st.ledger is None:
        return 0
    return st.ledger.accountable + st.consumed + st.period_used


def to_dict(st: DqmpState) -> dict[str, Any]:
    """The quota manager's (or any node's) state as JSON-able values ([Behl12] §4.3 snapshot)."""
    data = dataclasses.asdict(dataclasses.replace(st, ledger=None))
    data["members"], data["neighbours"] = list(st.members), list(st.neighbours)
    data["ledger"] = None if st.ledger is None else ledger_to_dict(st.ledger)
    return data


def from_dict(data: Mapping[str, Any]) -> DqmpState:
    fields = dict(data)
    fields["members"], fields["neighbours"] = tuple(data["members"]), tuple(data["neighbours"])
    fields["ledger"] = None if data["ledger"] is None else ledger_from_dict(data["ledger"])
    return DqmpState(**fields)
