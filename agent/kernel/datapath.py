"""The datapath: compile bpf/limiter.c with bcc, attach it at tc egress (and ingress), talk to its maps.

This is the only module that imports bcc.  Everything above it (agent/service/daemon.py)
uses the small interface below, which a test double can implement too::

    from drl.agent.model import Mode
    from drl.agent.classes.spec import parse_classes

    with Datapath("eth0", parse_classes(["dport=80,proto=tcp"]), gossip_port=7470) as dp:
        dp.set_class(0, Mode.BUCKET, rate_Bps=6.25e6, safe_rate_Bps=3e6, timeout_s=5)
        ...
        dp.read_counters()[0].passed_bytes

Interface (all rates bytes/s, sizes bytes, times seconds unless named _ns):

* ``Datapath(iface, classes=(), *, class_ids=None, max_flows=4096, max_classes=4096,
  max_clients=abi.MAX_CLIENTS, gossip_port=None, gossip_mark=abi.GOSSIP_MARK, registry_port=None, drop_action="stolen",
  floor_rate_Bps=FLOOR_RATE_Bps, netns=None, exclusive=False)``
  compiles and loads, then ``set_rules(zip(classes, class_ids))`` (class_ids
  default 0, 1, ...: several rules may feed one class); no classes = every
  IP packet is class 0.  UDP from ``gossip_port`` that carries ``gossip_mark``
  (the agent's own gossip socket, agent/gossip/transport.py) is never policed, nor
  TCP to ``registry_port`` with that mark (its etcd connections,
  agent/cluster/etcd.py); everything else on those ports is.  ``exclusive``: hold the interface's
  lock (agent/kernel/lock.py, one agent per interface and network namespace) from
  before the program is compiled until ``close()``; DatapathError if another
  process holds it.
* ``set_rules(rules)``: ``rules`` is a sequence of ``(ClassRule, class_id)``
  (precedence: agent/kernel/classify.py); replaces the installed set while packets
  flow: new and changed map entries are written first, then the mark masks
  and prefix lengths, stale entries deleted last, so a class whose rules did
  not change is classified throughout.
* ``reset_class(class_id)``: config back to PASS, bucket and counters zero,
  before a class id is reused for another class.
* ``attach()`` / ``detach()`` (or ``with``): idempotent; attach replaces our
  filter (fixed prio/handle), detach removes exactly what attach added.  The
  ingress filter (drl_ingress: drops banned clients' packets on their way in)
  is on while some class has a client rule with action ban, and only then.
* ``ensure_attached() -> bool``: after attach, is our program still the
  egress filter (and the ingress one, while wanted)?  One netlink dump; if not (filter or clsact removed,
  replaced by another program) attach again and return True.  Never raises:
  a failed re-attach logs once and shows in ``attachment`` (state
  ``failed``), and is tried again on the next call.
* ``attachment``: ``{"state": "attached"|"failed"|"detached", "reattached": N,
  "error": None|str}`` for the agent's status.
* ``set_class(class_id, mode, rate_Bps=0, burst_bytes=None, drop_probability=0.0,
  safe_rate_Bps=None, timeout_s=None, quota_bytes=None, shadow=False, shape_prio=0)``: one write, stamped
  with ``now_ns()``.  Until a class is set it passes everything.
* ``heartbeat()``: the agent is alive; every class's config counts as fresh from now, as if
  it had just been written again (bpf/limiter.c stale).  One write for all classes.
* ``set_sample_probability(p)``: chance that a new flow enters the flow table.
* ``read_counters(class_ids=None) -> dict[int, Counters]`` (None: the classes the
  rules name), ``read_bypass() -> Counters``,
  ``read_flows(full=False) -> dict[int, list[FlowSample]]`` (by class id),
  ``read_quota(class_id) -> int | None``, ``now_ns()``, ``prog_fd`` and ``ingress_prog_fd``
  (for bench stats).
* ``default_burst(rate_Bps)``: the bucket depth used when burst_bytes is None.

Per-client throttle and ban (docs/clients.md; a client is agent/clients/table.py's
``Client``, its packed prefix: 4 or 16 bytes, host bits zero)::

    dp.set_client_rule(0, rule, line)        # a ClientRule (None removes it); line: what is heavy
    dp.read_heavy()                          # {0: {client, ...}}: newly at or above the line
    dp.client_counts(0, clients)             # {client: its sliding count now}, the rule's unit
    dp.forget_clients(0, clients)            # their counts start over (a ban, an unban)
    dp.set_client_line(0, line)              # N changed
    dp.set_client_limits(0, {client: (units_per_s, safe_units_per_s)})   # the throttled ones
    dp.set_client_bans(0, {client: until_ns})          # CLOCK_MONOTONIC, as now_ns()

The kernel keeps every client's sliding window (limiter.c count_client) and
flags a client whose count reaches the line, so the agent reads the flagged
ones and those it follows, never all.  Each ``set_client_*`` call replaces
the class's whole set.  The kernel drops a banned client until until_ns by
itself, and throttles a client at its safe rate once the class's config is
stale; counts are arrivals (throttled packets too; not what a ban dropped,
nor exempt addresses).

Every failure a user can cause raises :class:`DatapathError` with one line.
"""
from __future__ import annotations

import array
import contextlib
import ctypes as ct
import errno
import ipaddress
import math
import os
import socket
import struct
import sys
import time
from itertools import repeat
from functools import partial, reduce
from operator import add, itemgetter
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Sequence

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netns import popns, pushns

from drl.agent.model import Mode, SLOW_START_Bps
from drl.agent import abi
from drl.agent.kernel import caps, lock
from drl.agent import logs
from drl.agent.kernel.bucket import bucket_times, unit_times
from drl.agent.classes.spec import ClassRule
from drl.agent.clients.table import Client, ClientRule, sliding_count
from drl.agent.kernel.classify import EMPTY, ClassifyError, Compiled, Prefix, compile_rules, key_prefixlen
from drl.agent.kernel import loader, rtnetlink
from drl.agent.kernel.maps import DatapathError
from drl.agent.kernel.rtnetlink import (NLM_F_DUMP as _NLM_F_DUMP, TCA_BPF_ID as _TCA_BPF_ID, TCA_KIND as _TCA_KIND,
                                 TCA_OPTIONS as _TCA_OPTIONS, TCMSG as _TCMSG, attrs as _attrs)

try:
    from bcc import BPF
    from bcc.libbcc import lib
