"""Per-client throttle and rate-based ban, counted across all hosts: the pure core.

A class may carry one **client rule** ([RLDesign] "Throttling traffic",
"Banning clients based on request rates"): who the client is (the remote
address of egress packets, grouped by a prefix length), what is counted
(bytes, packets or new connections), a threshold (a count per sliding
window), and what happens above it (``throttle``: the client gets at most
the threshold, split between the hosts by demand; ``ban``: the client is cut
off for the rest of the window plus a ban duration).  A client that spreads
its load over many hosts is counted once, globally: every agent reports its
heavy clients, and sums what its peers report.

How the pieces fit (docs/clients.md has the whole design, kernel included)::

    rule = client_rule(parse_client_key("dst/24"), "bytes", parse_threshold("2mbit"), "throttle")
    table = ClientTable(rule, max_age_s=0.5, start_s=now)
    # every interval: the counter deltas the kernel counted per client prefix
    tick = table.tick(now, {rule.key.client_of("198.51.100.7"): 1500.0, ...}, n_hosts=3)
    tick.limits      # held and throttled clients -> this host's share (count per window)
    tick.throttled   # those of them over the threshold
    tick.bans        # banned clients -> until (seconds, the caller's clock)
    tick.report      # what to gossip: top-K heavy clients and ban notes
    # whenever a peer's report arrives
    table.receive("b", report, now)

Everything here is pure: time comes in as an argument, nothing touches a
socket, a map or the clock, so the agent and a simulator can run it alike.
The table is a mutable object for speed (100,000 clients per class), but its
methods depend on their arguments and its own state only.

**Held at the line.**  A client whose count here reaches the reporting line,
a quarter of a fair share of the threshold (``REPORT_FRACTION`` x threshold / N), is
held from then on: the kernel gives it a bucket at threshold / N the moment
its count crosses the line (a throttle rule's ``hold``), and each tick here
gives it its share of the threshold (:func:`throttle_share`), at most
threshold / N for its first ``YOUNG_TICKS`` ticks, while its peers' reports of
it are on their way.  A client spread over N hosts therefore passes at most
a quarter of its threshold before every host holds it, and the threshold from then
on: a new heavy client's first second stays within 1.25 x its threshold,
where waiting for the summed count to reach the threshold let 2.3-2.4 x pass
(the agent's tick comes after the client has passed it, at any class rate
well above the threshold).  The cost: a client on one host alone between
threshold / 4N and threshold / N is held at threshold / N for a tick or two,
and a held client's bursts are cut to its bucket's depth (docs/clients.md).
A held client is **throttled** (``drlctl clients`` state) once what a host
knows of it (its own sliding count plus its peers' fresh reports) reaches
the threshold, and stays so until that falls below ``RELEASE_FRACTION`` of
it; held but not throttled, it shows ``ok`` with its share.

The rules (``clients.rules``), the sliding windows (``clients.windows``) and the reports with
their size (``clients.reports``) live in their own modules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from drl.agent.clients.reports import MAX_BAN_NOTES, REPORT_K, BanNote, ClientReport
from drl.agent.clients.rules import Client, ClientRule, Network
from drl.agent.clients.windows import Windows


# Report and hold a client at a quarter of a fair share, threshold x 0.25 / N: the hosts pass
# at most that before they hold it (at 0.5 a new client spread over three hosts reached
# 1.48x its threshold in its first second, against 1.5 allowed: the bound, 1.5, nearly met).
REPORT_FRACTION = 0.25

# Throttle split: each host gets a floor of FLOOR_FRACTION x threshold / N, so a
# host where the client is new or quiet can still see its demand grow; the
# rest of the threshold goes in proportion to local demand.
FLOOR_FRACTION = 0.05
RELEASE_FRACTION = 0.5        # released below half the threshold: a throttled TCP flow dips under 0.9 (BBR: 1.5x the threshold)
YOUNG_TICKS = 2               # a new hold's share is at most threshold / N until the peers' reports of it are in


@dataclass(frozen=True)
class ClientTick:
    """What one tick decided for one class."""
    limits: Mapping[Client, float]      # held clients -> this host's share, count per window
    bans: Mapping[Client, float]        # banned clients -> until_s (the caller's clock)
    issued: tuple[Client, ...]          # bans this host issued on this tick
    report: ClientReport                # to gossip to every alive peer
    resets: frozenset[Client] = frozenset()   # clients whose count starts over (bans, unbans) since the last tick
    line: float = 0.0                   # the reporting line: a client counted at or above it is heavy
    hold: float = 0.0                   # what the kernel holds a client at from the line on (0: not held)
    throttled: frozenset[Client] = frozenset()   # held clients over the threshold


@dataclass(frozen=True)
class ClientRow:
    """One client as ``drlctl clients`` shows it; counts per window, in the measure's unit."""
    client: Network
    global_count: float
    local_count: float
    state: str                          # ok, throttled or banned
    share: float | None = None          # this host's share while throttled
    banned_until_s: float | None = None
    hosts: tuple[str, ...] = ()         # the nodes that count it, this one included


