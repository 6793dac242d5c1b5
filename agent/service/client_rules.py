"""Per-client rules at run time: the kernel's per-client counts -> each class's ClientTable ->
the kernel's throttles and bans, and the reports the peers merge (docs/clients.md).

    clients = ClientRules(dp, node_id="a")
    clients.apply(table, now, max_age_s, n_hosts)     # at start and after every reload
    reports = clients.tick(now, n_hosts, max_age_s)   # every interval: gossip them to every peer
    clients.receive("b", payload, now)                # a peer's ClientReports

The decisions are agent/clients/table.py's (pure); this module only moves counts in and limits
and bans out.  The kernel keeps every client's sliding window and flags a client whose
count reaches the reporting line, so a tick reads the flagged clients and the few the
table follows (ClientTable.wanted), never all of them: 100,000 clients cost what their
heavy ones cost.  The kernel holds a client at threshold/N from the moment its count
reaches the line until a tick writes its share or lets it go, and enforces limits and
bans by itself (bpf/limiter.c): a held client's bucket falls back to threshold/N and a
ban ends at its time when the agent is gone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Iterable

from drl.agent import abi, logs
from drl.agent.clients.rules import ClientRule, Network
from drl.agent.clients.table import ClientTable, ClientTick
from drl.agent.gossip.dispatch import Dispatch
from drl.agent.gossip.wire import ClassClients, ClientReports

log = logs.get_logger("drl.agent")

# A tick adopts at most this many newly flagged clients of a class (reads their counts, decides,
# writes); the others wait in line, held by the kernel at threshold/N meanwhile, which is
# what a young client gets anyway.  A client followed costs ~8 us a tick and a sprayed one is
# followed for ~2 windows: 256 a tick keep a spray of 200,000 addresses at a few thousand
# followed, tens of ms a tick, instead of a tick of a second.  The line holds at most what
# the kernel's map of holds does; past that the longest waiting are let go (flagged again
# next window if they still send).
ADOPT_PER_TICK = 256
MAX_WAITING = abi.MAX_CLIENT_LIMITS


@dataclass
class ClientRun:
    """One class's client rule while it runs, and what was last written to the kernel."""
    name: str
    key: int
    class_id: int
    rule: ClientRule
    table: ClientTable
    shares: tuple = ({}, 0.0)                      # held client -> share per window, fail-safe per s: as written
    throttled: frozenset = frozenset()             # those of them over the threshold
    unheld: int = 0                                # held ones the kernel's full map had no room for
    unbanned: int = 0                              # bans the same for client_bans
    bans: dict = field(default_factory=dict)       # client -> until (ns, CLOCK_MONOTONIC)
    line: float = 0.0                              # the reporting line the kernel flags clients at
    hold: float = 0.0                              # and holds them at (count per window)
    waiting: dict = field(default_factory=dict)    # flagged, not yet adopted, the oldest first (an ordered set)

    def network(self, client: bytes) -> str:
        return str(self.rule.key.network(client))


