"""Shape mode's queueing side: an HTB root qdisc with one class per shaped class.

    sh = Shaper("eth0", state_dir="/var/lib/drl")
    prio = sh.set_rate(class_id, 1.25e6)   # HTB class for it (made on first use), rate 10 Mbit/s
    dp.set_class(class_id, Mode.BUCKET, rate_Bps=1.25e6, shape_prio=prio)
    sh.discard(class_id)                   # back to police: its HTB class goes
    sh.close()                             # the root qdisc that was there before, restored

In shape mode (``enforce = "shape"``, docs/config.md "Shaping mode") the BPF
program still classifies, counts and tallies a class's packets, but instead
of policing them it sets ``skb->priority`` to the class's HTB handle
(:func:`handle`) and passes them (bpf/police.h ``shape``).  HTB reads the
priority before any filter: a priority whose major is the HTB's handle and
that names one of its leaf classes is that class (sch_htb.c htb_classify);
our clsact egress filter runs in __dev_queue_xmit before the root qdisc's
enqueue, so HTB sees what the program set.  Everything else (unclassified
traffic, police-mode classes) goes to the default class ``d1d1:ffff`` at
:data:`UNLIMITED_Bps`, so it is not shaped.

The tree, made on the first :meth:`Shaper.set_rate` and removed with the last
class (police-only agents never touch the root qdisc)::

    d1d1:  htb default 0xffff                       (replaces the root qdisc)
    ├── d1d1:ffff  rate = ceil = UNLIMITED_Bps      unlimited traffic, leaf pfifo (HTB's own)
    └── d1d1:<id+1>  rate = ceil = local limit      one per shaped class; leaf bfifo <id+1>:
                     burst = cburst = the host's depth (agent/burst.py: 4 ms of the rate, at
                     least 66 KiB, within its share of the class's burst budget),
                     bfifo limit = queue_limit(rate, burst): the burst + 20 ms of the rate

Pure parts (tested in tests/unit/kernel/test_shaper.py): :func:`handle`,
:func:`leaf_handle`, :func:`shape_rate` (the slow-start floor police mode
has), :func:`needs_update` (a rate or burst is rewritten when it falls by more than
:data:`DOWN_STEP` or rises by more than :data:`RATE_STEP`), :func:`queue_limit`.

Restoring: the root qdisc found on attach is remembered (kind, handle and its
options as the kernel dumped them) and written to ``state_dir/shape-IFACE.json``.
On close (or when the last shaped class goes) ours is deleted; a default
root (handle 0: noqueue on veth, mq/pfifo_fast/fq_codel on NICs) comes back
by itself, any other is added again from the dumped options (a user's tbf
comes back with its rate, burst and limit).  Only the root qdisc itself is
restored: a tree of classes or child qdiscs under it is refused at attach
(:class:`ShaperError`), since it cannot be put back.  After a SIGKILL our
HTB stays (unlimited traffic still flows through the default class; shaped
classes fall back to police's fail-safe rate once their config goes stale);
the next start finds its HTB at the root, takes the previous root from the
state file, and starts over from it.
"""
from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netns import popns, pushns

from drl.agent import logs
from drl.agent.burst import mode_depth
from drl.agent.kernel.rtnetlink import (NLM_F_CREATE, NLM_F_REPLACE, RTM_DELQDISC, RTM_DELTCLASS, RTM_NEWQDISC,
                                        TC_H_ROOT, TCA_KIND, TCA_OPTIONS, has_children, root_qdisc, tc_request)
from drl.agent.model import SLOW_START_Bps

HTB_MAJOR = 0xD1D1               # our HTB's handle d1d1: ("drl", like the gossip mark)
DEFAULT_MINOR = 0xFFFF           # d1d1:ffff, the class of unlimited traffic
MAX_SHAPED_ID = 0x7FFE           # leaf majors id+1 stay in 1..0x7fff, below the kernel's automatic handles
UNLIMITED_Bps = 100e9 / 8        # the default class: far above what a host sends (or the link's speed, if more)
# Rewrite an HTB rate when the limit rose by more than 1 % (each write is ~1 ms of netlink),
# but when it fell by more than 0.1 %: a host left up to 1 % above its limit, on every host at
# once, spends a shaped class's burst budget (100 ms of G) in 10 s (docs/agent.md "The promise")
RATE_STEP = 0.01
DOWN_STEP = 0.001
# leaf bfifo limit: the burst (at least a whole 64 KiB GSO skb: a bfifo drops an skb that does not
# fit, all its segments at once, and TCP then waits for a timer to send it again) and 20 ms of the
# rate.  At 20 Mbit/s (bench/RESULTS.md "Shape's queue"): 50 ms (tbf's `latency 50ms`) put a 10 KB
# fetch behind cubic bulk flows at p99 229 ms, tbf 179; 20 ms 119, tbf 176.  Shorter is worse with
# BBR, whose flows at times fill any queue: 5 ms cost fetches 340-360 ms in those runs (local drops
# and their timers), 20 ms 172; one GSO skb alone starved BBR's bulk flows to 1.3 of 20 Mbit/s
QUEUE_TIME_S = 0.020
# HTB's DRR quantum, given so the kernel does not derive it from rate/r2q (and warn when
# that is out of 1000..200000); our classes never borrow, so it only sets the turn size
QUANTUM = 60_000