@dataclass
class _Peer:
    at_s: float                         # when its report arrived
    counts: dict[Client, float]


@dataclass
class _Ban:
    version: int
    until_s: float
    lifted: bool = False                # a tombstone: an older ban note must not bring the ban back
    announced_s: float = -math.inf      # last put in a report; the least recent go first

    def in_force(self, now_s: float) -> bool:
        return not self.lifted and self.until_s > now_s


def throttle_share(limit: float, local: float, total: float, n_hosts: int) -> float:
    """This host's share of a throttled client's limit: a floor of FLOOR_FRACTION x limit / N for
    every host, the rest in proportion to local demand ([Raghavan07] §3: local limits from local
    and global demand).  Over N hosts sharing one view (total = the sum of their demands) the
    shares add up to ``limit`` exactly."""
    if total <= 0:
        return limit / n_hosts
    floor = FLOOR_FRACTION * limit / n_hosts
    return floor + (limit - n_hosts * floor) * (local / total)


class ClientTable:
    """One class's clients: local sliding counts, peers' reports, throttled set and bans.

    Call :meth:`tick` once an interval with the counter deltas, :meth:`receive` with each peer's
    report, :meth:`unban` for ``drlctl unban``, :meth:`rows` for ``drlctl clients``.  A peer's
    report counts until ``max_age_s`` after it arrived (the membership's liveness timeout):
    then it counts 0, like a stale peer's value ([Raghavan07] §5.6)."""

    def __init__(self, rule: ClientRule, max_age_s: float, start_s: float, node_id: str = ""):
        self.rule, self.max_age_s, self.node_id = rule, max_age_s, node_id
        self._lengths = (rule.key.v4_len, rule.key.v6_len)
        self._windows = Windows(rule.window_s, start_s)
        self._peers: dict[str, _Peer] = {}
        self._limited: set[Client] = set()          # throttled: over the threshold
        self._held: dict[Client, int] = {}           # held -> ticks held
        self._bans: dict[Client, _Ban] = {}
        self._local: dict[Client, float] = {}       # this tick's counts of the clients that can matter
        self._heavy: set[Client] = set()             # at or above the reporting line
        self._n_hosts = 0                            # the N of the reporting line
        self._tick_s = start_s
        self._remote: dict[Client, float] = {}
        self._seen: dict[Client, list[str]] = {}
        self._shares: dict[Client, float] = {}
        self._resets: set[Client] = set()

    # -- input

    def tick(self, now_s: float, deltas: Mapping[Client, float], n_hosts: int) -> ClientTick:
        """One interval, the sliding windows kept here (a simulator, the tests): ``deltas`` are
        this host's counts per client since the previous tick; ``n_hosts`` the alive hosts, this
        one included."""
        self._expire(now_s)
        counted = self._countable(deltas, now_s)
        self._windows.add(now_s, counted)
        self._sum_peers(now_s)
        heavy = self._windows.counts(now_s, self._watched(counted, n_hosts), at_least=self.line(n_hosts))
        rest = self._windows.counts(now_s, (set(self._remote) | self._limited) - heavy.keys())
        return self._tick(now_s, {**rest, **heavy}, n_hosts)

    def tick_counts(self, now_s: float, counts: Mapping[Client, float], n_hosts: int) -> ClientTick:
        """One interval, the sliding windows kept elsewhere (the kernel, bpf/limiter.c): ``counts``
        are this host's sliding counts now, of at least the clients :meth:`wanted` names and every
        client newly at or above :meth:`line`; the agent's work grows with those, not with all
        the clients the kernel counts."""
        self._expire(now_s)
        self._sum_peers(now_s)
        return self._tick(now_s, {c: v for c, v in counts.items() if v > 0 and not self._banned(c, now_s)},
                          n_hosts)

    def line(self, n_hosts: int) -> float:
        """The reporting line: a quarter of a fair share of the threshold (REPORT_FRACTION / N)."""
        return REPORT_FRACTION * self.rule.limit / max(1, n_hosts)

    def hold(self, n_hosts: int) -> float:
        """What the kernel holds a client at from the line on, until a tick writes its share:
        a fair share of the threshold (a ban rule holds no one)."""
        return self.rule.limit / max(1, n_hosts) if self.rule.action == "throttle" else 0.0

    def wanted(self) -> set[Client]:
        """The clients whose counts the next :meth:`tick_counts` needs besides the newly heavy
        ones: counted last tick (until they fade to 0: the kernel flags a client once per window),
        reported by a peer, or throttled."""
        return set(self._local).union(self._remote, self._limited, self._held)

    def _tick(self, now_s: float, local: dict[Client, float], n_hosts: int) -> ClientTick:
        """Decide on this host's counts now: heavy ones, and those of peers' clients and throttled."""
        line = self.line(n_hosts)
        # The kernel never counts an exempt address; counts from elsewhere (a simulator) may hold
        # one: it is counted but never reported or limited, and checked here, on the few.
        self._heavy = {c for c, v in local.items() if v >= line and not self.rule.is_exempt(c)}
        self._local = local
        self._tick_s = now_s
        issued = self._decide(now_s, n_hosts)
        bans = {c: b.until_s for c, b in self._bans.items() if b.in_force(now_s)}
        resets, self._resets = frozenset(self._resets), set()
        return ClientTick(dict(self._shares), bans, tuple(issued), self._report(now_s), resets, line,
                          self.hold(n_hosts), frozenset(self._limited))

    def receive(self, peer: str, report: ClientReport, now_s: float) -> int:
        """A peer's report replaces its previous one; returns how many entries were ignored (all of
        a report made with other key lengths; a malformed or exempt client, a count that is not
        finite and >= 0, a ban note without a version or a finite time)."""
        if report.lengths != self._lengths:
            return len(report.counts) + len(report.bans)
        good = {c: v for c, v in report.counts if self._valid(c) and math.isfinite(v) and v >= 0}
        self._peers[peer] = _Peer(now_s, good)
        notes = [n for n in report.bans if self._valid(n.client) and math.isfinite(n.remaining_s) and n.version > 0]
        for note in notes:
            self._merge_ban(note, now_s)
        return len(report.counts) - len(good) + len(report.bans) - len(notes)

    def unban(self, prefix: Network, now_s: float) -> list[Network]:
        """Lift every ban in force that ``prefix`` covers (or the one ``prefix`` lies in); a tombstone
        one version up is gossiped so that no older ban note brings it back."""
        lifted = []
        for client, ban in list(self._bans.items()):
            net = self.rule.key.network(client)
            if ban.in_force(now_s) and net.version == prefix.version and (net.subnet_of(prefix)
                                                                          or prefix.subnet_of(net)):
                self._bans[client] = _Ban(ban.version + 1, ban.until_s + self.max_age_s, lifted=True)
                self._reset(client)
                lifted.append(net)
        return lifted

    # -- output

    def rows(self, now_s: float, limit: int | None = None) -> list[ClientRow]:
        """The clients as of the last tick, the banned first, then by global count."""
        network = self.rule.key.network
        banned = sorted((ClientRow(network(c), 0.0, 0.0, "banned", banned_until_s=b.until_s)
                         for c, b in self._bans.items() if b.in_force(now_s)),
                        key=lambda r: (r.client.version, r.client))
        local = {**self._local, **self._windows.counts(self._tick_s)}   # every client: drlctl asks rarely
        counted = {c for c in local if not self.rule.is_exempt(c)} | set(self._remote) | self._limited
        top = sorted(counted, key=lambda c: (-local.get(c, 0.0) - self._remote.get(c, 0.0), len(c), c))
        rows = banned + [self._row(c, local.get(c, 0.0)) for c in top]
        return rows if limit is None else rows[:limit]

    def summary(self, now_s: float) -> dict[str, int]:
        """For the class's status: clients counted (in the windows here, or the kernel's that the
        last tick looked at), throttled, banned."""
        return {"tracked": len(self._windows) or len(self._local), "throttled": len(self._limited),
                "banned": sum(1 for b in self._bans.values() if b.in_force(now_s))}

    # -- inside

    def _row(self, client: Client, local: float) -> ClientRow:
        remote = self._remote.get(client, 0.0)
        hosts = ([self.node_id] if local > 0 else []) + self._seen.get(client, [])
        share = self._shares.get(client)
        return ClientRow(self.rule.key.network(client), local + remote, local,
                         "throttled" if client in self._limited else "ok", share, hosts=tuple(hosts))

    def _valid(self, client: Client) -> bool:
        return self.rule.key.owns(client) and not self.rule.is_exempt(client)

    def _banned(self, client: Client, now_s: float) -> bool:
        ban = self._bans.get(client)
        return ban is not None and ban.in_force(now_s)

    def _countable(self, deltas: Mapping[Client, float], now_s: float) -> Mapping[Client, float]:
        """Banned traffic is the ban's: it does not fill a window.  The kernel drops it uncounted;
        this also covers the interval before a new ban reaches the kernel."""
        banned = {c for c, b in self._bans.items() if b.in_force(now_s)}
        return {c: d for c, d in deltas.items() if c not in banned} if banned else deltas

    def _expire(self, now_s: float) -> None:
        for peer in [p for p, r in self._peers.items() if now_s - r.at_s > self.max_age_s]:
            del self._peers[peer]
        # An ended ban is kept for one liveness timeout: a peer's late note of it (clocks drift by
        # the gossip delay) then merges into it instead of banning the client again.
        for client in [c for c, b in self._bans.items() if b.until_s + self.max_age_s <= now_s]:
            del self._bans[client]

    def _sum_peers(self, now_s: float) -> None:
        remote: dict[Client, float] = {}
        seen: dict[Client, list[str]] = {}
        for peer, report in sorted(self._peers.items()):
            for client, count in report.counts.items():
                if count > 0 and not self._banned(client, now_s):
                    remote[client] = remote.get(client, 0.0) + count
                    seen.setdefault(client, []).append(peer)
        self._remote, self._seen = remote, seen

    def _watched(self, counted: Mapping[Client, float], n_hosts: int) -> Iterable[Client] | None:
        """The clients whose count can matter this tick: counted now, heavy before, reported by a
        peer, or throttled.  A client with nothing new only loses count, so one below the line
        stays below it; all of them (None) when N changed, which moved the line, or when most
        clients were counted anyway (one scan of the table is cheaper than a set of them)."""
        if n_hosts != self._n_hosts or 2 * len(counted) >= len(self._windows):
            self._n_hosts = n_hosts
            return None
        return self._heavy.union(counted, self._remote, self._limited)

    def _decide(self, now_s: float, n_hosts: int) -> list[Client]:
        """Throttle: hold from the reporting line here, throttled from the limit until below
        RELEASE_FRACTION of it.  Ban: issue at the limit.  Only clients at or above the
        reporting line here, reported by a peer, or throttled can be over the limit: the
        others' local count is all there is of them."""
        candidates = self._heavy | self._remote.keys() | self._limited
        self._shares = {}
        if self.rule.action == "ban":
            issued = [c for c in candidates if self._total(c) >= self.rule.limit]
            for client in issued:
                self._issue(client, now_s)
            return issued
        self._hold(candidates, n_hosts)
        return []

    def _total(self, client: Client) -> float:
        return self._local.get(client, 0.0) + self._remote.get(client, 0.0)

    def _hold(self, candidates: set[Client], n_hosts: int) -> None:
        """The shares of the held clients, the throttled among them (once a tick for every heavy
        client: names bound locally)."""
        limit, limited, heavy, seen, ticks = self.rule.limit, self._limited, self._heavy, self._seen, self._held
        local_of, remote_of, shares, held = self._local.get, self._remote.get, self._shares, {}
        for client in candidates:
            local = local_of(client, 0.0)
            total = local + remote_of(client, 0.0)
            if total >= limit or (client in limited and total >= RELEASE_FRACTION * limit):
                limited.add(client)
            else:
                limited.discard(client)
                if client not in heavy:
                    continue
            n = max(n_hosts, 1 + len(seen.get(client, ())))
            held[client] = age = ticks.get(client, 0) + 1
            share = throttle_share(limit, local, total, n)
            shares[client] = min(share, limit / n) if age <= YOUNG_TICKS else share
        self._held = held

    def _issue(self, client: Client, now_s: float) -> None:
        """[RLDesign] "Banning clients based on request rates": until the window is over, plus
        the ban duration."""
        old = self._bans.get(client)
        until_s = self._windows.window_end_s(now_s) + self.rule.ban_duration_s
        self._bans[client] = _Ban(old.version + 1 if old else 1, until_s)
        self._reset(client)

    def _merge_ban(self, note: BanNote, now_s: float) -> None:
        """The higher version wins; at one version a tombstone beats a ban, two bans keep the
        later end.  A change of state restarts the client's count on this host."""
        if note.remaining_s <= 0:
            return
        until_s = now_s + note.remaining_s
        old = self._bans.get(note.client)
        if old is None or note.version > old.version or (note.version == old.version and note.lifted
                                                         and not old.lifted):
            self._bans[note.client] = _Ban(note.version, until_s, note.lifted)
            self._reset(note.client)
        elif note.version == old.version and note.lifted == old.lifted:
            old.until_s = max(old.until_s, until_s)

    def _reset(self, client: Client) -> None:
        """A ban or an unban ends the client's window: it is judged on what it does next."""
        self._windows.clear(client)
        self._resets.add(client)
        self._limited.discard(client)
        self._held.pop(client, None)
        for report in self._peers.values():
            report.counts.pop(client, None)
        for table in (self._local, self._remote, self._shares):
            table.pop(client, None)
        self._heavy.discard(client)

    def _report(self, now_s: float) -> ClientReport:
        """The top REPORT_K clients at or above the reporting line (REPORT_FRACTION of a fair
        share), or seen here at all while a peer reports them or they are throttled; then
        MAX_BAN_NOTES ban notes, the least recently sent first, so every ban goes round."""
        local = self._local                         # a client banned on this tick has left it
        wanted = {c for c in (*self._heavy, *self._remote, *self._limited) if c in local}
        top = sorted(((c, local[c]) for c in wanted), key=lambda cv: (-cv[1], cv[0]))[:REPORT_K]
        live = [(c, b) for c, b in self._bans.items() if b.until_s > now_s]
        bans = sorted(live, key=lambda cb: (cb[1].announced_s, cb[0]))[:MAX_BAN_NOTES]
        for _, ban in bans:
            ban.announced_s = now_s
        notes = tuple(BanNote(c, b.version, b.until_s - now_s, b.lifted) for c, b in bans)
        return ClientReport(self._lengths, tuple(top), notes)
