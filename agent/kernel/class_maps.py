"""Datapath's class maps: each class's config, bucket and counters, and the heartbeat.

``set_class`` writes a class's decision (one map update, or one batch for a tick's
worth inside ``batch()``), ``heartbeat`` keeps every config fresh, ``reset_class``
readies a slot for another class, and the readers sum the per-CPU counters.  The
maps are defined in bpf/maps.h (config, counters), bpf/police.h (buckets,
heartbeat) and bpf/count.h (bypass_counters).
"""
from __future__ import annotations

import array
import contextlib
import ctypes as ct
import math
from functools import partial, reduce
from itertools import repeat
from operator import add
from typing import Iterable, NamedTuple, Sequence

from drl.agent import abi
from drl.agent.burst import mode_depth
from drl.agent.kernel.bucket import bucket_times
from drl.agent.kernel.maps import DatapathError, lookup_batch, new_tuple, now_ns
from drl.agent.model import Mode, SLOW_START_Bps

FLOOR_RATE_Bps = SLOW_START_Bps   # a bucket never refills slower (FPS slow start)

_MODES = frozenset(Mode)
# One counter lookup by id (~5 us) costs as much as batch-reading ~8-11 entries
# (0.5-0.7 us each, sums included; 2 CPUs, measured side by side).
BATCH_READ_ENTRIES = 8


# A NamedTuple like FlowSample (agent/kernel/flows.py): immutable like a frozen dataclass, at a
# third of the cost to make (timeit, 7 fields: 228 vs 717 ns; one per class every tick).
class Counters(NamedTuple):
    passed_bytes: int = 0
    passed_packets: int = 0
    dropped_bytes: int = 0
    dropped_packets: int = 0
    throttled_bytes: int = 0      # refused by a client's bucket: neither passed nor dropped
    throttled_packets: int = 0
    banned_bytes: int = 0         # from or to a banned client, egress and ingress
    banned_packets: int = 0


def default_burst(rate_Bps: float) -> int:
    """A policer's depth for a rate (agent/burst.py): rate x 300 ms, at least 128 KiB."""
    return mode_depth(rate_Bps, "police")


