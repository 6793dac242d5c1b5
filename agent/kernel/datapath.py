"""The datapath: compile bpf/limiter.c with bcc, attach it at tc egress (and ingress), talk to its maps.

``Datapath`` is the one object the agent holds; it is made of one part per concern,
each in its own module of this package, the only ones that import bcc:

* ``loader``       the program's source as bcc must see it, the compile, the entry points
* ``attach``       clsact and our tc filters: attach, detach, ensure_attached
* ``class_maps``   config, buckets, counters, heartbeat: set_class, batch, reset_class, read_*
* ``rule_maps``    the classification maps: set_rules
* ``client_maps``  the per-client maps: set_client_*, read_heavy, client_counts, forget_clients
* ``flows``        the flow table: read_flows, FlowKey, FlowSample
* ``maps``         what they share: DatapathError, now_ns, batch reads

Everything above the kernel package (agent/service/daemon.py) uses the small interface
below (agent/kernel/interface.py), which a test double can implement too::

    from drl.agent.model import Mode
    from drl.agent.classes.spec import parse_classes

    with Datapath("eth0", parse_classes(["dport=80,proto=tcp"]), gossip_port=7470) as dp:
        dp.set_class(0, Mode.BUCKET, rate_Bps=6.25e6, safe_rate_Bps=3e6, timeout_s=5)
        ...
        dp.read_counters()[0].passed_bytes

Interface (all rates bytes/s, sizes bytes, times seconds unless named _ns):

* ``Datapath(iface, classes=(), *, class_ids=None, max_flows=4096, max_classes=4096,
  max_clients=abi.MAX_CLIENTS, gossip_port=None, gossip_mark=abi.GOSSIP_MARK, registry_port=None, drop_action="stolen",
  floor_rate_Bps=FLOOR_RATE_Bps, netns=None, exclusive=False, filter_ahead="reassert")``
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
  replaced by another program) attach again and return True.  The interface
  is followed by name: deleted and made again under a new index, the lock
  (with ``exclusive``) and the filters move there; the program and maps stay.  Never raises:
  a failed re-attach logs once and shows in ``attachment`` (state
  ``failed``; "interface eth0 is gone; ..." while none has the name), and is
  tried again on the next call.
  Another tool's egress filter found running before ours is reported, and with
  ``filter_ahead="reassert"`` ours is added again ahead of it (agent/kernel/filters.py).
* ``attachment``: ``{"state": "attached"|"failed"|"detached", "reattached": N,
  "error": None|str, "ifindex": N, "recreated": N, "ahead": [pref, ...], "pref": N,
  "reasserted": N, "unseen_bps": N, "unseen": bool}`` for the agent's status.
* ``set_class(class_id, mode, rate_Bps=0, burst_bytes=None, drop_probability=0.0,
  safe_rate_Bps=None, timeout_s=None, quota_bytes=None, shadow=False, shape_prio=0,
  safe_burst_bytes=None)``: one write, stamped
  with ``now_ns()``, all or nothing: a value its C type cannot hold (inf, NaN, negative, past
  2^64) raises DatapathError and the class keeps the config it had.  Until a class is set it
  passes everything.
* ``heartbeat()``: the agent is alive; every class's config counts as fresh from now, as if
  it had just been written again (bpf/police.h stale).  One write for all classes.
* ``set_sample_probability(p)``: chance that a new flow enters the flow table.
* ``read_counters(class_ids=None) -> dict[int, Counters]`` (None: the classes the
  rules name), ``read_bypass() -> Counters``,
  ``read_flows(full=False) -> dict[int, list[FlowSample]]`` (by class id),
  ``read_quota(class_id) -> int | None``, ``now_ns()``, ``prog_fd`` and ``ingress_prog_fd``
  (for bench stats).
* ``default_burst(rate_Bps)``: the bucket depth used when burst_bytes is None.

Per-client throttle and ban (docs/clients.md; a client is agent/clients/table.py's
``Client``, its packed prefix: 4 or 16 bytes, host bits zero)::

    dp.set_client_rule(0, rule, line, hold)  # a ClientRule (None removes it); line: what is heavy, held at hold
    dp.read_heavy()                          # {0: {client, ...}}: newly at or above the line
    dp.client_counts(0, clients)             # {client: its sliding count now}, the rule's unit
    dp.forget_clients(0, clients)            # their counts start over (a ban, an unban)
    dp.set_client_line(0, line, hold)        # N changed
    dp.drop_holds(0, clients)                # flagged clients the agent does not hold
    dp.set_client_limits(0, {client: (units_per_s, safe_units_per_s)})   # the throttled ones
    dp.set_client_bans(0, {client: until_ns})          # CLOCK_MONOTONIC, as now_ns()

The kernel keeps every client's sliding window (bpf/clients.h count_client) and
flags a client whose count reaches the line, so the agent reads the flagged
ones and those it follows, never all.  Each ``set_client_*`` call replaces
the class's whole set.  The kernel drops a banned client until until_ns by
itself, and throttles a client at its safe rate once the class's config is
stale; counts are arrivals (throttled packets too; not what a ban dropped,
nor exempt addresses).

Every failure a user can cause raises :class:`DatapathError` with one line.
"""
from __future__ import annotations