log = logs.get_logger("drl.agent")


class ShaperError(RuntimeError):
    """The HTB side cannot be set up; one line."""


def handle(class_id: int) -> int:
    """The HTB class (and skb->priority) of a datapath class: TC_H_MAKE(d1d1, class_id + 1)."""
    if not 0 <= class_id <= MAX_SHAPED_ID:
        raise ShaperError(f"class slot {class_id} cannot be shaped (slots 0..{MAX_SHAPED_ID})")
    return HTB_MAJOR << 16 | (class_id + 1)


def leaf_handle(class_id: int) -> int:
    """The leaf bfifo's handle under a class's HTB class: (class_id + 1):0."""
    return (handle(class_id) & 0xFFFF) << 16


def shape_rate(limit_Bps: float) -> int:
    """The HTB rate for a local limit: never below police's slow-start floor (SLOW_START_Bps),
    so a limit of 0 still lets a new flow's SYN and a starved flow's retransmissions out."""
    return int(max(limit_Bps, SLOW_START_Bps))


def needs_update(current_Bps: float | None, wanted_Bps: float) -> bool:
    """Rewrite the HTB class: it has no rate yet, or the wanted one is more than DOWN_STEP
    below it or more than RATE_STEP above it (never left above a limit, seldom rewritten)."""
    return (current_Bps is None or wanted_Bps > current_Bps * (1 + RATE_STEP)
            or wanted_Bps < current_Bps * (1 - DOWN_STEP))


def queue_limit(rate_Bps: float, burst_bytes: int) -> int:
    """Bytes the leaf bfifo holds: QUEUE_TIME_S of the rate plus the burst (>= one GSO skb)."""
    return int(rate_Bps * QUEUE_TIME_S) + burst_bytes