except ImportError:  # reported by Datapath() as a DatapathError
    BPF = lib = None

BPF_DIR = loader.BPF_DIR   # bench/per_packet.py points it at another revision's bpf/
FILTER_PRIO = 0xD1       # our filter's identity at clsact egress: prio + handle + name
FILTER_HANDLE = 0xD1
FILTER_NAME = "drl_egress"
EGRESS_PARENT = "ffff:fff3"
INGRESS_NAME = "drl_ingress"   # same prio + handle, on clsact ingress
INGRESS_PARENT = "ffff:fff2"

# Bucket depth rule, measured in bench/README.md ("bucket depth"): a policer
# has no queue, so cubic TCP needs the bucket to absorb its sawtooth: with
# rate x 300 ms TCP gets >= 0.97 of tbf's goodput at 10-200 Mbit/s with 1-16
# flows (x 100 ms: 0.78 of the rate with 4 flows; x 200 ms: 0.96 with 1).
# Never less than 128 KiB, two 64 KiB GSO skbs.
BURST_TIME_S = 0.300
BURST_FLOOR = 128 * 1024
FLOOR_RATE_Bps = SLOW_START_Bps   # a bucket never refills slower (FPS slow start)
# A throttled client's bucket depth (set_client_limits): in bytes a class's (default_burst:
# TCP needs rate x 300 ms of it); packets and connections get 300 ms of their rate too, and
# at least CLIENT_BURST_UNITS: a few at once after a pause, then the rate.
CLIENT_BURST_UNITS = 4
# A throttled client's bucket is written again only for a rate that moved more than this
# (set_client_limits): a share that wobbles with demand every tick keeps its bucket's state.
CLIENT_RATE_CHANGE = 0.01


_MODES = frozenset(Mode)
# One counter lookup by id (~5 us) costs as much as batch-reading ~8-11 entries
# (0.5-0.7 us each, sums included; 2 CPUs, measured side by side).
BATCH_READ_ENTRIES = 8
# Counters and FlowSamples are made by the thousand a tick: tuple.__new__ straight, not the
# NamedTuple's own __new__, a Python function that costs as much again
_new_tuple = tuple.__new__
log = logs.get_logger("drl.agent")


# Counters, FlowKey and FlowSample are NamedTuples: immutable like the frozen dataclasses, at
# a third of the cost to make (timeit, 7 fields: 228 vs 717 ns; one per class and flow every
# tick), and a FlowKey hashes in C (the estimator looks every flow up by its key every tick).
class Counters(NamedTuple):
    passed_bytes: int = 0
    passed_packets: int = 0
    dropped_bytes: int = 0
    dropped_packets: int = 0
    throttled_bytes: int = 0      # refused by a client's bucket: neither passed nor dropped
    throttled_packets: int = 0
    banned_bytes: int = 0         # from or to a banned client, egress and ingress
    banned_packets: int = 0


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


def default_burst(rate_Bps: float) -> int:
    """Bucket depth for a rate: rate x 300 ms, at least 128 KiB."""
    return max(BURST_FLOOR, int(rate_Bps * BURST_TIME_S))