import ctypes as ct
from typing import Sequence

from drl.agent import abi
from drl.agent.classes.spec import ClassRule
from drl.agent.clients.rules import Client, ClientRule
from drl.agent.kernel import caps, loader, lock
from drl.agent.kernel.attach import (FILTER_AHEAD, FILTER_HANDLE, FILTER_NAME, FILTER_PRIO, INGRESS_NAME, Attachment,
                                     open_link)
from drl.agent.kernel.bucket import bucket_times
from drl.agent.kernel.class_maps import FLOOR_RATE_Bps, ClassMaps, Counters, default_burst
from drl.agent.kernel.classify import EMPTY
from drl.agent.kernel.client_maps import ClientMaps
from drl.agent.kernel.flows import FlowKey, FlowMaps, FlowSample
from drl.agent.kernel.maps import DatapathError, now_ns
from drl.agent.kernel.rule_maps import RuleMaps
from drl.agent.kernel.unseen import UnseenMeter

# What other modules, tests and benches import from here, wherever it is defined now
__all__ = ["Datapath", "DatapathError", "Counters", "FlowKey", "FlowSample", "now_ns", "default_burst",
           "FILTER_HANDLE", "FILTER_PRIO"]
_prog_id = loader.prog_id          # tests/kernel/test_takeover.py
# The bpf/ a Datapath compiles: loader.BPF_DIR; bench/per_packet.py points it at another revision's.
BPF_DIR = loader.BPF_DIR