class Shaper:
    """The HTB tree on one interface; see the module docstring.  Nothing is touched until
    the first :meth:`set_rate`."""

    def __init__(self, iface: str, *, state_dir: str | None = None, netns: str | None = None,
                 unlimited_Bps: float | None = None):
        self.iface, self.netns = iface, netns
        self._state = Path(state_dir) / f"shape-{iface}.json" if state_dir else None
        self._unlimited_Bps = unlimited_Bps
        self._rates: dict[int, tuple[int, int]] = {}      # class id -> (HTB rate, burst) written
        self._previous: dict | None = None        # the root qdisc before ours; None: not attached
        self._ipr = self._nl = None
        self._ifindex = 0
        self._errors: dict[int | None, str] = {}   # last error logged, per class id (None: the tree)

    # -- what the daemon calls ------------------------------------------------------------

    def set_rate(self, class_id: int, limit_Bps: float, burst_bytes: int | None = None) -> int:
        """Shape class_id at limit_Bps with burst_bytes (None: the mode's own depth, agent/burst.py);
        its skb->priority, or 0 when it cannot be shaped (logged once; the caller polices the
        class instead)."""
        try:
            prio = handle(class_id)
            if self._previous is None:
                self._attach()
            rate = shape_rate(limit_Bps)
            burst = burst_bytes if burst_bytes is not None else mode_depth(rate, "shape")
            now = self._rates.get(class_id)
            if now is None or needs_update(now[0], rate) or needs_update(now[1], burst):
                self._write_class(class_id, rate, burst)
                self._rates[class_id] = (rate, burst)
        except (ShaperError, NetlinkError, OSError) as e:
            self._failed(e, class_id)
            return 0
        self._errors.pop(class_id, None)
        return prio

    def discard(self, class_id: int) -> None:
        """class_id is not shaped (any more): remove its HTB class; the last one removes the tree."""
        if class_id not in self._rates:
            return
        del self._rates[class_id]
        try:
            self._delete_class(class_id)
        except OSError as e:
            if e.errno != 2:          # ENOENT: gone already
                self._failed(e, class_id)
        if not self._rates:
            try:
                self.detach()
            except (NetlinkError, OSError) as e:
                self._failed(e)

    def retain(self, class_ids) -> None:
        """Remove the HTB classes of every class id not in class_ids (classes a reload removed)."""
        for class_id in set(self._rates) - set(class_ids):
            self.discard(class_id)

    def ensure_attached(self) -> bool:
        """Is our HTB still the root qdisc?  If not (deleted or replaced by hand), make the tree
        again with every class's rate; True when it had to.  One netlink get."""
        if self._previous is None:
            return False
        try:
            root = root_qdisc(self._nl, self._ifindex)
            if _ours(root):
                return False
            moved = self._follow_name()
            if not moved:
                self._install()
            for class_id, (rate, burst) in self._rates.items():
                self._write_class(class_id, rate, burst)
        except (ShaperError, NetlinkError, OSError) as e:
            self._failed(e)
            return False
        log.warning("shaper_reattached", iface=self.iface,
                    reason="iface_recreated" if moved else "root_qdisc_replaced")
        return True

    def _follow_name(self) -> bool:
        """The interface was deleted and made again under its name (a new ifindex; the datapath
        moves the same way, agent/kernel/attach.py): our tree goes onto the new one, whose own
        root qdisc is the one to restore from now on; True when it did.  ShaperError while
        no interface has the name."""
        found = self._ipr.link_lookup(ifname=self.iface)
        if not found:
            raise ShaperError(f"interface {self.iface} is gone; waiting for it to come back")
        if found[0] == self._ifindex:
            return False
        old, self._ifindex = self._ifindex, found[0]
        try:
            self._attach()
        except BaseException:
            self._ifindex = old     # the next tick finds the new one again and tries once more
            raise
        return True

    def restore_leftover(self) -> bool:
        """A killed agent's HTB (its record in state_dir): put its root qdisc from before back
        now; True when it did.  A record whose HTB is gone is dropped.  Errors are logged."""
        saved = self._saved()
        if self._previous is not None or saved is None:
            return False
        try:
            self._open()
            root = root_qdisc(self._nl, self._ifindex)
            if not _ours(root):
                self._state.unlink(missing_ok=True)
                return False
            log.info("shaper_leftover", iface=self.iface, previous=saved["kind"])
            self._previous = saved
            self.detach()
        except (ShaperError, NetlinkError, OSError) as e:
            self._failed(e)
            return False
        return True

    def detach(self) -> None:
        """Put the root qdisc from before back; idempotent."""
        if self._previous is None:
            return
        previous, self._previous = self._previous, None
        self._rates.clear()
        root = root_qdisc(self._nl, self._ifindex)
        if _ours(root):
            tc_request(self._nl, RTM_DELQDISC, 0, self._ifindex, 0, TC_H_ROOT, [])
        if previous["handle"]:            # not the kernel's default: add it again as dumped
            tc_request(self._nl, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, self._ifindex, previous["handle"],
                       TC_H_ROOT, [(TCA_KIND, previous["kind"].encode() + b"\0"),
                                   (TCA_OPTIONS, bytes.fromhex(previous["options"]))])
        if self._state is not None:
            self._state.unlink(missing_ok=True)
        log.info("shaper_detached", iface=self.iface, restored=previous["kind"])

    def close(self, detach: bool = True) -> None:
        """Put the root qdisc back (unless ``detach`` is False: after a failure our HTB stays, as
        after a SIGKILL, for the next agent to adopt) and close the netlink sockets."""
        try:
            if detach:
                self.detach()       # attached (_previous) implies the sockets are open
        except (NetlinkError, OSError) as e:      # the interface went away with its qdiscs, say
            log.error("shaper_detach_failed", iface=self.iface, error=str(e))
        finally:
            if self._ipr is not None:
                self._ipr.close()
                self._nl.close()
                self._ipr = self._nl = None

    @property
    def rates(self) -> dict[int, int]:
        """HTB rate (bytes/s) written per shaped class id."""
        return {class_id: rate for class_id, (rate, _) in self._rates.items()}

    # -- internals --------------------------------------------------------------------------

    def _failed(self, e: Exception, class_id: int | None = None) -> None:
        msg = str(e.args[-1] if isinstance(e, NetlinkError) else e)
        if self._errors.get(class_id) != msg:
            log.error("shape_failed", iface=self.iface, error=msg)
        self._errors[class_id] = msg

    def _open(self) -> None:
        if self._ipr is not None:
            return
        if self.netns:
            pushns(self.netns)
        try:
            self._ipr = IPRoute()
            self._nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        finally:
            if self.netns:
                popns()
        self._nl.settimeout(1.0)
        found = self._ipr.link_lookup(ifname=self.iface)
        if not found:
            raise ShaperError(f"no interface {self.iface!r}")
        self._ifindex = found[0]

    def _attach(self) -> None:
        """Remember the root qdisc (or a killed agent's record of it), then install ours."""
        self._open()
        root = root_qdisc(self._nl, self._ifindex)
        if _ours(root):
            previous = self._saved() or {"kind": "default", "handle": 0, "options": ""}
            log.info("shaper_leftover", iface=self.iface, previous=previous["kind"])
            tc_request(self._nl, RTM_DELQDISC, 0, self._ifindex, 0, TC_H_ROOT, [])     # its classes too
        elif root is None or root["handle"] == 0:
            previous = {"kind": root["kind"] if root else "default", "handle": 0, "options": ""}
        else:
            # an htb of the user's cannot be added back from its dump (the kernel dumps a
            # version its own init refuses: EINVAL) and its classes are not dumped with it
            if root["kind"] == "htb":
                raise ShaperError(f"{self.iface}'s root qdisc is an htb of its own: shape mode replaces the "
                                  "root and could not restore it (remove it, or use police)")
            if has_children(self._nl, self._ifindex):
                raise ShaperError(f"{self.iface}'s root qdisc {root['kind']} has child qdiscs: shape mode "
                                  "replaces the root and could not restore them (remove them, or use police)")
            previous = root
        if self._state is not None:
            self._state.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._state.with_suffix(".tmp")
            tmp.write_text(json.dumps(previous))
            os.replace(tmp, self._state)
        self._install()
        self._previous = previous
        log.info("shaper_attached", iface=self.iface, previous=previous["kind"])

    def _saved(self) -> dict | None:
        try:
            return json.loads(self._state.read_text()) if self._state else None
        except (OSError, ValueError):
            return None

    def _install(self) -> None:
        """Our HTB as the root (replacing whatever is there) and its default class."""
        self._ipr.tc("replace", "htb", self._ifindex, HTB_MAJOR << 16, default=DEFAULT_MINOR)
        rate = self._unlimited_Bps or max(UNLIMITED_Bps, _link_speed_Bps(self.iface))
        self._ipr.tc("add-class", "htb", self._ifindex, HTB_MAJOR << 16 | DEFAULT_MINOR, parent=HTB_MAJOR << 16,
                     rate=int(rate), ceil=int(rate), burst=mode_depth(rate, "shape"), cburst=mode_depth(rate, "shape"),
                     quantum=QUANTUM)

    def _write_class(self, class_id: int, rate: int, burst: int) -> None:
        """The class and its bfifo, made or changed in place (replace: a half-made class from a
        failed earlier try is completed, not refused)."""
        self._ipr.tc("replace-class", "htb", self._ifindex, handle(class_id), parent=HTB_MAJOR << 16,
                     rate=rate, ceil=rate, burst=burst, cburst=burst, quantum=QUANTUM)
        tc_request(self._nl, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, self._ifindex, leaf_handle(class_id),
                   handle(class_id), [(TCA_KIND, b"bfifo\0"), (TCA_OPTIONS, struct.pack("=I", queue_limit(rate, burst)))])

    def _delete_class(self, class_id: int) -> None:
        """Raw: pyroute2's htb plugin wants a rate to encode even a delete.  The leaf goes with it."""
        tc_request(self._nl, RTM_DELTCLASS, 0, self._ifindex, handle(class_id), HTB_MAJOR << 16, [])


def _link_speed_Bps(iface: str) -> float:
    try:
        return max(0, int(Path(f"/sys/class/net/{iface}/speed").read_text())) * 1e6 / 8
    except (OSError, ValueError):
        return 0.0


def _ours(root: dict | None) -> bool:
    """The root qdisc is our HTB (this agent's, or a killed one's)."""
    return bool(root) and root["kind"] == "htb" and root["handle"] >> 16 == HTB_MAJOR
