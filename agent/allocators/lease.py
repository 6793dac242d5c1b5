"""Leases: lease servers hand out capacity that expires ([RLDesign],
the Doorman-style "capacity lease").

    >>> from drl.agent.allocators import create
    >>> alloc = create("lease", on_lease_loss="safe", ttl_s=5.0, refresh_s=1.0)
    >>> state = alloc.initial_state("n2", ("n1", "n2", "n3"))   # n1 serves, n2 asks

* Servers (``servers``, default the lowest member id) each own an equal slice
  of the global limit.  A client asks its server (members spread over the
  servers in order; the next alive server when its own is dead) with a
  LeaseRequest for its demand every ``refresh_s``.
* A server divides its slice max-min fairly among the clients that asked
  within ``ttl_s`` (itself included), spreads what nobody asked for equally,
  and grants ``min(fair share, slice - what the others still hold)``.  A grant
  counts until ``ttl_s`` plus two ticks after it was issued (the client starts
  its own ``ttl_s`` on receipt, up to a tick later), and a smaller renewal does
  not release a larger grant early, so the unexpired grants never add up to
  more than the slice.
* A client that holds no valid lease (never granted, or expired because its
  server is unreachable) applies ``on_lease_loss`` ([RLDesign] "Optimistic,
  pessimistic and safe mode"): ``pessimistic`` 0, ``optimistic`` all it asked
  for, ``safe`` ``safe_Bps`` if set, else global/N.
* Membership: servers and the client spread are taken from the *current*
  ``view.members`` every tick, so a joiner asks a server from its first tick,
  a leaver's grants simply expire, and global/N (``safe``) follows N.  The
  default server is the lowest current member id; a configured server that
  left the members serves no more, and the slices are re-cut over those
  present.  Grants already out when the slices change still count until they
  expire (at most ``ttl_s``), so during that time the sum of leases may
  exceed the limit by what the old slices granted beyond the new ones.
* Hard limit: a token bucket at the lease (Mode BUCKET drops above it), and
  ``info["warning"]`` says so while demand is above it.  Soft limit ([RLDesign] "Hard
  limit vs Soft limit"): a server whose clients ask for more than
  ``soft_fraction`` of its slice warns in its ``info["warning"]`` before
  anyone is cut.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from drl.agent.model import Decision, Envelope, LeaseGrant, LeaseRequest, Mode, Snapshot, Step
from .common import ParameterError, check_range
from .transfer import is_alive

LOSS_MODES = ("pessimistic", "optimistic", "safe")


@dataclass(frozen=True)
class LeaseState:
    node_id: str
    members: tuple[str, ...]
    lease_Bps: float = 0.0
    expires_at: float | None = None        # None: never granted
    asked_Bps: float = 0.0
    next_request_at: float = 0.0
    requests: Mapping[str, tuple[float, float]] = field(default_factory=dict)   # server: client -> (want, at)
    grants: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)  # client -> (cap, until)


@dataclass(frozen=True)
class Lease:
    name: ClassVar[str] = "lease"
    needs_member_ids: ClassVar[bool] = True    # state depends on who the members are
    servers: tuple[str, ...] | str = ()
    ttl_s: float = 5.0
    refresh_s: float = 1.0
    on_lease_loss: str = "safe"
    safe_Bps: float = 0.0                  # 0: global / N
    soft_fraction: float = 0.9

    def __post_init__(self) -> None:
        if isinstance(self.servers, str):   # "n1,n2" from a command line
            object.__setattr__(self, "servers", tuple(s for s in self.servers.split(",") if s))
        if self.on_lease_loss not in LOSS_MODES:
            raise ParameterError(f"on_lease_loss must be one of {', '.join(LOSS_MODES)}, got {self.on_lease_loss!r}")
        check_range("ttl_s", self.ttl_s, 0.0, float("inf"), low_open=True)
        check_range("refresh_s", self.refresh_s, 0.0, self.ttl_s, low_open=True)
        check_range("safe_Bps", self.safe_Bps, 0.0, float("inf"))
        check_range("soft_fraction", self.soft_fraction, 0.0, 1.0, low_open=True)

    def _servers(self, members: tuple[str, ...]) -> tuple[str, ...]:
        """The configured servers that are members (the lowest member if none is)."""
        present = tuple(s for s in self.servers if s in members)
        return present or members[:1]

    def initial_state(self, node_id: str, members: tuple[str, ...]) -> LeaseState:
        members = tuple(sorted(members))
        unknown = set(self.servers) - set(members)      # a typo, caught at start
        if unknown:
            raise ParameterError(f"lease servers {', '.join(sorted(unknown))} are not members")
        return LeaseState(node_id=node_id, members=members)

    def step(self, state: LeaseState, snap: Snapshot) -> Step:
        state = dataclasses.replace(state, members=snap.view.members)
        servers = self._servers(state.members)
        if state.node_id in servers:
            st, out = self._serve(state, snap, len(servers))
        else:
            st, out = self._ask(state, snap, servers)
        return Step(state=st, decision=self._decide(st, snap), outbox=tuple(out))

    # --- client side -----------------------------------------------------------------------

    def _ask(self, st: LeaseState, snap: Snapshot, servers: tuple[str, ...]) -> tuple[LeaseState, list[Envelope]]:
        for env in snap.inbox:
            if isinstance(env.body, LeaseGrant):
                st = dataclasses.replace(st, lease_Bps=env.body.capacity_Bps, expires_at=snap.now + env.body.ttl_s,
                                         next_request_at=snap.now + env.body.refresh_s)
        server = _my_server(st, snap, servers)
        if snap.now < st.next_request_at or server is None:
            return st, []
        want = snap.local.demand_Bps
        # Until a grant answers, ask again every refresh_s.
        st = dataclasses.replace(st, asked_Bps=want, next_request_at=snap.now + self.refresh_s)
        return st, [Envelope(LeaseRequest(want_Bps=want), dst=server)]

    # --- server side -----------------------------------------------------------------------

    def _serve(self, st: LeaseState, snap: Snapshot, n_servers: int) -> tuple[LeaseState, list[Envelope]]:
        # what stale peers' datapaths may still pass (a dead client at its fail-safe) is no one's to grant
        now, pool = snap.now, max(0.0, snap.global_Bps - (snap.view.reserved_Bps or 0.0)) / n_servers
        requests = {c: r for c, r in st.requests.items() if now - r[1] <= self.ttl_s}
        asking = [env.src for env in snap.inbox if isinstance(env.body, LeaseRequest)]
        for env in snap.inbox:
            if isinstance(env.body, LeaseRequest):
                requests[env.src] = (max(0.0, env.body.want_Bps), now)
        requests[st.node_id] = (snap.local.demand_Bps, now)
        fair = _fair_shares(pool, {c: want for c, (want, _) in requests.items()})
        grants = {c: tuple(g for g in gs if g[1] > now) for c, gs in st.grants.items()}
        grants = {c: gs for c, gs in grants.items() if gs}
        until = now + self.ttl_s + 2 * snap.interval_s
        out = []
        for client in [st.node_id] + sorted(set(asking)):
            others = sum(_held(gs) for c, gs in grants.items() if c != client)
            cap = max(0.0, min(fair[client], pool - others))
            if client == st.node_id:   # its own lease needs no message, so it is replaced, not added
                grants[client] = ((cap, until),)
                continue
            grants[client] = grants.get(client, ()) + ((cap, until),)
            out.append(Envelope(LeaseGrant(capacity_Bps=cap, ttl_s=self.ttl_s, refresh_s=self.refresh_s), dst=client))
        own = grants[st.node_id][0][0]
        st = dataclasses.replace(st, requests=requests, grants=grants, lease_Bps=own, expires_at=until,
                                 asked_Bps=snap.local.demand_Bps)
        return st, out

    # --- both ------------------------------------------------------------------------------

    def _decide(self, st: LeaseState, snap: Snapshot) -> Decision:
        valid = st.expires_at is not None and snap.now < st.expires_at
        limit = st.lease_Bps if valid else self._fallback(st, snap)
        info: dict[str, Any] = {"lease_state": "valid" if valid else ("expired" if st.expires_at else "none"),
                                "lease_Bps": st.lease_Bps, "limit_Bps": limit, "asked_Bps": st.asked_Bps,
                                "lease_expires_in_s": None if st.expires_at is None else st.expires_at - snap.now,
                                "on_lease_loss": self.on_lease_loss}
        if st.grants:
            info["outstanding_Bps"] = sum(_held(gs) for gs in st.grants.values())
            info["clients"] = len(st.grants)
            wanted = sum(want for want, _ in st.requests.values())
            if wanted > self.soft_fraction * snap.global_Bps / len(self._servers(st.members)):
                info["warning"] = f"soft limit: clients ask {wanted:.0f} B/s, above {self.soft_fraction:g} of the pool"
        if snap.local.demand_Bps > limit:
            info["warning"] = f"hard limit: demand {snap.local.demand_Bps:.0f} B/s above {limit:.0f} B/s, excess dropped"
        return Decision(mode=Mode.BUCKET, limit_Bps=limit, publish=snap.local.demand_Bps, info=info)

    def _fallback(self, st: LeaseState, snap: Snapshot) -> float:
        if self.on_lease_loss == "pessimistic":
            return 0.0
        if self.on_lease_loss == "optimistic":
            return st.asked_Bps
        return self.safe_Bps or snap.global_Bps / max(1, snap.view.n_nodes)


def _my_server(st: LeaseState, snap: Snapshot, servers: tuple[str, ...]) -> str | None:
    """Members spread over the servers in order; the next alive one if ours is dead."""
    first = st.members.index(st.node_id) % len(servers)
    for k in range(len(servers)):
        server = servers[(first + k) % len(servers)]
        if is_alive(snap.view, server):
            return server
    return None


def _held(grants: tuple[tuple[float, float], ...]) -> float:
    """What a client may still be using: the largest of its unexpired grants."""
    return max((cap for cap, _ in grants), default=0.0)


def _fair_shares(pool: float, wants: dict[str, float]) -> dict[str, float]:
    """Max-min fair (water-filling) shares of ``pool``; what nobody wants is split equally."""
    shares, left, todo = {}, pool, sorted(wants, key=lambda c: wants[c])
    while todo:
        level = left / len(todo)
        client = todo[0]
        if wants[client] > level:
            break
        shares[client] = wants[client]
        left -= wants[client]
        todo.pop(0)
    for client in todo:
        shares[client] = left / len(todo)
    spare = pool - sum(shares.values())
    return {c: s + spare / len(wants) for c, s in shares.items()}