class Datapath(Attachment, ClassMaps, RuleMaps, ClientMaps, FlowMaps):
    """bpf/limiter.c loaded for one interface; see the module docstring.  This class owns
    the state every part shares (the bcc module, the netlink sockets, the settings map)
    and the lifetime; each part's own state is set up here too, named in its docstring."""

    def __init__(self, iface: str, classes: Sequence[ClassRule] = (), *, class_ids: Sequence[int] | None = None,
                 max_flows: int = abi.MAX_FLOWS, max_classes: int = abi.MAX_CLASSES, max_clients: int = abi.MAX_CLIENTS,
                 gossip_port: int | None = None, gossip_mark: int = abi.GOSSIP_MARK, registry_port: int | None = None,
                 drop_action: str = "stolen", floor_rate_Bps: int = FLOOR_RATE_Bps, netns: str | None = None,
                 exclusive: bool = False, filter_ahead: str = "reassert"):
        _check_privileges()
        if drop_action not in abi.DROP_ACTIONS:
            raise DatapathError(f"drop action {drop_action!r}: use one of {', '.join(abi.DROP_ACTIONS)}")
        if filter_ahead not in FILTER_AHEAD:
            raise DatapathError(f"filter ahead {filter_ahead!r}: use one of {', '.join(FILTER_AHEAD)}")
        rules = list(classes) or [ClassRule()]
        class_ids = list(range(len(rules)) if not classes or class_ids is None else class_ids)
        if len(class_ids) != len(rules):
            raise DatapathError("class_ids must give one class id per class rule")
        self.iface = iface
        self.max_classes = max_classes
        self._lock = self._bpf = None
        # class_maps
        self._floor_rate_Bps = floor_rate_Bps
        self._floor_times = bucket_times(floor_rate_Bps, floor_rate_Bps)   # the floor's bucket: 1 s of its rate
        self._quota_seq = 0
        self._pending: dict | None = None          # inside batch(): class id -> its slot in _staged
        self._staged = None                         # batch()'s key and value arrays, made once
        self._counter_bufs = None                   # read_counters' batch lookup arrays, made once
        # rule_maps
        self._rules = EMPTY
        self._rules_gen = 0                         # settings.rules_gen: 0 until the first rules
        # client_maps
        self._client_rules: dict[int, ClientRule] = {}                 # class id -> its rule
        self._client_limits: dict[int, dict[Client, tuple[float, float]]] = {}   # as written
        self._client_bans: dict[int, dict[Client, int]] = {}
        self._client_lines: dict[int, tuple[float, float]] = {}       # class id -> its line and hold
        self._client_gen = 1                        # settings.client_gen: never 0 (clients.h clients)
        self._heavy_bufs = None                     # read_heavy's batch arrays, made on first use
        # flows
        self._flow_reader = None                    # read_flows' _FlowReader, made on first use
        # attach
        self._attached = False
        self._created_clsact = False
        self._reattached = 0
        self._recreated = 0                         # times the interface came back under a new index
        self._ahead: tuple[int, ...] = ()          # prios of others' egress filters that run before ours
        self._prio = FILTER_PRIO                    # where our egress filter is (moved ahead of others')
        self._filter_ahead = filter_ahead
        self._reasserted = 0
        self._unseen = UnseenMeter()
        self._attach_error: str | None = None
        self._netns = netns
        gossip_port, gossip_mark = _gossip_exemption(gossip_port, gossip_mark)
        registry_port = registry_port if gossip_port else 0     # the registry's exemption is the gossip mark's
        self._ipr, self._nl, self._ifindex = open_link(iface, netns)
        try:
            if exclusive:    # before the compile: a refused second agent costs nothing and touches nothing
                try:
                    self._lock = lock.InterfaceLock.take(iface, self._ifindex, netns)
                except lock.LockError as e:
                    raise DatapathError(str(e)) from None
            self._bpf = loader.compile_program(max_flows, max_classes, max_clients,
                                               abi.DROP_ACTIONS[drop_action], BPF_DIR)
            self._fn, self._fn_in = loader.load(self._bpf, FILTER_NAME), loader.load(self._bpf, INGRESS_NAME)
            self._prog_id, self._in_prog_id = loader.prog_id(self._fn.fd), loader.prog_id(self._fn_in.fd)
            self._write_settings(sample_prob=abi.PROB_ONE, gossip_port=gossip_port, gossip_mark=gossip_mark,
                                 registry_port=registry_port or 0, mark_masks=EMPTY.mark_masks, dst_lengths=EMPTY.dst_lengths,
                                 src_lengths=EMPTY.src_lengths, client_gen=self._client_gen)
            self.set_rules(list(zip(rules, class_ids)))
        except BaseException:
            if self._bpf is not None:
                self._bpf.cleanup()
            self._release()
            raise

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

    def _relock(self, ifindex: int) -> None:
        """The interface was made again as ``ifindex``: hold its lock instead of the old one's
        (attach's ensure_attached); DatapathError while another agent holds the new one."""
        if self._lock is None:
            return
        try:
            held = lock.InterfaceLock.take(self.iface, ifindex, self._netns)
        except lock.LockError as e:
            raise DatapathError(str(e)) from None
        self._lock.release()
        self._lock = held

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

    def set_sample_probability(self, p: float) -> None:
        """Chance that a packet of an untracked flow adds it to the flow table (FPS's resampleprob)."""
        if not 0.0 <= p <= 1.0:
            raise DatapathError(f"sample probability {p} is not in [0, 1]")
        self._write_settings(sample_prob=round(p * abi.PROB_ONE))

    @property
    def prog_fd(self) -> int:
        """The loaded program's fd (bench/datapath.py reads its run-time stats)."""
        return self._fn.fd

    @property
    def ingress_prog_fd(self) -> int:
        """drl_ingress's fd, loaded whether attached or not (bench/clients.py runs it)."""
        return self._fn_in.fd


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

    now_ns = staticmethod(now_ns)


def _check_privileges() -> None:
    if loader.BPF is None:
        raise DatapathError("bcc is not installed (Debian/Ubuntu: apt install python3-bpfcc)")
    lacking = caps.missing()
    if lacking:
        raise DatapathError(f"loading the datapath needs {', '.join(lacking)} (root has them; docs/service.md)")


def _gossip_exemption(port: int | None, mark: int) -> tuple[int, int]:
    """settings.gossip_port and gossip_mark: (0, 0) exempts nothing."""
    if port is None:
        return 0, 0
    if not 0 < port < 65536:
        raise DatapathError(f"gossip port {port} is not in 1-65535")
    if not 0 < mark < 2**32:
        raise DatapathError(f"gossip mark {mark:#x} is not in 0x1-0xffffffff (0 would exempt unmarked traffic)")
    return port, mark
