"""The flow table as the agent reads it (read_flows): FlowKey, FlowSample, and the reader
that keeps the agent's copy up to date from the entries the program visited (bpf/flows.h)."""
from __future__ import annotations

import ctypes as ct
import ipaddress
import struct
import sys
import time
from operator import itemgetter
from typing import NamedTuple

from drl.agent.kernel.maps import lookup_batch, new_tuple


# FlowKey and FlowSample are NamedTuples: immutable like the frozen dataclasses, at a third of
# the cost to make (timeit, 7 fields: 228 vs 717 ns; one per flow every tick), and a FlowKey
# hashes in C (the estimator looks every flow up by its key every tick).
class FlowKey(NamedTuple):
    family: int          # 4 or 6
    proto: int
    src: str
    dst: str
    sport: int           # 0 when not TCP/UDP
    dport: int


class FlowSample(NamedTuple):
    key: FlowKey
    class_id: int
    bytes: int           # passed the limiter
    packets: int
    first_ns: int
    last_ns: int


class FlowMaps:
    """Datapath's part for flows and flows_visited (bpf/flows.h); keeps self._flow_reader."""

    def read_flows(self, full: bool = False) -> dict[int, list[FlowSample]]:
        """Every tracked flow, by class id: the entries visited since the last call
        (one batch syscall), the whole table every few seconds or when ``full``.  A flow
        whose entry did not change since the last call is the same FlowSample, in the same
        place (_FlowReader)."""
        if self._flow_reader is None:
            self._flow_reader = _FlowReader(self._bpf[b"flows"], self._bpf[b"flows_visited"])
        return self._flow_reader.read(full)


class _FlowReader:
    """read_flows: the flow table as the agent's own copy, per class, brought up to date
    each call from the entries visited since the last one (the program copies
    each visit to flows_visited, which one lookup-and-delete batch drains), and read
    whole every FULL_READ_S (the first call too): the full read drops what the kernel
    evicted (LRU) and catches a visit the full flows_visited map could not take.

    With 20,000 flows only ~700 entries are visited between two 100 ms ticks (a flow's
    tally visits the table once per 16.8 ms epoch it sends in, or when its memo slot
    changes hands, and tallies of fewer packets than the CPU sends per 250 us visit by
    chance: agent/abi.py): reading all of them cost ~5 ms of syscalls a tick.  A flow keeps its place in its
    class's list, new flows come last, and an entry nothing visited is the same
    FlowSample as before: the estimator's cheap path (agent/estimator.py).  A drained
    entry of another class than the one it is filed under (the rules moved its flow)
    makes the call a full read.
    """
    FULL_READ_S = 10.0

    def __init__(self, table, visited):
        self.table, self.visited = table, visited
        self.keys, self.values = (table.Key * table.max_entries)(), (table.Leaf * table.max_entries)()
        self.key_size, self.value_size = ct.sizeof(table.Key), ct.sizeof(table.Leaf)
        # limiter.h flow_stats: __u64 and __u32 only; its fields in FlowSample's order
        names = [name for name, _ in table.Leaf._fields_]
        self.value = struct.Struct("=" + "".join("Q" if ct.sizeof(t) == 8 else "I" for _, t in table.Leaf._fields_))
        self.order = itemgetter(*(names.index(name) for name in FlowSample._fields[1:]))
        self.samples: dict[int, list[FlowSample]] = {}     # class id -> its flows
        self.raws: dict[int, list[bytes]] = {}             # class id -> their keys as read, in the same order
        self.place: dict[bytes, tuple[int, int]] = {}      # key as read -> (class id, index in both)
        self.full_at: float | None = None

    def read(self, full: bool) -> dict[int, list[FlowSample]]:
        n = lookup_batch(self.visited, self.keys, self.values, self.visited.max_entries, delete=True)
        now = time.monotonic()
        full = full or self.full_at is None or now - self.full_at >= self.FULL_READ_S
        rows = [] if full else list(self._rows(n))
        if full or any(self._moved(raw, row) for raw, row in rows):
            # after the drain: the table holds every visit the drain took.  Flows the rules moved
            # to another class: one rebuild, not their old class's list renumbered for each
            self._read_all()
            self.full_at = now
        else:
            for raw, row in rows:
                self._visit(raw, row)
        # copies: the estimator tells a visited flow by its list's FlowSample not being the last one's
        return {class_id: list(samples) for class_id, samples in self.samples.items()}

    def _rows(self, n: int):
        """(key as read, FlowSample's fields after the key) of the first n entries read."""
        keys, values = ct.string_at(self.keys, n * self.key_size), ct.string_at(self.values, n * self.value_size)
        return zip((keys[at:at + self.key_size] for at in range(0, len(keys), self.key_size)),
                   map(self.order, self.value.iter_unpack(values)))

    def _moved(self, raw: bytes, row: tuple) -> bool:
        """The entry is another class's than the one we filed it under: the rules moved the
        flow (flows.h visit)."""
        at = self.place.get(raw)
        return at is not None and at[0] != row[0]

    def _visit(self, raw: bytes, row: tuple) -> None:
        """A visited entry's FlowSample in its place, or, for a flow new to us, last in
        its class."""
        at = self.place.get(raw)
        if at is None:
            self._append(raw, row)
            return
        samples = self.samples[at[0]]
        samples[at[1]] = new_tuple(FlowSample, (samples[at[1]].key, *row))

    def _append(self, raw: bytes, row: tuple) -> None:
        samples, raws = self.samples.setdefault(row[0], []), self.raws.setdefault(row[0], [])
        self.place[raw] = (row[0], len(samples))
        samples.append(new_tuple(FlowSample, (_decode_key(self.table.Key.from_buffer_copy(raw)), *row)))
        raws.append(raw)

    def _read_all(self) -> None:
        """The whole table: flows we know keep their order (and their FlowSample while
        their entry did not change), flows gone from it leave, new ones come last."""
        rows = dict(self._rows(lookup_batch(self.table, self.keys, self.values, self.table.max_entries)))
        known = [(class_id, self.raws[class_id], samples) for class_id, samples in self.samples.items()]
        self.samples, self.raws, self.place = {}, {}, {}
        for class_id, raws, samples in known:
            kept, kept_raws = [], []
            for raw, sample in zip(raws, samples):
                row = rows.get(raw)
                if row is None or row[0] != class_id:
                    continue
                del rows[raw]
                self.place[raw] = (class_id, len(kept))
                kept.append(sample if sample[1:] == row else new_tuple(FlowSample, (sample.key, *row)))
                kept_raws.append(raw)
            if kept:
                self.samples[class_id], self.raws[class_id] = kept, kept_raws
        for raw, row in rows.items():
            self._append(raw, row)


def _addr(family: int, words) -> str:
    packed = b"".join(int(w).to_bytes(4, sys.byteorder) for w in words)
    return str(ipaddress.ip_address(packed[:4] if family == 4 else packed))


def _decode_key(k) -> FlowKey:
    return FlowKey(k.family, k.proto, _addr(k.family, k.src), _addr(k.family, k.dst), k.sport, k.dport)