def now_ns() -> int:
    """The clock of bpf_ktime_get_ns (CLOCK_MONOTONIC), for config timestamps."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Datapath:
    """bpf/limiter.c loaded for one interface; see the module docstring."""

    def __init__(self, iface: str, classes: Sequence[ClassRule] = (), *, class_ids: Sequence[int] | None = None,
                 max_flows: int = abi.MAX_FLOWS, max_classes: int = abi.MAX_CLASSES, max_clients: int = abi.MAX_CLIENTS,
                 gossip_port: int | None = None, gossip_mark: int = abi.GOSSIP_MARK, registry_port: int | None = None,
                 drop_action: str = "stolen", floor_rate_Bps: int = FLOOR_RATE_Bps, netns: str | None = None,
                 exclusive: bool = False):
        _check_privileges()
        if drop_action not in abi.DROP_ACTIONS:
            raise DatapathError(f"drop action {drop_action!r}: use one of {', '.join(abi.DROP_ACTIONS)}")
        rules = list(classes) or [ClassRule()]
        class_ids = list(range(len(rules)) if not classes or class_ids is None else class_ids)
        if len(class_ids) != len(rules):
            raise DatapathError("class_ids must give one class id per class rule")
        self.iface = iface
        self.max_classes = max_classes
        self._floor_rate_Bps = floor_rate_Bps
        self._floor_times = bucket_times(floor_rate_Bps, floor_rate_Bps)   # the floor's bucket: 1 s of its rate
        self._quota_seq = 0
        self._pending: dict | None = None          # inside batch(): class id -> its slot in _staged
        self._staged = None                         # batch()'s key and value arrays, made once
        self._counter_bufs = None                   # read_counters' batch lookup arrays, made once
        self._flow_reader = None                    # read_flows' _FlowReader, made on first use
        self._rules = EMPTY
        self._client_rules: dict[int, ClientRule] = {}                 # class id -> its rule
        self._client_limits: dict[int, dict[Client, tuple[float, float]]] = {}   # as written
        self._client_bans: dict[int, dict[Client, int]] = {}
        self._client_lines: dict[int, float] = {}                     # class id -> its heavy line
        self._client_gen = 1                        # settings.client_gen: never 0 (limiter.c clients)
        self._rules_gen = 0                         # settings.rules_gen: 0 until the first rules
        self._heavy_bufs = None                     # read_heavy's batch arrays, made on first use
        gossip_port, gossip_mark = _gossip_exemption(gossip_port, gossip_mark)
        registry_port = registry_port if gossip_port else 0     # the registry's exemption is the gossip mark's
        self._lock = self._bpf = None
        self._attached = False
        self._created_clsact = False
        self._reattached = 0
        self._attach_error: str | None = None
        self._ipr, self._nl, self._ifindex = _open_link(iface, netns)
        try:
            if exclusive:    # before the compile: a refused second agent costs nothing and touches nothing
                try:
                    self._lock = lock.InterfaceLock.take(iface, self._ifindex, netns)
                except lock.LockError as e:
                    raise DatapathError(str(e)) from None
            self._bpf = _compile(max_flows, max_classes, max_clients, abi.DROP_ACTIONS[drop_action])
            self._fn, self._fn_in = self._load(FILTER_NAME), self._load(INGRESS_NAME)
            self._prog_id, self._in_prog_id = _prog_id(self._fn.fd), _prog_id(self._fn_in.fd)
            self._write_settings(sample_prob=abi.PROB_ONE, gossip_port=gossip_port, gossip_mark=gossip_mark,
                                 registry_port=registry_port or 0, mark_masks=EMPTY.mark_masks, dst_lengths=EMPTY.dst_lengths,
                                 src_lengths=EMPTY.src_lengths, client_gen=self._client_gen)
            self.set_rules(list(zip(rules, class_ids)))
        except BaseException:
            if self._bpf is not None:
                self._bpf.cleanup()
            self._release()
            raise

    # -- attach / detach ------------------------------------------------------

    def attach(self) -> None:
        """Add clsact (unless present) and our egress filter, replacing an earlier one of ours;
        our ingress filter too while a class bans, else none (not even a killed agent's)."""
        try:
            if not self._has_clsact():
                self._ipr.tc("add", "clsact", self._ifindex)
                self._created_clsact = True
            elif self._filters() and all(_is_ours(f) for f in self._filters()):
                # an agent killed before it could detach left its clsact with only
                # its filter on it: ours to replace now and to remove on detach
                self._created_clsact = True
            self._ipr.tc("replace-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=EGRESS_PARENT,
                         prio=FILTER_PRIO, fd=self._fn.fd, name=FILTER_NAME, direct_action=True)
            self._set_ingress(self._bans_anywhere())
        except NetlinkError as e:
            raise DatapathError(f"cannot attach to {self.iface}: {e.args[-1]} "
                                "(kernel needs sch_ingress/clsact and cls_bpf)") from None
        self._attached = True

    def detach(self) -> None:
        """Remove our filters, and the clsact qdisc if attach created it."""
        if not self._attached:
            return
        if not self._has_clsact():  # removed under us (or the interface is gone): nothing left
            self._attached = self._created_clsact = False
            return
        try:
            self._del_filter(EGRESS_PARENT)
            self._del_filter(INGRESS_PARENT)
            if self._created_clsact and not self._other_filters():
                self._ipr.tc("del", "clsact", self._ifindex)
        except NetlinkError as e:
            raise DatapathError(f"cannot detach from {self.iface}: {e.args[-1]}") from None
        self._attached = self._created_clsact = False

    def ensure_attached(self) -> bool:
        """Is our program still the egress filter?  If not, attach again; True when it had to.

        One netlink dump of the egress filters (~0.1 ms, bench in
        tests/kernel/test_takeover.py) each call, and one of the ingress filters while a
        class bans: the agent calls it every tick.
        A filter that is gone, a clsact that is gone, or another program at our
        prio/handle all count as detached.  Never raises: a failed attach is
        logged once (``event=reattach_failed``) and kept in ``attachment`` until a
        later call succeeds.
        """
        if not self._attached and self._attach_error is None:
            return False                     # never attached (or detached on purpose)
        if self._attach_error is None and self._ours_attached():
            return False
        try:
            self.attach()
        except DatapathError as e:
            if self._attach_error != str(e):
                log.error("reattach_failed", iface=self.iface, error=str(e))
            self._attach_error = str(e)
            self._attached = False
            return False
        self._attach_error = None
        self._reattached += 1
        log.warning("reattached", iface=self.iface, times=self._reattached, reason="filter_missing")
        return True

    @property
    def attachment(self) -> dict:
        """For the agent's status: state attached|failed|detached, re-attach count, last error."""
        state = "failed" if self._attach_error else "attached" if self._attached else "detached"
        return {"state": state, "reattached": self._reattached, "error": self._attach_error}

    def close(self, detach: bool = True) -> None:
        """Detach and let go of everything.  ``detach=False`` (an agent that failed) leaves
        the filters, and the program and maps they hold, enforcing as a killed agent's do:
        each class falls back to its safe rate when its config goes stale, and the next
        Datapath on the interface replaces them (attach)."""
        try:
            if detach:
                self.detach()
        finally:
            self._attached = False      # not ours any more: a second close() detaches nothing
            self._bpf.cleanup()
            self._release()

    def _release(self) -> None:
        self._ipr.close()
        self._nl.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "Datapath":
        self.attach()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- configuration --------------------------------------------------------

    def set_class(self, class_id: int, mode: Mode, rate_Bps: float = 0, burst_bytes: int | None = None,
                  drop_probability: float = 0.0, safe_rate_Bps: float | None = None,
                  timeout_s: float | None = None, quota_bytes: int | None = None, shadow: bool = False,
                  shape_prio: int = 0) -> None:
        """Write a class's config in one map update, stamped with now_ns().

        burst_bytes None = default_burst(rate_Bps).  After timeout_s without a
        new set_class or heartbeat the kernel enforces safe_rate_Bps (None = no limit).
        quota_bytes: bytes the class may pass from now on (every call with a
        number restarts the allowance); None = no quota.  shadow: what the
        policy refuses is counted as dropped but passes (bpf/limiter.c refuse).
        shape_prio: not 0 = shape mode, the class's packets pass with this skb->priority
        (their HTB class, agent/kernel/shaper.py) instead of being policed (bpf/limiter.c shape).
        """
        self._check_class(class_id)
        if rate_Bps < 0 or not 0.0 <= drop_probability <= 1.0:
            raise DatapathError(f"class {class_id}: rate must be >= 0 and drop probability in [0, 1]")
        if mode not in _MODES:
            raise DatapathError(f"class {class_id}: mode {mode!r} is not one of {sorted(_MODES)}")
        cfg = self._config_slot(class_id)     # after every check: a batch writes each slot it handed out
        cfg.mode = int(mode)
        cfg.rate_Bps = int(rate_Bps)
        cfg.burst_bytes = int(burst_bytes if burst_bytes is not None else default_burst(rate_Bps))
        cfg.drop_prob = round(drop_probability * abi.PROB_ONE)
        cfg.safe_rate_Bps = abi.UNLIMITED if safe_rate_Bps is None else int(safe_rate_Bps)
        cfg.safe_burst_bytes = default_burst(safe_rate_Bps or 0)
        cfg.timeout_ns = 0 if not timeout_s else int(timeout_s * 1e9)
        cfg.floor_rate_Bps = self._floor_rate_Bps
        # the same three buckets as time, so the program never divides (agent/kernel/bucket.py)
        cfg.ns_per_byte, cfg.depth_ns = bucket_times(cfg.rate_Bps, cfg.burst_bytes)
        if cfg.safe_rate_Bps != abi.UNLIMITED:
            cfg.safe_ns_per_byte, cfg.safe_depth_ns = bucket_times(cfg.safe_rate_Bps, cfg.safe_burst_bytes)
        cfg.floor_ns_per_byte, cfg.floor_depth_ns = self._floor_times
        cfg.shadow = int(shadow)
        cfg.shape_prio = int(shape_prio)
        if class_id in self._client_rules:       # the client rule is set_client_rule's, kept here
            self._fill_client(cfg, class_id)     # (a fresh slot's client fields are zero: no rule)
        if quota_bytes is not None:
            self._quota_seq = self._quota_seq % (2**32 - 1) + 1   # never 0: 0 means no quota
            cfg.quota_seq, cfg.quota_bytes = self._quota_seq, int(quota_bytes)
        cfg.updated_ns = now_ns()
        if self._pending is None:
            self._bpf[b"config"][ct.c_int(class_id)] = cfg

    def _config_slot(self, class_id: int):
        """A zeroed config for set_class to fill: inside batch(), the class's slot of the
        batch's own key and value arrays (written in place, no copy), else a new Leaf."""
        table = self._bpf[b"config"]
        if self._pending is None:
            return table.Leaf()
        if self._staged is None:
            self._staged = ((ct.c_int * self.max_classes)(), (table.Leaf * self.max_classes)())
        keys, values = self._staged
        slot = self._pending.setdefault(class_id, len(self._pending))
        keys[slot] = class_id
        ct.memset(ct.byref(values, slot * ct.sizeof(table.Leaf)), 0, ct.sizeof(table.Leaf))
        return values[slot]

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

    def set_sample_probability(self, p: float) -> None:
        """Chance that a packet of an untracked flow adds it to the flow table (FPS's resampleprob)."""
        if not 0.0 <= p <= 1.0:
            raise DatapathError(f"sample probability {p} is not in [0, 1]")
        self._write_settings(sample_prob=round(p * abi.PROB_ONE))

    def set_rules(self, rules: Sequence[tuple[ClassRule, int]]) -> None:
        """Install ``(rule, class_id)`` pairs in place of the current ones, while packets flow.

        Map updates are atomic per key.  The order, in three steps:

        1. entries that are new or changed are written (unchanged ones are
           not touched);
        2. one settings write: mark masks and prefix lengths;
        3. entries no longer needed are deleted;
        4. one settings write: rules_gen moves on, which ends every class a
           CPU remembered for a flow (limiter.c classify_memo), those found
           during steps 1-3 too.  Nothing changed: nothing is written.

        So a newly listed mask or length has all its entries at once, and no
        probe is spent on entries already gone.  A class whose rules did not
        change keeps its packets throughout, and would in any order: its
        entries are never deleted; every entry is, at any moment, the old
        set's or the new set's, and either carries, after its own rules,
        those of every prefix covering it in that set, its rules among them;
        a probe of a length without entries (yet, or any more) only misses;
        and its mask or length keeps its slot (agent/kernel/classify.py), so a
        packet that reads the slots while they are copied (an array update
        is a copy in place, not atomic) sees every slot old or new, each of
        which lists it.
        """
        for _, class_id in rules:
            self._check_class(class_id)
        try:
            new = compile_rules(rules, self._rules)
        except ClassifyError as e:
            raise DatapathError(str(e)) from None
        old = self._rules
        if new == old:
            return
        tables = self._classification_tables(old, new)
        for table, encode, before, after in tables:
            for key, entry in after.items():
                if before.get(key) != entry:
                    table[encode(table.Key(), key)] = _encode_list(table.Leaf(), entry)
        slots = {name: getattr(new, name) for name in ("mark_masks", "dst_lengths", "src_lengths")
                 if getattr(new, name) != getattr(old, name)}
        if slots:
            self._write_settings(**slots)
        for table, encode, before, after in tables:
            for key in before.keys() - after.keys():
                del table[encode(table.Key(), key)]
        # last: the classes each CPU remembered per flow (limiter.c classify_memo) end here
        self._rules_gen = _next_gen(self._rules_gen)
        self._write_settings(rules_gen=self._rules_gen)
        self._rules = new

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

    # -- clients --------------------------------------------------------------

    def set_client_rule(self, class_id: int, rule: ClientRule | None, line: float = 0.0) -> None:
        """Give a class its client rule (None: none); ``line``: a client whose sliding count
        reaches it is flagged for read_heavy (0: none is).  A rule with another key, measure
        or window than the class's last one drops its limits, bans and counts (they were for
        other clients or units); None drops them and the exempt prefixes.  The ingress filter
        goes on with the first rule whose action is ban and off after the last (when attached)."""
        self._check_class(class_id)
        old = self._client_rules.get(class_id)
        if rule is None and old is None:
            return
        if rule is not None and not 0 < round(rule.window_s * 1e9) <= abi.MAX_CLIENT_WINDOW_NS:
            raise DatapathError(f"class {class_id}: a client window of {rule.window_s:g} s is not in "
                                f"(0, {abi.MAX_CLIENT_WINDOW_NS / 1e9 / 3600:.0f} h]")
        self._client_lines[class_id] = line
        if rule == old:
            self._write_client_config(class_id)
            return
        if rule is None or old is None or (rule.key, rule.measure, rule.window_s) != (old.key, old.measure,
                                                                                       old.window_s):
            self.set_client_limits(class_id, {})
            self.set_client_bans(class_id, {})
            if old is not None:
                self._forget_class_clients(class_id)
        banning = self._bans_anywhere()
        table = self._bpf[b"client_exempt"]
        before = {_exempt_key(class_id, net) for net in (old.exempt if old else ())}
        after = {_exempt_key(class_id, net) for net in (rule.exempt if rule else ())}
        for key in after - before:          # new prefixes first: no packet of the class misses one
            self._put(table, table.Key.from_buffer_copy(key), table.Leaf(1))
        if rule is None:
            del self._client_rules[class_id]
            del self._client_lines[class_id]
        else:
            self._client_rules[class_id] = rule
        self._write_client_config(class_id)
        for key in before - after:
            del table[table.Key.from_buffer_copy(key)]
        if self._attached and self._bans_anywhere() != banning:
            try:
                self._set_ingress(not banning)
            except NetlinkError as e:
                raise DatapathError(f"cannot {'detach from' if banning else 'attach to'} {self.iface} ingress: "
                                    f"{e.args[-1]}") from None

    def set_client_limits(self, class_id: int, limits: Mapping[Client, tuple[float, float]]) -> None:
        """The class's throttled clients, in place of the last set: client -> (rate, safe rate)
        in the rule's unit per second (bytes, packets, connections).  The kernel charges each
        packet of a listed client to the client's bucket (limiter.c throttle), at the safe
        rate once the class's config is stale; depth: default_burst for bytes, 300 ms of the
        rate and at least CLIENT_BURST_UNITS otherwise.  A new client's bucket starts empty;
        a listed one is written again only when a rate moved by more than CLIENT_RATE_CHANGE,
        keeping its credit or debt (the kernel converts it to the new price)."""
        rule = self._rule_for(class_id, limits)
        table, old = self._bpf[b"client_limits"], self._client_limits.get(class_id, {})
        written, fresh = {}, False
        for client, rates in limits.items():
            _check_client(class_id, client, rule)
            rates = _rates(class_id, client, rates)
            was = old.get(client)
            if was is not None and all(abs(r - w) <= CLIENT_RATE_CHANGE * w for r, w in zip(rates, was)):
                written[client] = was
                continue
            key = table.Key.from_buffer_copy(_client_key(class_id, client))
            leaf = table.get(key) if was is not None else None
            if leaf is None:
                leaf, fresh = table.Leaf(), True
                leaf.gcra.tat = now_ns()           # empty: the client is over its share already
            leaf.ns_per_unit, leaf.depth_ns = _client_bucket(rule.measure, rates[0])
            leaf.safe_ns_per_unit, leaf.safe_depth_ns = _client_bucket(rule.measure, rates[1])
            self._put(table, key, leaf)
            written[client] = rates
        self._replace_clients(class_id, self._client_limits, written, table)
        if fresh:
            self._new_client_gen()

    def set_client_bans(self, class_id: int, bans: Mapping[Client, int]) -> None:
        """The class's banned clients, in place of the last set: client -> until_ns
        (CLOCK_MONOTONIC, now_ns()'s clock).  The kernel drops every packet to or from one
        (egress, and ingress while attached) until then, by itself: a ban ends on time with
        no agent running."""
        rule = self._rule_for(class_id, bans)
        table, old = self._bpf[b"client_bans"], self._client_bans.get(class_id, {})
        changed = False
        for client, until_ns in bans.items():
            _check_client(class_id, client, rule)
            if not 0 <= until_ns < 2**64:
                raise DatapathError(f"class {class_id}: ban until {until_ns!r} is not a CLOCK_MONOTONIC time in ns")
            if old.get(client) != until_ns:
                self._put(table, table.Key.from_buffer_copy(_client_key(class_id, client)), table.Leaf(until_ns))
                changed = True
        self._replace_clients(class_id, self._client_bans, dict(bans), table)
        if changed:
            self._new_client_gen()

    def _new_client_gen(self) -> None:
        """After new bans or throttled clients: every client is checked against them again
        (a client's count remembers the generation it was found clear in: limiter.c clients)."""
        self._client_gen = _next_gen(self._client_gen)
        self._write_settings(client_gen=self._client_gen)

    def _rule_for(self, class_id: int, entries: Mapping) -> ClientRule | None:
        self._check_class(class_id)
        rule = self._client_rules.get(class_id)
        if rule is None and entries:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        return rule

    def _replace_clients(self, class_id: int, sets: dict, new: dict, table) -> None:
        """Make ``new`` (written already) the class's set in ``sets``: the class's flag in its
        config follows (set after new entries, cleared before the last go), then the clients
        no longer listed are deleted."""
        had, gone = class_id in sets, sets.get(class_id, {}).keys() - new.keys()
        if new:
            sets[class_id] = new
        else:
            sets.pop(class_id, None)
        if bool(new) != had:
            self._write_client_config(class_id)
        for client in gone:
            del table[table.Key.from_buffer_copy(_client_key(class_id, client))]

    def _fill_client(self, cfg, class_id: int) -> None:
        """The class's client fields of a config (limiter.h class_config.client_*)."""
        rule = self._client_rules.get(class_id)
        if rule is None:
            cfg.client_side = cfg.client_measure = cfg.client_flags = cfg.client_mask4 = 0
            cfg.client_mask6[:] = [0] * 4
            cfg.client_window_ns = cfg.client_line = 0
            return
        cfg.client_side = abi.CLIENT_SIDES[rule.key.side]
        cfg.client_measure = abi.MEASURES[rule.measure]
        cfg.client_flags = (abi.CLIENT_HAS_LIMITS * (class_id in self._client_limits)
                            | abi.CLIENT_HAS_BANS * (class_id in self._client_bans)
                            | abi.CLIENT_HAS_EXEMPT * bool(rule.exempt))
        cfg.client_mask4 = _words(_mask(rule.key.v4_len, 4) + bytes(12))[0]
        cfg.client_mask6[:] = _words(_mask(rule.key.v6_len, 16))
        cfg.client_window_ns = round(rule.window_s * 1e9)
        cfg.client_line = math.ceil(self._client_lines.get(class_id, 0.0))

    def _write_client_config(self, class_id: int) -> None:
        """The class's client fields into its config as it is (its own fields and stamp
        unchanged); inside batch(), into the slot set_class staged too."""
        table = self._bpf[b"config"]
        if self._pending is not None and class_id in self._pending:
            self._fill_client(self._staged[1][self._pending[class_id]], class_id)
        cfg = table[ct.c_int(class_id)]
        self._fill_client(cfg, class_id)
        table[ct.c_int(class_id)] = cfg

    @staticmethod
    def _put(table, key, leaf) -> None:
        try:
            table[key] = leaf
        except Exception as e:      # bcc raises bare Exception; E2BIG: the map is full
            raise DatapathError(f"cannot write {table._name.decode()} ({table.max_entries} entries): "
                                f"{str(e).splitlines()[0]}") from None

    # -- reading --------------------------------------------------------------

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
        rows = list(map(_new_tuple, repeat(Counters), zip(*columns)))     # ids 0..max(wanted)
        return {i: rows[i] for i in wanted}

    def _counter_buffers(self, table):
        if self._counter_bufs is None:
            self._counter_bufs = ((table.Key * self.max_classes)(), (table.Leaf * self.max_classes)())
        return self._counter_bufs

    def read_bypass(self) -> Counters:
        """Packets no class matched, exempt ones and non-IP (passed_* only)."""
        return _sum_cpus(self._bpf[b"bypass_counters"][ct.c_int(0)])

    def read_flows(self, full: bool = False) -> dict[int, list[FlowSample]]:
        """Every tracked flow, by class id: the entries visited since the last call
        (one batch syscall), the whole table every few seconds or when ``full``.  A flow
        whose entry did not change since the last call is the same FlowSample, in the same
        place (_FlowReader)."""
        if self._flow_reader is None:
            self._flow_reader = _FlowReader(self._bpf[b"flows"], self._bpf[b"flows_visited"])
        return self._flow_reader.read(full)

    def read_quota(self, class_id: int) -> int | None:
        """Bytes the class may still pass, None when it has no quota."""
        self._check_class(class_id)
        cfg = self._bpf[b"config"][ct.c_int(class_id)]
        if not cfg.quota_seq:
            return None
        bucket = self._bpf[b"buckets"][ct.c_int(class_id)]
        return bucket.quota_left if bucket.quota_seq == cfg.quota_seq else cfg.quota_bytes

    @property
    def prog_fd(self) -> int:
        """The loaded program's fd (bench/datapath.py reads its run-time stats)."""
        return self._fn.fd

    def set_client_line(self, class_id: int, line: float) -> None:
        """The class's heavy line (set_client_rule), when the number of hosts changed."""
        if class_id not in self._client_rules:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        self._client_lines[class_id] = line
        self._write_client_config(class_id)

    def read_heavy(self) -> dict[int, set[Client]]:
        """Per class, the clients the program flagged since the last call: their count reached
        the class's line (once a window each), read and emptied in one batch syscall."""
        table = self._bpf[b"client_heavy"]
        if self._heavy_bufs is None:
            self._heavy_bufs = ((table.Key * table.max_entries)(), (table.Leaf * table.max_entries)())
        keys, values = self._heavy_bufs
        n = _lookup_batch(table, keys, values, table.max_entries, delete=True)
        out: dict[int, set[Client]] = {}
        for class_id, client in _client_keys(keys, n):
            if class_id in self._client_rules:       # else flagged before the class's rule went
                out.setdefault(class_id, set()).add(client)
        return out

    def client_counts(self, class_id: int, clients: Iterable[Client]) -> dict[Client, float]:
        """The sliding counts now of those of ``clients`` the kernel has a window for, in the
        rule's unit (agent/clients/table.py sliding_count on the entry's two windows): one lookup
        each, for the few the agent follows."""
        rule = self._client_rules.get(class_id)
        if rule is None:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        table, window_ns, now = self._bpf[b"client_windows"], round(rule.window_s * 1e9), now_ns()
        index, out = now // window_ns, {}
        key, w = table.Key(), table.Leaf()            # one of each, refilled: ~1 us a client
        fd, lookup, key_p, w_p = table.map_fd, lib.bpf_lookup_elem, ct.byref(key), ct.byref(w)
        for client in clients:
            _CLIENT_KEY.pack_into(key, 0, class_id, 4 if len(client) == 4 else 6, client)
            if lookup(fd, key_p, w_p) < 0:
                continue                              # no window: nothing counted, or aged out
            prev, cur = (w.prev, w.cur) if w.index == index else (w.cur, 0) if w.index + 1 == index else (0, 0)
            out[client] = sliding_count(prev, cur, (now - index * window_ns) / 1e9, rule.window_s)
        return out

    def forget_clients(self, class_id: int, clients: Iterable[Client]) -> None:
        """Their windows go: the next packet of each starts its count from 0."""
        table = self._bpf[b"client_windows"]
        for client in clients:
            try:
                del table[table.Key.from_buffer_copy(_client_key(class_id, client))]
            except KeyError:
                pass

    def _forget_class_clients(self, class_id: int) -> None:
        """Every window of the class (its rule changed or went: a slot's next class starts
        from nothing); one batch read of the map, rare."""
        table = self._bpf[b"client_windows"]
        keys, values = (table.Key * table.max_entries)(), (table.Leaf * table.max_entries)()
        n = _lookup_batch(table, keys, values, table.max_entries)
        self.forget_clients(class_id, [client for owner, client in _client_keys(keys, n) if owner == class_id])

    @property
    def ingress_prog_fd(self) -> int:
        """drl_ingress's fd, loaded whether attached or not (bench/clients.py runs it)."""
        return self._fn_in.fd

    now_ns = staticmethod(now_ns)

    # -- internals ------------------------------------------------------------

    def _load(self, name: str):
        try:
            return self._bpf.load_func(name.encode(), BPF.SCHED_CLS)
        except Exception as e:  # bcc raises bare Exception with the verifier log on stderr
            raise DatapathError(f"kernel refused the BPF program: {str(e).splitlines()[0]}") from None

    def _has_clsact(self) -> bool:
        try:
            return any(q.get_attr("TCA_KIND") == "clsact" for q in self._ipr.get_qdiscs(self._ifindex))
        except NetlinkError:  # the interface is gone
            return False

    def _ours_attached(self) -> bool:
        """Our program at our prio/handle on clsact egress (and ingress, while a class bans):
        one dump each on the raw netlink socket (a missing clsact or interface dumps nothing)."""
        try:
            if _egress_prog_id(self._nl, self._ifindex) != self._prog_id:
                return False
            return not self._bans_anywhere() or \
                _egress_prog_id(self._nl, self._ifindex, INGRESS_PARENT) == self._in_prog_id
        except OSError:
            return False

    def _set_ingress(self, on: bool) -> None:
        """Our ingress filter on (replacing an earlier one of ours) or off; NetlinkError."""
        if on:
            self._ipr.tc("replace-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=INGRESS_PARENT,
                         prio=FILTER_PRIO, fd=self._fn_in.fd, name=INGRESS_NAME, direct_action=True)
        else:
            self._del_filter(INGRESS_PARENT)

    def _del_filter(self, parent: str) -> None:
        try:
            self._ipr.tc("del-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=parent, prio=FILTER_PRIO)
        except NetlinkError as e:
            if e.code != errno.ENOENT:  # someone removed our filter already, or it was never there
                raise

    def _bans_anywhere(self) -> bool:
        """Some class has a ban rule: the ingress filter is wanted."""
        return any(rule.action == "ban" for rule in self._client_rules.values())

    def _filters(self) -> list:
        return [f for parent in (0xFFFFFFF2, 0xFFFFFFF3)      # clsact ingress, egress
                for f in self._ipr.get_filters(self._ifindex, parent=parent) if f.get_attr("TCA_KIND")]

    def _other_filters(self) -> bool:
        """Did someone add filters to the clsact we created (then it stays)?"""
        return bool(self._filters())

    def _check_class(self, class_id: int) -> None:
        if not 0 <= class_id < self.max_classes:
            raise DatapathError(f"class {class_id} does not exist (have 0..{self.max_classes - 1})")

    def _write_settings(self, **fields) -> None:
        table = self._bpf[b"settings"]
        s = table[ct.c_int(0)]
        for name, value in fields.items():
            if isinstance(value, int):
                setattr(s, name, value)
            else:
                getattr(s, name)[:] = value
        table[ct.c_int(0)] = s

    def _classification_tables(self, old: Compiled, new: Compiled) -> list:
        """(bcc table, key encoder, old entries, new entries) per classification map."""
        return [(self._bpf[b"marks"], _encode_mark, old.marks, new.marks),
                (self._bpf[b"dst_nets"], _encode_prefix, old.dst, new.dst),
                (self._bpf[b"src_nets"], _encode_prefix, old.src, new.src)]


def _is_ours(f) -> bool:
    """Part of what attach() made: our priority (tcm_info = prio << 16 | protocol), with our
    handle or handle 0 (the kernel also lists the priority itself as a handle-0 entry)."""
    return f["handle"] in (0, FILTER_HANDLE) and f["info"] >> 16 == FILTER_PRIO


# rtnetlink, for the per-tick check (ensure_attached): pyroute2 takes ~0.2 ms to dump the
# egress filters and does not decode TCA_BPF_ID; this reads the one id in ~30 us.
_RTM_NEWTFILTER, _RTM_GETTFILTER = 44, 46


def _egress_prog_id(sock: socket.socket, ifindex: int, parent: str = EGRESS_PARENT) -> int | None:
    """The program id of the bpf filter at our prio/handle on clsact egress (or ``parent``), or None."""
    seq = rtnetlink.send(sock, _RTM_GETTFILTER, _NLM_F_DUMP,
                         _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, int(parent.replace(":", ""), 16), 0))
    found = None
    for kind, body in rtnetlink.replies(sock, seq):     # an error reply raises OSError: the caller's False
        if kind != _RTM_NEWTFILTER:
            continue
        _, _, handle, _, info = _TCMSG.unpack_from(body)
        if handle == FILTER_HANDLE and info >> 16 == FILTER_PRIO:
            attrs = _attrs(body, _TCMSG.size, len(body))
            bpf = _attrs(attrs.get(_TCA_OPTIONS, b""), 0, len(attrs.get(_TCA_OPTIONS, b"")))
            if attrs.get(_TCA_KIND, b"").rstrip(b"\0") == b"bpf" and len(bpf.get(_TCA_BPF_ID, b"")) == 4:
                found = int.from_bytes(bpf[_TCA_BPF_ID], sys.byteorder)
    return found


def _check_privileges() -> None:
    if BPF is None:
        raise DatapathError("bcc is not installed (Debian/Ubuntu: apt install python3-bpfcc)")
    lacking = caps.missing()
    if lacking:
        raise DatapathError(f"loading the datapath needs {', '.join(lacking)} (root has them; docs/service.md)")


def _open_link(iface: str, netns: str | None) -> tuple[IPRoute, socket.socket, int]:
    """Two rtnetlink sockets in netns (None = ours): pyroute2's, and a raw one for
    ensure_attached's dump; and the interface's index there."""
    if netns and not Path("/var/run/netns", netns).exists():  # pushns would create it
        raise DatapathError(f"no network namespace {netns!r}")
    try:
        if netns:
            pushns(netns)
        try:
            ipr = IPRoute()
            nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        finally:
            if netns:
                popns()
    except OSError as e:
        raise DatapathError(f"cannot enter network namespace {netns!r}: {e.strerror}") from None
    nl.settimeout(1.0)
    found = ipr.link_lookup(ifname=iface)
    if not found:
        ipr.close()
        nl.close()
        where = f" in netns {netns}" if netns else ""
        raise DatapathError(f"no interface {iface!r}{where}")
    return ipr, nl, found[0]


def _compile(max_flows: int, max_classes: int, max_clients: int, drop_action: int):
    return loader.compile_program(max_flows, max_classes, max_clients, drop_action, BPF_DIR)


def _lookup_batch(table, keys, values, limit: int, delete: bool = False) -> int:
    """Up to ``limit`` entries of ``table`` into the caller's ``keys`` and ``values`` arrays
    (kept across ticks: bcc's items_lookup_batch allocates both at the map's full size and
    yields entry by entry); how many.  A hash map may take several calls.  ``delete``: and
    delete them (BPF_MAP_LOOKUP_AND_DELETE_BATCH)."""
    batch = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
    total, token = 0, ct.c_uint32(0)
    while total < limit:
        count = ct.c_uint32(limit - total)
        res = batch(table.map_fd, ct.byref(token) if total else None, ct.byref(token),
                    ct.byref(keys, ct.sizeof(table.Key) * total), ct.byref(values, ct.sizeof(table.Leaf) * total),
                    ct.byref(count))
        total += count.value
        if res:
            if ct.get_errno() != errno.ENOENT:     # ENOENT: the map ended: done
                raise DatapathError(f"reading a BPF map failed: {os.strerror(ct.get_errno())}")
            break
        if not count.value:
            break
    return total


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
        n = _lookup_batch(self.visited, self.keys, self.values, self.visited.max_entries, delete=True)
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
        flow (limiter.c visit)."""
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
        samples[at[1]] = _new_tuple(FlowSample, (samples[at[1]].key, *row))

    def _append(self, raw: bytes, row: tuple) -> None:
        samples, raws = self.samples.setdefault(row[0], []), self.raws.setdefault(row[0], [])
        self.place[raw] = (row[0], len(samples))
        samples.append(_new_tuple(FlowSample, (_decode_key(self.table.Key.from_buffer_copy(raw)), *row)))
        raws.append(raw)

    def _read_all(self) -> None:
        """The whole table: flows we know keep their order (and their FlowSample while
        their entry did not change), flows gone from it leave, new ones come last."""
        rows = dict(self._rows(_lookup_batch(self.table, self.keys, self.values, self.table.max_entries)))
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
                kept.append(sample if sample[1:] == row else _new_tuple(FlowSample, (sample.key, *row)))
                kept_raws.append(raw)
            if kept:
                self.samples[class_id], self.raws[class_id] = kept, kept_raws
        for raw, row in rows.items():
            self._append(raw, row)


def _summed_columns(table, buffers, n: int) -> list[list[int]]:
    """Class ids 0..n-1's counters summed over CPUs, one list per Counters field, indexed
    by class id: one batch lookup of the per-CPU array's first n entries, the sums done by
    map(add) in C (0.6 ms for 1,000 entries on 2 CPUs, 0.9 with zip and sum; bcc's
    items_lookup_batch with a Counters per entry and CPU took ~4 ms side by side)."""
    keys, values = buffers
    got = _lookup_batch(table, keys, values, n)
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


def _sum_cpus(per_cpu) -> Counters:
    return Counters(*(sum(getattr(c, name) for c in per_cpu) for name in Counters._fields))


def _next_gen(gen: int) -> int:
    """The generation after ``gen`` in a __u32 settings field: never 0 (limiter.c reads 0
    as "none yet")."""
    return gen % (2**32 - 1) + 1


def _gossip_exemption(port: int | None, mark: int) -> tuple[int, int]:
    """settings.gossip_port and gossip_mark: (0, 0) exempts nothing."""
    if port is None:
        return 0, 0
    if not 0 < port < 65536:
        raise DatapathError(f"gossip port {port} is not in 1-65535")
    if not 0 < mark < 2**32:
        raise DatapathError(f"gossip mark {mark:#x} is not in 0x1-0xffffffff (0 would exempt unmarked traffic)")
    return port, mark


def _prog_id(fd: int) -> int:
    """The kernel's id of a loaded program (what a tc filter dump reports as TCA_BPF_ID)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("prog_id:"):
                return int(line.split()[1])
    raise DatapathError("cannot read the loaded program's id (kernel too old: no prog_id in fdinfo)")


def _words(packed: bytes) -> list[int]:
    """16 address bytes as the four __u32 the kernel compares (network order in memory)."""
    return [int.from_bytes(packed[i:i + 4], sys.byteorder) for i in range(0, 16, 4)]


def _net_words(net) -> tuple[list[int], list[int]]:
    if net is None:
        return [0] * 4, [0] * 4
    pad = bytes(16 - len(net.network_address.packed))
    return _words(net.network_address.packed + pad), _words(net.netmask.packed + pad)


def _encode_rule(leaf, rule: ClassRule, class_id: int):
    for name, net in (("src", rule.src), ("dst", rule.dst)):
        addr, mask = _net_words(net)
        getattr(leaf, name)[:] = addr
        getattr(leaf, name + "_mask")[:] = mask
    for name, bits in (("sport", 0xFFFF), ("dport", 0xFFFF), ("family", 0xFF), ("proto", 0xFF)):
        value = getattr(rule, name) or 0         # None / 0: any
        setattr(leaf, name, value)
        setattr(leaf, name + "_mask", bits if value else 0)
    leaf.class_id = class_id
    return leaf


def _encode_list(leaf, entry):
    leaf.n = len(entry)
    for slot, (rule, class_id) in zip(leaf.rules, entry):
        _encode_rule(slot, rule, class_id)
    return leaf


def _encode_prefix(key, prefix: Prefix):
    """A net_key: the one a packet in the prefix builds at its length (limiter.c net_key)."""
    key.prefixlen = key_prefixlen(prefix)
    if prefix is not None:
        key.family = prefix.version
        key.addr[:] = _net_words(prefix)[0]
    return key


def _encode_mark(key, mask_mark: tuple[int, int]):
    key.mask, key.mark = mask_mark
    return key


# limiter.h client_key, as read_heavy unpacks it
_CLIENT_KEY = struct.Struct("=IB3x16s")
_EXEMPT_KEY = struct.Struct("=III16s")


def _client_keys(keys, n: int) -> Iterable[tuple[int, Client]]:
    """(class id, client) of the first n limiter.h client_key structs of a batch read."""
    for class_id, family, addr in _CLIENT_KEY.iter_unpack(ct.string_at(keys, n * _CLIENT_KEY.size)):
        yield class_id, addr[:4] if family == 4 else addr


def _client_key(class_id: int, client: Client) -> bytes:
    """limiter.h client_key of a class's client."""
    return _CLIENT_KEY.pack(class_id, 4 if len(client) == 4 else 6, client)


def _exempt_key(class_id: int, net) -> bytes:
    """limiter.h exempt_key of an exempt prefix: class id and family are the first 64 bits compared."""
    return _EXEMPT_KEY.pack(64 + net.prefixlen, class_id, net.version, net.network_address.packed)


def _mask(length: int, size: int) -> bytes:
    """The first ``length`` bits of ``size`` bytes set: a prefix's netmask, packed."""
    return (((1 << length) - 1) << (8 * size - length)).to_bytes(size, "big")


def _check_client(class_id: int, client: Client, rule: ClientRule) -> None:
    if not isinstance(client, bytes) or not rule.key.owns(client):
        raise DatapathError(f"class {class_id}: {client!r} is not a client of key {rule.key} "
                            "(4 or 16 packed bytes, host bits zero)")


def _rates(class_id: int, client: Client, rates) -> tuple[float, float]:
    rate, safe = (float(r) for r in rates)
    if not (0.0 <= rate < math.inf and 0.0 <= safe < math.inf):
        raise DatapathError(f"class {class_id}: client {client.hex()} rates {rates!r} are not two finite rates >= 0")
    return rate, safe


def _client_bucket(measure: str, rate: float) -> tuple[int, int]:
    """(ns_per_unit, depth_ns) of a throttled client's bucket (set_client_limits)."""
    depth = default_burst(rate) if measure == "bytes" else max(CLIENT_BURST_UNITS, rate * BURST_TIME_S)
    return unit_times(rate, depth, abi.MAX_NS_PER_UNIT[measure])


def _addr(family: int, words) -> str:
    packed = b"".join(int(w).to_bytes(4, sys.byteorder) for w in words)
    return str(ipaddress.ip_address(packed[:4] if family == 4 else packed))


def _decode_key(k) -> FlowKey:
    return FlowKey(k.family, k.proto, _addr(k.family, k.src), _addr(k.family, k.dst), k.sport, k.dport)