class ClassMaps:
    """Datapath's part for the class maps.  Uses the Datapath's ``_bpf``, ``max_classes``,
    ``_rules`` (which classes read_counters reads by default) and its client part (a
    config carries the class's client rule)."""

    def set_class(self, class_id: int, mode: Mode, rate_Bps: float = 0, burst_bytes: int | None = None,
                  drop_probability: float = 0.0, safe_rate_Bps: float | None = None,
                  timeout_s: float | None = None, quota_bytes: int | None = None, shadow: bool = False,
                  shape_prio: int = 0, safe_burst_bytes: int | None = None) -> None:
        """Write a class's config in one map update, stamped with now_ns().

        burst_bytes None = default_burst(rate_Bps).  After timeout_s without a
        new set_class or heartbeat the kernel enforces safe_rate_Bps (None = no limit)
        with a bucket of safe_burst_bytes (None = default_burst(safe_rate_Bps)).
        quota_bytes: bytes the class may pass from now on (every call with a
        number restarts the allowance); None = no quota.  shadow: what the
        policy refuses is counted as dropped but passes (bpf/police.h refuse).
        shape_prio: not 0 = shape mode, the class's packets pass with this skb->priority
        (their HTB class, agent/kernel/shaper.py) instead of being policed (bpf/police.h shape).
        """
        self._check_class(class_id)
        if mode not in _MODES:
            raise DatapathError(f"class {class_id}: mode {mode!r} is not one of {sorted(_MODES)}")
        # The whole config is made and checked apart from the map, and only then written (or
        # staged for the batch): a value the C types cannot hold (a rate of 1e400mbit is inf)
        # raises here and the class keeps the config it had, never a zeroed or half-made slot.
        table = self._bpf[b"config"]
        try:
            cfg = self._class_config(table.Leaf(), class_id, mode, rate_Bps, burst_bytes, drop_probability,
                                     safe_rate_Bps, timeout_s, quota_bytes, shadow, shape_prio, safe_burst_bytes)
        except (ArithmeticError, ValueError, TypeError) as e:    # what _whole missed, ctypes' own refusals
            raise DatapathError(f"class {class_id}: cannot write its config: {e}") from None
        if self._pending is not None:
            self._stage(class_id, cfg)
            return
        try:
            table[ct.c_int(class_id)] = cfg
        except Exception as e:          # bcc raises a bare Exception when the update fails
            raise DatapathError(f"class {class_id}: cannot write its config: {e}") from None

    def _class_config(self, cfg, class_id: int, mode: Mode, rate_Bps, burst_bytes, drop_probability,
                      safe_rate_Bps, timeout_s, quota_bytes, shadow, shape_prio, safe_burst_bytes):
        """``cfg`` (a zeroed Leaf, in no map) filled with set_class's arguments, each checked
        against its C type first (_whole); DatapathError names the first that does not fit."""
        what = f"class {class_id}"
        if not 0.0 <= drop_probability <= 1.0:      # NaN too
            raise DatapathError(f"{what}: drop probability {drop_probability} is not in [0, 1]")
        rate = _whole(rate_Bps, 64, f"{what}: rate")
        burst = _whole(burst_bytes if burst_bytes is not None else default_burst(rate), 64, f"{what}: burst")
        safe = abi.UNLIMITED if safe_rate_Bps is None else _whole(safe_rate_Bps, 64, f"{what}: safe rate")
        timeout_ns = 0 if not timeout_s else _whole(_finite(timeout_s, f"{what}: timeout") * 1e9, 64,
                                                    f"{what}: timeout (ns)")
        quota = None if quota_bytes is None else _whole(quota_bytes, 64, f"{what}: quota")
        cfg.mode = int(mode)
        cfg.rate_Bps = rate
        cfg.burst_bytes = burst
        cfg.drop_prob = round(drop_probability * abi.PROB_ONE)
        cfg.safe_rate_Bps = safe
        cfg.safe_burst_bytes = (default_burst(0 if safe_rate_Bps is None else safe) if safe_burst_bytes is None
                                else _whole(safe_burst_bytes, 64, f"{what}: safe burst"))
        cfg.timeout_ns = timeout_ns
        cfg.floor_rate_Bps = self._floor_rate_Bps
        # the same three buckets as time, so the program never divides (agent/kernel/bucket.py)
        cfg.ns_per_byte, cfg.depth_ns = bucket_times(rate, burst)
        if safe != abi.UNLIMITED:
            cfg.safe_ns_per_byte, cfg.safe_depth_ns = bucket_times(safe, cfg.safe_burst_bytes)
        cfg.floor_ns_per_byte, cfg.floor_depth_ns = self._floor_times
        cfg.shadow = int(bool(shadow))
        cfg.shape_prio = _whole(shape_prio, 32, f"{what}: shape priority")
        if class_id in self._client_rules:       # the client rule is set_client_rule's, kept here
            self._fill_client(cfg, class_id)     # (a fresh slot's client fields are zero: no rule)
        if quota is not None:                    # last: a refused config spends no sequence number
            self._quota_seq = self._quota_seq % (2**32 - 1) + 1   # never 0: 0 means no quota
            cfg.quota_seq, cfg.quota_bytes = self._quota_seq, quota
        cfg.updated_ns = now_ns()
        return cfg

    def _stage(self, class_id: int, cfg) -> None:
        """Inside batch(): ``cfg`` into the class's slot of the batch's own key and value
        arrays (made once), which batch() writes on exit."""
        table = self._bpf[b"config"]
        if self._staged is None:
            self._staged = ((ct.c_int * self.max_classes)(), (table.Leaf * self.max_classes)())
        keys, values = self._staged
        slot = self._pending.setdefault(class_id, len(self._pending))
        keys[slot] = class_id
        values[slot] = cfg

    @contextlib.contextmanager
    def batch(self):
        """Inside, set_class calls are collected and written together in one syscall on
        exit: a tick that writes a thousand classes costs one map update, not a thousand."""
        self._pending = {}
        try:
            yield self
        finally:
            n, self._pending = len(self._pending), None
            if n:
                table, (keys, values) = self._bpf[b"config"], self._staged
                table.items_update_batch((ct.c_int * n).from_buffer(keys), (table.Leaf * n).from_buffer(values))

    def heartbeat(self) -> None:
        """Stamp the agent's heartbeat with now_ns(): no config goes stale (falls back to its
        safe rate) until timeout_s after the last heartbeat or its own last write."""
        table = self._bpf[b"heartbeat"]
        table[ct.c_int(0)] = table.Leaf(now_ns())

    def reset_class(self, class_id: int) -> None:
        """Config back to PASS, counters to zero and the bucket empty: the id can serve a new
        class.  Empty, not full: a restarted agent's fresh bucket would otherwise pass a
        whole burst on top of what the other hosts' buckets pass (README "Faults")."""
        self._check_class(class_id)
        self.set_client_rule(class_id, None)
        for name in (b"config", b"counters"):
            self._bpf[name][ct.c_int(class_id)] = self._bpf[name].Leaf()
        bucket = self._bpf[b"buckets"].Leaf()
        bucket.gcra.tat = now_ns()          # credit accrues from now, from 0
        self._bpf[b"buckets"][ct.c_int(class_id)] = bucket

    def read_counters(self, class_ids: Iterable[int] | None = None) -> dict[int, Counters]:
        """Per class, summed over CPUs, since load (or reset_class); None: the classes the rules name.

        A few ids are looked up one syscall each; more are read with one batch
        syscall over ids 0..max(ids), summed in C (_summed_columns): the batch
        path wins once it reads fewer than BATCH_READ_ENTRIES entries per id.
        """
        wanted = self._rules.class_ids() if class_ids is None else set(class_ids)
        if not wanted:
            return {}
        for class_id in (min(wanted), max(wanted)):     # the extremes are in range: all are
            self._check_class(class_id)
        table = self._bpf[b"counters"]
        if max(wanted) + 1 > BATCH_READ_ENTRIES * len(wanted):
            return {i: _sum_cpus(table[ct.c_int(i)]) for i in sorted(wanted)}
        columns = _summed_columns(table, self._counter_buffers(table), max(wanted) + 1)
        rows = list(map(new_tuple, repeat(Counters), zip(*columns)))     # ids 0..max(wanted)
        return {i: rows[i] for i in wanted}

    def _counter_buffers(self, table):
        if self._counter_bufs is None:
            self._counter_bufs = ((table.Key * self.max_classes)(), (table.Leaf * self.max_classes)())
        return self._counter_bufs

    def read_bypass(self) -> Counters:
        """Packets no class matched, exempt ones and non-IP (passed_* only)."""
        return _sum_cpus(self._bpf[b"bypass_counters"][ct.c_int(0)])

    def read_quota(self, class_id: int) -> int | None:
        """Bytes the class may still pass, None when it has no quota."""
        self._check_class(class_id)
        cfg = self._bpf[b"config"][ct.c_int(class_id)]
        if not cfg.quota_seq:
            return None
        bucket = self._bpf[b"buckets"][ct.c_int(class_id)]
        return bucket.quota_left if bucket.quota_seq == cfg.quota_seq else cfg.quota_bytes


