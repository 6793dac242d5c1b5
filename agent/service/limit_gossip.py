"""Global limits between peers: the newer version wins, and a peer on an older one is told ours.

    limits = LimitGossip(book, table, transport)
    limits.announce(run)            # a class started or changed, a drlctl set: to every peer
    limits.heard(rx)                # a Batch arrived: adopt newer limits, answer older ones

A limit's version grows with every ``drlctl set`` or changed config file (cluster/limits.py);
its notes ride in the gossip batches (gossip/wire.py LimitNote).
"""
from __future__ import annotations

from drl.agent import logs
from drl.agent.cluster.limits import Limit, LimitBook
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
        if changed:
            self.book.save()
        for v in rx.payload.values:
            run = self.table.by_key(v.key)
            if run is not None and v.version < self.book.get(run.name).version:
                self.announce(run, rx.addr)
