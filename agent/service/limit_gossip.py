"""Global limits between peers: the newer version wins, and a peer on an older one is told ours.

    limits = LimitGossip(book, table, transport)
    limits.announce(run)            # a class started or changed, a drlctl set: to every peer
    limits.heard(rx)                # a Batch arrived: adopt newer limits, answer older ones

A limit's version is the time of its last ``drlctl set`` or changed config file
(cluster/limits.py); its notes ride in the gossip batches (gossip/wire.py LimitNote).  A note
too far ahead of this agent's clock is not adopted: counted in ``ahead`` (per sender) and
logged once per sender (``limit_ahead``), not per datagram, so a forger cannot flood the log.
"""
from __future__ import annotations

from drl.agent import logs
from collections import Counter

from drl.agent.cluster.limits import MAX_AHEAD_MS, Limit, LimitBook
from drl.agent.gossip.core import Received
from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.dispatch import Dispatch
from drl.agent.gossip.wire import Batch, LimitNote
from drl.agent.service.class_table import ClassRun, ClassTable
from drl.agent.units import to_bps

log = logs.get_logger("drl.agent")


class LimitGossip:
    """The limit book's side of gossip, for the classes of one table."""

    def __init__(self, book: LimitBook, table: ClassTable, transport: TransportPort):
        self.book, self.table, self.transport = book, table, transport
        self.ahead: Counter[str] = Counter()      # sender node -> notes refused as too far ahead

    def announce(self, run: ClassRun, addr=None) -> None:
        """``run``'s limit to ``addr``, or to every peer."""
        limit = self.book.get(run.name)
        self.transport.announce(LimitNote(run.conf.key, limit.version, limit.global_Bps), addr)

    def subscribe(self, dispatch: Dispatch) -> None:
        dispatch.on(Batch, lambda rx, now: self.heard(rx))

    def heard(self, rx: Received) -> None:
        """Adopt newer limits; tell a peer that holds an older one ours."""
        changed = False
        for note in rx.payload.limits:
            run = self.table.by_key(note.key)
            if run is None:
                continue
            heard = Limit(note.version, note.global_Bps)
            if self.book.merge(run.name, heard):
                log.info("limit_changed", class_=run.name, global_bps=round(to_bps(note.global_Bps)),
                         version=note.version, from_=rx.header.node)
                changed = True
            elif heard < self.book.get(run.name):     # e.g. the same version from a file that differs
                self.announce(run, rx.addr)
            elif self.book.ahead_ms(note.version) > 0:
                self._refused_ahead(run, note, rx.header.node)
        if changed:
            self.book.save()
        for v in rx.payload.values:
            run = self.table.by_key(v.key)
            if run is not None and v.version < self.book.get(run.name).version:
                self.announce(run, rx.addr)

    def _refused_ahead(self, run: ClassRun, note, node: str) -> None:
        """A note from the future: a forged one, or a sender whose clock runs ahead."""
        self.ahead[node] += 1
        if self.ahead[node] == 1:
            log.warning("limit_ahead", class_=run.name, version=note.version, from_=node,
                        ahead_s=round((self.book.ahead_ms(note.version) + MAX_AHEAD_MS) / 1000),
                        global_bps=round(to_bps(note.global_Bps)))
