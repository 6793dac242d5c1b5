"""Classes that match nothing while the interface carries traffic: a hint for the status and the log.

    unmatched = Unmatched(iface="eth0")
    unmatched.observe(now, table, counters, bypass, own_bytes)   # every tick, after the counter reads
    unmatched.hint(run)          # the class's hint (a str), or None
    unmatched.retain(table)      # after a reload: removed classes' watches go

A match spec that names the wrong end of a flow (``dport=8080`` for what a server on port
8080 sends, which leaves *from* that port) passes nothing and drops nothing, and a class
at 0 bytes looks like a limit that holds.  So a class with a spec that matched no packet
for WINDOW_S seconds, while the interface carried at least MIN_OTHER_BYTES of other traffic
in those seconds, gets a hint: logged once (``class_matches_nothing``) and shown in its
status until it matches a packet again.

"Other traffic" is what the program saw leave the interface outside the class: packets of
no class (the datapath's bypass counter) and those of the other classes, less the agent's
own gossip, which the bypass counter holds too and which alone would make an idle host
look busy.  A class without a spec (every IP packet) gets no hint: there is no spec to fix.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from drl.agent import logs
from drl.agent.classes.spec import ClassRule
from drl.agent.kernel.datapath import Counters
from drl.agent.service.class_table import ClassRun, ClassTable
from drl.agent.units import format_size

# Long enough that a client between two requests, or a batch job between runs, is not
# flagged; short enough that an operator still looking at a new class sees the hint.
WINDOW_S = 30.0
# Above what ARP, neighbour discovery and etcd's keepalives leave in WINDOW_S (a few KB),
# below any real test of a limit (one second of 1 Mbit/s is 125 KB).
MIN_OTHER_BYTES = 64 * 1024
ETHERNET_HEADER = 14     # counted by the program (skb->wire_len), not by the gossip byte counters

log = logs.get_logger("drl.agent")


def matched_bytes(c: Counters) -> int:
    """Every byte the class's rules matched, whatever became of it."""
    return c.passed_bytes + c.dropped_bytes + c.throttled_bytes + c.banned_bytes


def gossip_wire_bytes(stats: Any) -> int:
    """What the agent's own gossip put on the wire, as the program counts it in bypass."""
    return stats.sent_bytes + stats.sent * (stats.overhead_bytes + ETHERNET_HEADER)


@dataclass(slots=True)
class _Watch:
    """One class's quiet spell: since when it matched nothing, and the interface's other
    traffic (Unmatched.total) then."""
    rules: tuple[ClassRule, ...]
    matched: int
    quiet_since: float
    hint: str | None = None


@dataclass(slots=True)
class _Traffic:
    """The interface's traffic outside each class, as a running total with its recent history."""
    bypass: int | None = None
    own: int = 0
    total: int = 0          # bytes of no class and of any class, less our gossip, since the first tick
    history: collections.deque = field(default_factory=collections.deque)    # (time, total), last WINDOW_S


class Unmatched:
    def __init__(self, iface: str) -> None:
        self.iface = iface
        self._watches: dict[str, tuple[ClassRun, _Watch]] = {}
        self._traffic = _Traffic()

    def observe(self, now: float, runs: Iterable[ClassRun], counters: Mapping[int, Counters], bypass: Counters,
                own_bytes: int) -> None:
        """One tick: ``counters`` of every class in ``runs``, the datapath's bypass counters and
        gossip_wire_bytes so far."""
        runs = list(runs)
        t, delta = self._traffic, 0
        if t.bypass is not None:       # the first tick sets the baselines
            delta += max(0, bypass.passed_bytes - t.bypass) - max(0, own_bytes - t.own)
        t.bypass, t.own = bypass.passed_bytes, own_bytes
        watches = []
        for run in runs:
            c = counters.get(run.class_id)
            if c is None:
                continue
            owner, w = self._watches.get(run.name, (None, None))
            m = matched_bytes(c)
            if owner is not run or w.rules != run.conf.rules:    # new, re-added or re-specified: start over
                w = _Watch(run.conf.rules, m, now)
                self._watches[run.name] = (run, w)
            else:
                delta += max(0, m - w.matched)
            watches.append((run, w, m))
        t.total += max(0, delta)
        t.history.append((now, t.total))
        while len(t.history) > 1 and t.history[1][0] <= now - WINDOW_S:
            t.history.popleft()
        for run, w, m in watches:
            self._judge(run, w, m, now)

    def _judge(self, run: ClassRun, w: _Watch, m: int, now: float) -> None:
        if m != w.matched:
            w.matched, w.quiet_since, w.hint = m, now, None
            return
        if w.hint is not None or not w.rules or now - w.quiet_since < WINDOW_S:
            return
        base_t, base = self._traffic.history[0]
        other = self._traffic.total - base
        if base_t > now - WINDOW_S or other < MIN_OTHER_BYTES:    # not WINDOW_S of history yet, or too quiet
            return
        seconds = round(now - w.quiet_since)
        w.hint = (f"matched nothing for {seconds} s while {self.iface} carried {format_size(other)} of other "
                  f"traffic; {advice(w.rules)}")
        log.warning("class_matches_nothing", class_=run.name, seconds=seconds,
                    match=[str(r) for r in w.rules], other_bytes=other, hint=w.hint)

    def hint(self, run: ClassRun) -> str | None:
        owner, w = self._watches.get(run.name, (None, None))
        return w.hint if owner is run else None

    def retain(self, table: ClassTable) -> None:
        """Forget the classes ``table`` no longer has."""
        self._watches = {name: v for name, v in self._watches.items() if table.get(name) is not None}


def advice(rules: tuple[ClassRule, ...]) -> str:
    """What to check in the spec: for ports, which end of the flow each names on egress."""
    for r in rules:
        if r.dport is not None and r.sport is None:
            return (f"classes match egress packets, and a server's replies leave from its port: for a server "
                    f"on port {r.dport} write sport={r.dport} (dport={r.dport} is what this host sends to port "
                    f"{r.dport})")
        if r.sport is not None and r.dport is None:
            return (f"classes match egress packets: sport={r.sport} is what leaves from local port {r.sport} "
                    f"(a server's replies); for what this host sends to a server on port {r.sport} write "
                    f"dport={r.sport}")
    return ("classes match egress packets: dst is the remote address, src this host's, sport the local port, "
            "dport the remote one")
