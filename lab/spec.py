"""The experiment: hosts, links, traffic and schedule, as data (lab/reader.py reads the TOML).

    >>> from drl.lab.reader import load
    >>> exp = load("lab/experiments/baseline.toml")
    >>> exp.global_Bps, [t.src for t in exp.traffic]
    (1250000.0, ['l1', 'l2'])

docs/lab.md has an annotated example of every field.  Everything here is
pure: an Experiment needs no root and builds nothing; what a run needs of
the machine is checked by lab/preflight.py.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field

ROLES = ("limiter", "router", "source", "sink")
KINDS = ("tcp", "udp", "web")
REFERENCE = "ctb"  # the centralized token bucket every experiment compares against (§4)


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    rate_Bps: float | None = None   # TBF shaping on both ends (None: unshaped veth)
    delay_s: float | None = None    # one-way, each direction: the link adds 2 x delay to an RTT
    loss_pct: float | None = None   # independent drop probability, each direction
    jitter_s: float | None = None   # uniform +- on each frame's delay (frames may then reorder)

    @property
    def ends(self) -> tuple[str, str]:
        return (self.a, self.b)

    @property
    def impaired(self) -> bool:
        """Whether it asks for delay, jitter or loss: netem where the kernel has it, else the
        project's delay line (lab/delay.py)."""
        return bool(self.delay_s or self.jitter_s or self.loss_pct)


@dataclass(frozen=True)
class Traffic:
    """One traffic group: ``flows`` parallel TCP/UDP flows, or one web workload, from ``src`` to the sink."""
    kind: str
    src: str
    start_s: float
    stop_s: float
    flows: int = 1
    rate_Bps: float | None = None      # udp: per flow
    arrivals_per_s: float = 0.0        # web: Poisson request rate
    mean_size: int = 0                 # web: mean object size (Pareto, capped at max_size)
    shape: float = 1.2                 # web: Pareto shape alpha (heavy tail for alpha < 2)
    max_size: int = 0
    congestion_control: str | None = None   # tcp: this group's algorithm; None: the experiment's


@dataclass(frozen=True)
class LinkEvent:
    """At ``at_s`` the link's shaping becomes ``rate_Bps``: an upstream bottleneck appears."""
    at_s: float
    link: tuple[str, str]
    rate_Bps: float


FAULT_ACTIONS = ("kill", "stop", "cont", "restart", "recreate", "replay", "kill-loop", "loss", "partition", "heal")
AGENT_ACTIONS = ("kill", "stop", "cont", "restart", "recreate", "replay", "kill-loop")   # they name an `agent`
LOSS_ON = ("gossip", "data")
DIRECTIONS = ("in", "out")   # a one-way gossip loss: what `agent` receives, or what it sends
REPLAY_COUNT = 100           # replay: how many captured datagrams it sends, by default
CHECKS = ("max_window_ratio", "recovery_s", "max_envelope_ratio")   # lab/results.py evaluates them
RUN_CHECKS = ("max_envelope_ratio",)   # also checked over the whole run when in [checks]
FAULT_HORIZON_S = 5.0   # default: a fault's worst window is looked for in this long after it


@dataclass(frozen=True)
class Fault:
    """At ``at_s``, something breaks (or is repaired); lab/faults.py applies it, lab/results.py
    measures the worst 1-s window in ``horizon_s`` after it and the time until the limit is used again.

    kill/stop/cont/restart: ``agent``'s process gets SIGKILL/SIGSTOP/SIGCONT, or is started again.
    recreate: ``agent``'s data interface toward the sink is deleted and made again (both ends,
    addresses, routes).  replay: gossip datagrams captured arriving at ``agent`` before its
    current life (at most ``count``) are sent to it again from their senders' addresses.
    kill-loop: ``agent`` is killed and started again every ``every_s`` for ``for_s``.
    loss: ``percent`` % of the packets ``on`` the gossip (control) network or the data links of
    ``hosts`` are dropped, or with a ``direction`` only the gossip ``agent`` receives ("in") or
    sends ("out") (a later loss on the same network replaces it); partition: the control
    network is cut between ``groups``; heal: every loss and partition is removed."""
    at_s: float
    action: str
    agent: str | None = None
    percent: int | None = None
    on: str | None = None
    direction: str | None = None                      # loss: one agent's gossip, one way
    every_s: float | None = None                      # kill-loop: the period
    for_s: float | None = None                        # kill-loop: how long it lasts
    count: int | None = None                          # replay: at most this many datagrams
    hosts: tuple[str, ...] = ()                      # loss: whose links (gossip: agents; data: any host)
    groups: tuple[tuple[str, ...], ...] = ()          # partition: complete, disjoint groups of limiters
    horizon_s: float = FAULT_HORIZON_S
    checks: dict[str, float] = field(default_factory=dict)   # [checks] merged with the fault's own
    index: int = 0                                   # its place among the file's [[fault]]s (for errors)

    @property
    def label(self) -> str:
        """``kill l3``, ``loss 30% gossip``, ``partition l1,l2|l3``: for progress lines and plots."""
        if self.action == "kill-loop":
            return f"kill-loop {self.agent} every {self.every_s:g}s for {self.for_s:g}s"
        if self.action in AGENT_ACTIONS:
            return f"{self.action} {self.agent}"
        if self.action == "loss" and self.direction:
            return f"loss {self.percent}% gossip {self.direction} ({self.agent})"
        if self.action == "loss":
            return f"loss {self.percent}% {self.on}" + (f" ({','.join(self.hosts)})" if self.hosts else "")
        if self.action == "partition":
            return "partition " + "|".join(",".join(g) for g in self.groups)
        return self.action