class ClientRules:
    """The classes with a client rule; ``ignored`` counts report entries a table refused."""

    def __init__(self, dp, node_id: str):
        self.dp, self.node_id = dp, node_id
        self._runs: dict[str, ClientRun] = {}
        self._by_key: dict[int, ClientRun] = {}
        self.ignored = 0

    def __bool__(self) -> bool:
        return bool(self._runs)

    def get(self, name: str) -> ClientRun | None:
        return self._runs.get(name)

    def apply(self, classes: Iterable, now: float, max_age_s: float, n_hosts: int) -> None:
        """Follow the running classes (agent/service/class_table.py ClassRun): a new or changed rule starts
        a new table (counts, throttles and bans of the old rule do not carry over), a removed
        one is taken out of the kernel."""
        wanted = {run.name: run for run in classes if run.conf.client is not None}
        for name, cr in list(self._runs.items()):
            run = wanted.get(name)
            if run is None or (run.conf.client, run.class_id) != (cr.rule, cr.class_id):
                self.dp.set_client_rule(cr.class_id, None)
                del self._runs[name]
        for name, run in wanted.items():
            if name not in self._runs:
                table = ClientTable(run.conf.client, max_age_s, now, self.node_id)
                cr = ClientRun(name, run.conf.key, run.class_id, run.conf.client, table, line=table.line(n_hosts),
                               hold=table.hold(n_hosts))
                self.dp.set_client_rule(run.class_id, run.conf.client, cr.line, cr.hold)
                self._runs[name] = cr
        self._by_key = {cr.key: cr for cr in self._runs.values()}

    def tick(self, now: float, n_hosts: int, max_age_s: float) -> list[ClassClients]:
        """One interval: the kernel's counts of the clients that matter into every table, its
        limits, bans, resets and reporting line out, the kernel's holds of flagged clients
        the table let go dropped; the reports to gossip (classes with nothing to say send
        nothing)."""
        if not self._runs:
            return []
        flagged = self.dp.read_heavy()
        reports = []
        for cr in self._runs.values():
            followed = cr.table.wanted()
            again = flagged.get(cr.class_id, set())
            new = (again & followed) | self._adopt(cr, again - followed)
            wanted = followed | new
            counts = self.dp.client_counts(cr.class_id, wanted) if wanted else {}
            cr.table.max_age_s = max_age_s          # follows the membership's liveness timeout
            t = cr.table.tick_counts(now, counts, n_hosts)
            let_go = new - t.limits.keys()
            if cr.hold and let_go:                      # first: room in the map for the writes
                self.dp.drop_holds(cr.class_id, let_go)
            self._write(cr, t, n_hosts)
            if t.resets:                            # banned or unbanned: judged on what comes next
                self.dp.forget_clients(cr.class_id, t.resets)
            if (t.line, t.hold) != (cr.line, cr.hold):     # N changed
                self.dp.set_client_line(cr.class_id, t.line, t.hold)
                cr.line, cr.hold = t.line, t.hold
            for client in t.issued:
                log.info("client_banned", class_=cr.name, client=cr.network(client),
                         for_s=round(t.bans[client] - now, 1))
            if t.report.counts or t.report.bans:
                reports.append(ClassClients(cr.key, t.report))
        return reports

    def _adopt(self, cr: ClientRun, flagged: set) -> set:
        """The newly flagged clients this tick takes on: the longest waiting, ADOPT_PER_TICK at
        most; the line beyond MAX_WAITING loses its oldest, whose kernel holds go with them."""
        line = cr.waiting
        line.update(dict.fromkeys(flagged))          # one already waiting keeps its place
        taken = set(islice(line, ADOPT_PER_TICK))
        for client in taken:
            del line[client]
        if len(line) > MAX_WAITING:
            dropped = list(islice(line, len(line) - MAX_WAITING))
            for client in dropped:
                del line[client]
            self.dp.drop_holds(cr.class_id, dropped)
        return taken

    def _write(self, cr: ClientRun, t: ClientTick, n_hosts: int) -> None:
        """Shares are counts per window: the kernel's buckets take units per second; a bucket's
        fail-safe is the even split threshold/N (docs/clients.md "Bans end by themselves")."""
        window_s = cr.rule.window_s
        safe = cr.rule.limit / max(1, n_hosts) / window_s
        if t.throttled != cr.throttled:
            log.info("clients_throttled", class_=cr.name, n=len(t.throttled),
                     started=[cr.network(c) for c in t.throttled - cr.throttled] or None,
                     ended=[cr.network(c) for c in cr.throttled - t.throttled] or None)
            cr.throttled = t.throttled
        if (t.limits, safe) != cr.shares:          # most ticks: a held client's share stays
            # the throttled first, then the larger shares: what a full map leaves out is the least
            first = sorted(t.limits.items(), key=lambda cs: (cs[0] not in t.throttled, -cs[1], cs[0]))
            full = set(self.dp.set_client_limits(cr.class_id, {c: (v / window_s, safe) for c, v in first}))
            if full and not cr.unheld:
                log.warning("client_limits_full", class_=cr.name, unheld=len(full), held=len(first) - len(full))
            # the left out are not written: tried again next tick (a kernel hold of one is adopted, no room needed)
            cr.shares, cr.unheld = ({c: v for c, v in t.limits.items() if c not in full}, safe), len(full)
        until = {c: int(until_s * 1e9) for c, until_s in t.bans.items()}
        if until != cr.bans:
            full = self.dp.set_client_bans(cr.class_id, until)
            if full and not cr.unbanned:
                log.warning("client_bans_full", class_=cr.name, unbanned=len(full), banned=len(until) - len(full))
            # the left out are not written: tried again next tick
            cr.bans, cr.unbanned = {c: u for c, u in until.items() if c not in full}, len(full)

    def subscribe(self, dispatch: Dispatch) -> None:
        dispatch.on(ClientReports, lambda rx, now: self.receive(rx.header.node, rx.payload, now))

    def receive(self, node: str, payload: ClientReports, now: float) -> None:
        for entry in payload.reports:
            cr = self._by_key.get(entry.key)
            if cr is None:          # a class we do not run, or run without a client rule
                self.ignored += len(entry.report.counts) + len(entry.report.bans)
            else:
                self.ignored += cr.table.receive(node, entry.report, now)

    def unban(self, prefix: Network, class_name: str | None, now: float) -> list[tuple[str, str]]:
        """``drlctl unban``: lift what ``prefix`` covers in one class or all, here and now (the
        tombstones reach the peers with the next reports); (class, client) of each ban lifted."""
        lifted = []
        for cr in self._runs.values():
            if class_name is not None and cr.name != class_name:
                continue
            nets = cr.table.unban(prefix, now)
            if nets:
                gone = {n.network_address.packed for n in nets}
                cr.bans = {c: u for c, u in cr.bans.items() if c not in gone}
                self.dp.set_client_bans(cr.class_id, cr.bans)
                lifted += [(cr.name, str(n)) for n in nets]
                log.info("client_unbanned", class_=cr.name, clients=[str(n) for n in nets])
        return lifted

    def listing(self, class_name: str | None, now: float, limit: int | None) -> list[dict]:
        """``drlctl clients --json``: per class, its rule and its clients (ClientTable.rows)."""
        return [_listing(cr, now, limit) for cr in self._runs.values()
                if class_name is None or cr.name == class_name]


def _listing(cr: ClientRun, now: float, limit: int | None) -> dict:
    rule, window_s = cr.rule, cr.rule.window_s
    in_bits = rule.measure == "bytes"

    def per_s(count: float | None) -> float | None:
        return None if count is None or not in_bits else count * 8 / window_s

    rows = [{"client": str(r.client), "state": r.state, "global_count": r.global_count,
             "local_count": r.local_count, "share_count": r.share,
             "global_bps": per_s(r.global_count), "local_bps": per_s(r.local_count), "share_bps": per_s(r.share),
             "banned_for_s": None if r.banned_until_s is None else max(0.0, r.banned_until_s - now),
             "hosts": list(r.hosts)} for r in cr.table.rows(now, limit)]
    return {"name": cr.name, "client_key": str(rule.key), "measure": rule.measure,
            "threshold": {"count": rule.limit, "window_s": window_s, "text": str(rule.threshold)},
            "action": rule.action, "ban_duration_s": rule.ban_duration_s,
            "exempt": [str(n) for n in rule.exempt], "clients": rows}

