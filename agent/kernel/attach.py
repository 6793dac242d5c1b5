"""Datapath's attach lifecycle: clsact and our tc filters on the interface, kept there.

``attach`` adds clsact (unless present) and our egress filter (our ingress one too
while a class bans), ``detach`` removes exactly that, and ``ensure_attached`` checks
every tick, with one raw netlink dump, that our program is still the filter, and which
other filters run before it (a lower prio: whatever they classify never reaches ours,
so it passes unlimited).  With ``filter_ahead="reassert"`` ours is added again where it runs
first (agent/kernel/filters.py says where; ``event=filter_reasserted``); another tool's
filter is never removed.  What stays ahead (``"warn"``, or before a pref-1 classifier
nothing can precede) is reported: ``attachment["ahead"]``, ``event=filter_ahead``.  Once a
second it also compares the interface's tx bytes with what the program counted
(agent/kernel/unseen.py): ``attachment["unseen_bps"]``, ``event=unseen_traffic``.

Ours runs first, and the program ends the walk (TC_ACT_OK): a filter behind ours never
sees what ours passed.  So moving ours ahead of another tool's filter takes that filter
out of the path of drl's traffic; ``--filter-ahead warn`` is for hosts where it must stay.

The interface is followed by its name: deleted and made again (a new ifindex, no clsact),
it is found by ``ensure_attached`` the first tick our filter is missing, and everything
that names the index moves there (the interface lock, the filters).  The program and its
maps do not: nothing in bpf/ knows an ifindex, so the classes' configs, buckets and
counters carry over as they are.
"""
from __future__ import annotations

import errno
import socket
import time
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netns import popns, pushns

from drl.agent import logs
from drl.agent.kernel import filters, rtnetlink
from drl.agent.kernel.maps import DatapathError

FILTER_PRIO = 0xD1       # our filter's identity at clsact egress: handle + name (the prio it starts at)
FILTER_HANDLE = 0xD1
FILTER_NAME = "drl_egress"
EGRESS_PARENT = "ffff:fff3"
INGRESS_NAME = "drl_ingress"   # FILTER_PRIO + handle, on clsact ingress
INGRESS_PARENT = "ffff:fff2"
FILTER_AHEAD = ("reassert", "warn")    # --filter-ahead: move ours ahead of others' egress filters, or only say so
log = logs.get_logger("drl.agent")