def _summed_columns(table, buffers, n: int) -> list[list[int]]:
    """Class ids 0..n-1's counters summed over CPUs, one list per Counters field, indexed
    by class id: one batch lookup of the per-CPU array's first n entries, the sums done by
    map(add) in C (0.6 ms for 1,000 entries on 2 CPUs, 0.9 with zip and sum; bcc's
    items_lookup_batch with a Counters per entry and CPU took ~4 ms side by side)."""
    keys, values = buffers
    got = lookup_batch(table, keys, values, n)
    if got != n:      # the arrays are reused: a short read would hand out last tick's counters
        raise DatapathError(f"read {got} of {n} class counters")
    cpus = table.total_cpu       # a per-CPU value is one record per CPU, entry after entry
    columns = _fields(ct.string_at(values, n * ct.sizeof(table.Leaf)), table.sLeaf, Counters._fields)
    return [list(reduce(partial(map, add), (column[cpu::cpus] for cpu in range(cpus)))) for column in columns]


def _fields(buf: bytes, record, names: Sequence[str]) -> list[array.array]:
    """The fields ``names`` of the ``record`` structs packed in ``buf``, one array per field,
    sliced out in C.  Every field is a __u64 or a __u32, and the record a whole number of
    __u64 (limiter.h pads them so)."""
    size = ct.sizeof(record)
    words = {8: array.array("Q", buf), 4: array.array("I", buf)}
    return [words[f.size][f.offset // f.size::size // f.size] for f in (getattr(record, name) for name in names)]


def _finite(value, what: str) -> float:
    if not math.isfinite(value):
        raise DatapathError(f"{what} {value} is not a finite number")
    return value


def _whole(value, bits: int, what: str) -> int:
    """``value`` as the unsigned C integer of ``bits`` bits it is written as, or DatapathError:
    ctypes would wrap a negative or too big int silently, and int() of inf or NaN raises."""
    if isinstance(value, float):
        _finite(value, what)
    n = int(value)
    if not 0 <= n < 1 << bits:
        raise DatapathError(f"{what} {value} is not in 0..2^{bits}-1")
    return n


def _sum_cpus(per_cpu) -> Counters:
    return Counters(*(sum(getattr(c, name) for c in per_cpu) for name in Counters._fields))
