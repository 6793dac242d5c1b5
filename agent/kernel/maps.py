"""What every module of the datapath's map access shares: the error, the clock, batch reads.

``Datapath`` (agent/kernel/datapath.py) is composed of one part per group of maps
(class_maps, rule_maps, client_maps, flows) and the attach lifecycle (attach); each
reads and writes its maps through bcc's table types with the helpers here.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import sys
import time

try:
    from bcc.libbcc import lib
except ImportError:  # reported by Datapath() as a DatapathError
    lib = None

# Counters and FlowSamples are made by the thousand a tick: tuple.__new__ straight, not the
# NamedTuple's own __new__, a Python function that costs as much again
new_tuple = tuple.__new__


class DatapathError(RuntimeError):
    """The datapath cannot be set up or used; the message is one line."""


def now_ns() -> int:
    """The clock of bpf_ktime_get_ns (CLOCK_MONOTONIC), for config timestamps."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def lookup_batch(table, keys, values, limit: int, delete: bool = False) -> int:
    """Up to ``limit`` entries of ``table`` into the caller's ``keys`` and ``values`` arrays
    (kept across ticks: bcc's items_lookup_batch allocates both at the map's full size and
    yields entry by entry); how many.  A hash map may take several calls.  ``delete``: and
    delete them (BPF_MAP_LOOKUP_AND_DELETE_BATCH).

    The kernel copies whole hash buckets: when the next bucket holds more entries than the
    room left it returns ENOSPC.  The arrays hold ``limit`` entries, so that happens only
    once most of it is read, while the program adds entries behind the read (a flag table
    filling as it is emptied): what was read is returned, the rest is there next time."""
    batch = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
    total, token = 0, ct.c_uint32(0)
    while total < limit:
        count = ct.c_uint32(limit - total)
        res = batch(table.map_fd, ct.byref(token) if total else None, ct.byref(token),
                    ct.byref(keys, ct.sizeof(table.Key) * total), ct.byref(values, ct.sizeof(table.Leaf) * total),
                    ct.byref(count))
        total += count.value
        if res:
            err = ct.get_errno()
            if err == errno.ENOENT or (err == errno.ENOSPC and total):     # the map ended, or the room did
                break
            raise DatapathError(f"reading a BPF map failed: {os.strerror(err)}")
        if not count.value:
            break
    return total


def put(table, name: str, key, leaf) -> None:
    """table[key] = leaf; a full map (or any refusal) as a DatapathError naming the map (bcc's
    tables do not know their names)."""
    try:
        table[key] = leaf
    except Exception as e:      # bcc raises bare Exception; E2BIG: the map is full
        raise DatapathError(f"cannot write {name} ({table.max_entries} entries): "
                            f"{str(e).splitlines()[0]}") from None


def next_gen(gen: int) -> int:
    """The generation after ``gen`` in a __u32 settings field: never 0 (the program reads 0
    as "none yet")."""
    return gen % (2**32 - 1) + 1


def words(packed: bytes) -> list[int]:
    """16 address bytes as the four __u32 the kernel compares (network order in memory)."""
    return [int.from_bytes(packed[i:i + 4], sys.byteorder) for i in range(0, 16, 4)]