ATTACK_KINDS = ("lying_summer", "huge_partial", "forged_limit", "clients", "foreign_filter", "flood")
ATTACK_AFTER_S = 3.0     # default: how long after an attack stops its aftermath is judged
ATTACK_WITHIN_S = 10.0   # default: how soon an attack's own check must hold (lab/attacks.py)


@dataclass(frozen=True)
class Attack:
    """From ``at_s`` for ``duration_s``, an attacker works on ``agent`` (lab/attacks.py, one
    function a kind); lab/results.py judges every window against G x T + D during it and for
    ``after_s`` after it, and the kind's own check must hold within ``within_s``.

    lying_summer: ``agent``'s chosen summer, from its address, says TOTAL = 0 over 2^20 nodes.
    huge_partial: a member that sums nothing sends ``agent`` a PARTIAL of 1e300.
    forged_limit: a peer's address tells every agent a 1-Tbit/s limit at version 2^63 - 3;
    at the end the operator's ``drlctl set`` (the same global) on ``agent`` must reach all.
    clients: ``clients`` distinct addresses, 4 datagrams each, leave ``agent``'s data link.
    foreign_filter: a u32 filter that classifies everything at pref 10 on ``agent``'s data
    link; drl's must be ahead of it again; it is deleted at the end.
    flood: random datagrams at up to ``rate_pps`` from a peer's address to ``agent``'s gossip port."""
    at_s: float
    kind: str
    duration_s: float
    agent: str
    after_s: float = ATTACK_AFTER_S
    within_s: float = ATTACK_WITHIN_S
    rate_pps: int = 150_000          # flood
    clients: int = 200_000           # clients
    index: int = 0

    @property
    def label(self) -> str:
        return f"{self.kind} {self.agent}"


@dataclass(frozen=True)
class Matrix:
    """``[matrix]``: the experiment run once a cell, splits x congestion control x enforcement
    (lab/matrix.py); the bounds are checked in every cell, None = not checked."""
    splits: tuple[tuple[int, ...], ...]
    congestion_control: tuple[str, ...]
    enforce: tuple[str, ...]                 # "default" (the agent's choice), "shape" or "police"
    max_share_error: float | None = None
    min_jain: float | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    global_Bps: float
    duration_s: float
    warmup_s: float
    allocators: tuple[str, ...]
    repeat: int
    hosts: dict[str, str]                       # name -> role, in file order
    links: tuple[Link, ...]
    traffic: tuple[Traffic, ...]
    events: tuple[LinkEvent, ...] = ()
    agent: dict[str, str] = field(default_factory=dict)               # option -> text
    params: dict[str, dict[str, str]] = field(default_factory=dict)   # allocator -> overrides
    rto_min_s: float | None = None              # TCP's minimum RTO on every host's routes
    congestion_control: str | None = None       # the TCP groups' algorithm; None: the machine's
    faults: tuple[Fault, ...] = ()              # in time order (file order among equal times)
    checks: dict[str, float] = field(default_factory=dict)   # [checks] of RUN_CHECKS: over the whole run
    matrix: Matrix | None = None                # [matrix]: run once a cell (lab/matrix.py)
    attacks: tuple[Attack, ...] = ()            # [[attack]]: in time order, none overlapping (lab/attacks.py)
    path: str = ""

    # -- the graph (hosts and links) -------------------------------------------------
    def of_role(self, role: str) -> list[str]:
        return [h for h, r in self.hosts.items() if r == role]

    @property
    def sink(self) -> str:
        return self.of_role("sink")[0]

    @property
    def limiters(self) -> list[str]:
        return self.of_role("limiter")

    def neighbours(self, host: str) -> list[str]:
        return [l.b if l.a == host else l.a for l in self.links if host in l.ends]

    def route(self, src: str, dst: str) -> list[str]:
        """Hosts on the shortest path src..dst (BFS, first listed link wins ties); [] if unreachable."""
        parent: dict[str, str | None] = {src: None}
        queue = collections.deque([src])
        while queue:
            here = queue.popleft()
            for nxt in self.neighbours(here):
                if nxt not in parent:
                    parent[nxt] = here
                    queue.append(nxt)
        if dst not in parent:
            return []
        hops, node = [], dst
        while node is not None:
            hops.append(node)
            node = parent[node]
        return hops[::-1]

    def limiter_of(self, src: str) -> str:
        """The one limiter a flow from ``src`` crosses on its way to the sink (checked at load)."""
        return next(h for h in self.route(src, self.sink) if self.hosts[h] == "limiter")

    def agent_options(self, allocator: str) -> dict[str, str]:
        return {**self.agent, **self.params.get(allocator, {})}

    def scaled(self, duration_s: float) -> "Experiment":
        """The same experiment squeezed (or stretched) to ``duration_s``: every time scales alike,
        so a flow that joins every 10 s of 50 joins every 2 s of 10 (`drl-lab run --duration`)."""
        k = duration_s / self.duration_s
        return dataclasses.replace(
            self, duration_s=duration_s, warmup_s=self.warmup_s * k,
            traffic=tuple(dataclasses.replace(t, start_s=t.start_s * k, stop_s=t.stop_s * k) for t in self.traffic),
            events=tuple(dataclasses.replace(e, at_s=e.at_s * k) for e in self.events),
            faults=tuple(dataclasses.replace(f, at_s=f.at_s * k, for_s=f.for_s and f.for_s * k) for f in self.faults),
            attacks=tuple(dataclasses.replace(a, at_s=a.at_s * k, duration_s=a.duration_s * k, after_s=a.after_s * k)
                          for a in self.attacks))