class Attachment:
    """Datapath's part for the filters.  Uses the Datapath's ``_ipr``, ``_nl``, ``_ifindex``,
    ``iface``, ``_relock`` (its interface lock onto a new index), the loaded programs (``_fn``,
    ``_fn_in``, ``_prog_id``, ``_in_prog_id``), its client part (``_bans_anywhere``: is the
    ingress filter wanted) and its counters (``read_counters``, ``read_bypass``); keeps
    ``_attached``, ``_created_clsact``, ``_reattached``, ``_recreated``, ``_ahead``,
    ``_attach_error``, ``_prio`` (where our egress filter is), ``_filter_ahead``, ``_reasserted``
    and ``_unseen``."""

    def attach(self) -> None:
        """Add clsact (unless present) and our egress filter, replacing an earlier one of ours;
        our ingress filter too while a class bans, else none (not even a killed agent's)."""
        try:
            if not self._has_clsact():
                self._ipr.tc("add", "clsact", self._ifindex)
                self._created_clsact = True
            elif self._filters() and all(self._is_ours(f) for f in self._filters()):
                # an agent killed before it could detach left its clsact with only
                # its filter on it: ours to replace now and to remove on detach
                self._created_clsact = True
            self._prio = self._left_prio()
            self._add_egress(self._prio)
            self._set_ingress(self._bans_anywhere())
        except NetlinkError as e:
            if e.code == errno.ENODEV:      # deleted between the lookup and now: not the kernel's lack
                raise DatapathError(_gone(self.iface)) from None
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
            self._del_filter(EGRESS_PARENT, self._prio)
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
        prio/handle all count as detached.  Then the interface is looked up by its
        name (one netlink get): made again under a new index, we move there
        (``event=iface_recreated``) within the tick that finds it; gone, the
        error says so.  Never raises: a failed attach is logged once
        (``event=reattach_failed``) and kept in ``attachment`` until a later call
        succeeds.
        """
        if not self._attached and self._attach_error is None:
            return False                     # never attached (or detached on purpose)
        if self._attach_error is None and self._ours_attached():
            return False
        try:
            old = self._follow_name()
            self.attach()
        except DatapathError as e:
            if self._attach_error != str(e):
                log.error("reattach_failed", iface=self.iface, error=str(e))
            self._attach_error = str(e)
            self._attached = False
            return False
        self._attach_error = None
        if old is not None:
            self._recreated += 1
            log.warning("iface_recreated", iface=self.iface, old_ifindex=old, new_ifindex=self._ifindex,
                        times=self._recreated)
        else:
            self._reattached += 1
            log.warning("reattached", iface=self.iface, times=self._reattached, reason="filter_missing")
        return True

    def _follow_name(self) -> int | None:
        """The interface named ``iface`` now: its old index when it is a new one (we hold its
        lock and use its index from here on), None when it is the same; DatapathError when
        there is none, or another agent holds the new one's lock."""
        try:
            found = self._ipr.link_lookup(ifname=self.iface)
        except NetlinkError:
            found = []
        if not found:
            raise DatapathError(_gone(self.iface))
        if found[0] == self._ifindex:
            return None
        self._relock(found[0])
        old, self._ifindex = self._ifindex, found[0]
        self._created_clsact = False         # the old one went with the old interface
        return old

    @property
    def attachment(self) -> dict:
        """For the agent's status: state attached|failed|detached, re-attach count, last error,
        the interface's index and how often it was found made again under its name, the
        prios of others' filters ahead of ours, our pref and how often it moved ahead of
        them, and the rate the interface sent that the program never counted (bits/s) and
        whether it is past the tolerance (agent/kernel/unseen.py)."""
        state = "failed" if self._attach_error else "attached" if self._attached else "detached"
        return {"state": state, "reattached": self._reattached, "error": self._attach_error,
                "ifindex": self._ifindex, "recreated": self._recreated, "ahead": list(self._ahead),
                "pref": self._prio, "reasserted": self._reasserted, "unseen_bps": round(self._unseen.bps),
                "unseen": self._unseen.on}

    def _has_clsact(self) -> bool:
        try:
            return any(q.get_attr("TCA_KIND") == "clsact" for q in self._ipr.get_qdiscs(self._ifindex))
        except NetlinkError:  # the interface is gone
            return False

    def _ours_attached(self) -> bool:
        """Our program at our prio/handle on clsact egress (and ingress, while a class bans):
        one dump each on the raw netlink socket (a missing clsact or interface dumps nothing)."""
        try:
            egress = filters.dump(self._nl, self._ifindex, _EGRESS)
            ours = filters.find(egress, self._prio, FILTER_HANDLE)
            if ours is None or ours.prog != self._prog_id:
                return False
            ahead = filters.ahead(egress, self._prio, FILTER_HANDLE)
            if ahead and self._filter_ahead == "reassert":
                ahead = self._reassert(egress, ahead)
            self._note_ahead(ahead)
            self._watch_unseen()
            if not self._bans_anywhere():
                return True
            ingress = filters.find(filters.dump(self._nl, self._ifindex, _INGRESS), FILTER_PRIO, FILTER_HANDLE)
            return ingress is not None and ingress.prog == self._in_prog_id
        except OSError:
            return False

    def _reassert(self, egress: list, ahead: tuple[int, ...]) -> tuple[int, ...]:
        """Ours added again where it runs before every other egress filter (the old one removed
        after, so that no packet passes unlimited in between, except at the same pref); what is
        still ahead afterwards: ``ahead`` if no pref runs first or the kernel refused."""
        to = filters.place(egress, self._prio, FILTER_HANDLE)
        if to is None:
            return ahead
        old = self._prio
        try:
            if to == old:                          # pref 1 in a cls_bpf of others: ours to the head
                self._del_filter(EGRESS_PARENT, old)
            self._add_egress(to)
            self._prio = to
            if to != old:
                self._del_filter(EGRESS_PARENT, old)
        except NetlinkError as e:
            log.error("reassert_failed", iface=self.iface, prios=",".join(map(str, ahead)), error=e.args[-1])
            return ahead
        self._reasserted += 1
        log.warning("filter_reasserted", iface=self.iface, prios=",".join(map(str, ahead)), old=old, ours=to,
                    times=self._reasserted)
        return ()

    def _left_prio(self) -> int:
        """Where an egress filter of ours already is (this agent's, or a killed one's it moved
        ahead of others): replaced in place it keeps its position; else FILTER_PRIO."""
        try:
            egress = filters.dump(self._nl, self._ifindex, _EGRESS)
        except OSError:
            return FILTER_PRIO
        return next((f.prio for f in egress if f.handle == FILTER_HANDLE and f.kind == "bpf"
                     and f.name == FILTER_NAME), FILTER_PRIO)

    def _add_egress(self, prio: int) -> None:
        self._ipr.tc("replace-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=EGRESS_PARENT,
                     prio=prio, fd=self._fn.fd, name=FILTER_NAME, direct_action=True)

    def _watch_unseen(self) -> None:
        """Once a window: the interface's tx bytes against the program's counts; log a change."""
        now = time.monotonic()
        if not self._unseen.due(now):
            return
        counts = {i: c.passed_bytes for i, c in self.read_counters().items()}
        counts["bypass"] = self.read_bypass().passed_bytes
        if not self._unseen.observe(now, self._ifindex, rtnetlink.tx_bytes(self._nl, self._ifindex), counts):
            return
        if self._unseen.on:
            log.warning("unseen_traffic", iface=self.iface, unseen_bps=round(self._unseen.bps),
                        error="bytes left the interface that drl's program never counted: they bypass the limit")
        else:
            log.info("unseen_traffic_gone", iface=self.iface)

    def _note_ahead(self, ahead: tuple[int, ...]) -> None:
        """Log when filters of others start or stop running before ours on egress."""
        if ahead == self._ahead:
            return
        if ahead:
            log.warning("filter_ahead", iface=self.iface, prios=",".join(map(str, ahead)), ours=self._prio,
                        reassert=self._filter_ahead == "reassert",
                        error="what these egress filters classify never reaches drl's and is not limited")
        else:
            log.info("filter_ahead_gone", iface=self.iface)
        self._ahead = ahead

    def _set_ingress(self, on: bool) -> None:
        """Our ingress filter on (replacing an earlier one of ours) or off; NetlinkError."""
        if on:
            self._ipr.tc("replace-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=INGRESS_PARENT,
                         prio=FILTER_PRIO, fd=self._fn_in.fd, name=INGRESS_NAME, direct_action=True)
        else:
            self._del_filter(INGRESS_PARENT)

    def _del_filter(self, parent: str, prio: int = FILTER_PRIO) -> None:
        try:
            self._ipr.tc("del-filter", "bpf", self._ifindex, FILTER_HANDLE, parent=parent, prio=prio)
        except NetlinkError as e:
            if e.code != errno.ENOENT:  # someone removed our filter already, or it was never there
                raise

    def _filters(self) -> list:
        return [f for parent in (0xFFFFFFF2, 0xFFFFFFF3)      # clsact ingress, egress
                for f in self._ipr.get_filters(self._ifindex, parent=parent) if f.get_attr("TCA_KIND")]

    def _other_filters(self) -> bool:
        """Did someone add filters to the clsact we created (then it stays)?"""
        return bool(self._filters())

    def _is_ours(self, f) -> bool:
        """Part of what attach() made: our priority (tcm_info = prio << 16 | protocol), with our
        handle or handle 0 (the kernel also lists the priority itself as a handle-0 entry)."""
        return f["handle"] in (0, FILTER_HANDLE) and f["info"] >> 16 in (FILTER_PRIO, self._prio)


def _gone(iface: str) -> str:
    return f"interface {iface} is gone; waiting for it to come back"


_EGRESS, _INGRESS = 0xFFFFFFF3, 0xFFFFFFF2


def open_link(iface: str, netns: str | None) -> tuple[IPRoute, socket.socket, int]:
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
