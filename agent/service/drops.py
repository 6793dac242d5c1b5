"""Each class's drops by policy reason, counted tick by tick for the status and the metrics.

    drops = Drops()
    drops.count(run, counters)      # in the tick, after the class's step
    drops.by_reason(run, counters)  # in its status
    drops.retain(table)             # after a reload: removed classes' tallies go

The datapath counts a class's drops, not why; the reason is the decision in force when
they happened (metrics.drop_reason), so they are tallied as the ticks go.
"""
from __future__ import annotations

from drl.agent.kernel.datapath import Counters
from drl.agent.service.class_table import ClassRun, ClassTable
from drl.agent.service.metrics import CLIENT_DROP_REASONS, DropTally, drop_reason


class Drops:
    """The DropTally of each class, by name; a new run of a class starts over."""

    def __init__(self):
        self._by_class: dict[str, tuple[ClassRun, DropTally]] = {}

    def tally(self, run: ClassRun) -> DropTally:
        owner, tally = self._by_class.get(run.name, (None, None))
        if owner is not run:         # a new class, or one removed and added again: a fresh tally
            tally = DropTally()
            self._by_class[run.name] = (run, tally)
        return tally

    def count(self, run: ClassRun, counters: Counters) -> None:
        """The drops since the last tick, under the reason of the decision then in force."""
        if run.last is not None and run.last[2].dropped_packets == counters.dropped_packets:
            return          # most ticks drop nothing new (the tally has seen last tick's counters)
        tally = self.tally(run)
        if (counters.dropped_bytes, counters.dropped_packets) != tally.seen:
            tally.add(counters.dropped_bytes, counters.dropped_packets, drop_reason(run.last and run.last[1].decision))

    def by_reason(self, run: ClassRun, c: Counters) -> dict:
        """The class's drops by policy reason (DropTally), and with a client rule its
        throttled and banned packets, which the datapath counts apart."""
        tally = self.tally(run)
        by_bytes, by_packets = dict(tally.bytes), dict(tally.packets)
        if run.conf.client is not None:
            by_bytes.update(zip(CLIENT_DROP_REASONS, (c.throttled_bytes, c.banned_bytes)))
            by_packets.update(zip(CLIENT_DROP_REASONS, (c.throttled_packets, c.banned_packets)))
        return {"dropped_bytes_by_reason": by_bytes, "dropped_packets_by_reason": by_packets}

    def retain(self, table: ClassTable) -> None:
        """Forget the classes ``table`` no longer has."""
        self._by_class = {name: v for name, v in self._by_class.items() if table.get(name) is not None}
