"""Acknowledged pairwise transfers with link counters: the conservation core of GDRL,
fill ratio and DQMP.

A node's :class:`Ledger` is what it holds (parts of a rate, gdrl.PARTS the
whole, or free quota in bytes; always a Python int so sums are exact) plus one :class:`Link` per peer::

    >>> led = Ledger(holding=100)
    >>> led, env = send(led, "b", 30)          # giver debits on send
    >>> led.holding, led.links["b"].net, env.body.link_total
    (70, 30, 30)
    >>> peer, acks, _ = receive(Ledger(holding=0), (replace_src(env, "a"),) * 2)  # duplicate
    >>> peer.holding, acks[0].body.link_total   # credited once, acked with what it applied
    (30, 30)

Protocol (one direction of one link; the other direction is symmetric):

* ``send`` debits the giver and numbers the transfer ``xfer_id = seq`` (1, 2,
  ...) with ``link_total`` = everything ever sent on this link.  The totals
  are cumulative, so the newest transfer carries all earlier ones.
* ``receive`` applies a transfer only if its seq is newer than the last one
  applied, and then credits ``link_total - applied_total``: a lost transfer
  is covered by the next one, a duplicate or late (reordered) one changes
  nothing.  Every receipt is acked with the receiver's ``applied_total``.
* ``retransmit`` resends the newest transfer until it is acked; nothing is
  ever taken back while the link is open, because only the receiver knows
  what it applied ([Stanojevic09] §IV "Message passing").
* ``settle`` closes a link to a failed peer: the node adds its link counter
  ``net = sent - applied (+ consumed reported - seen)`` to its holding, as
  DQMP's fix_crashedNode does ([Behl12] Fig. 6).  Messages from
  a closed peer are answered with ``accepted=False`` so that peer settles its
  side too.

Membership changes (:func:`follow_members`, every tick, from the PeerView
alone): a peer that *leaves* (no longer in ``view.members``) is settled at
once, a failure without the wait; one that comes back, or shows a new
incarnation (it restarted: its old life's link state is gone), is settled if
still open and then *reopened*: a fresh link, counters from zero, as for a
joiner.  The transport must not hand a message addressed to (or sent by) an
old life to the new one; the simulator and the tests drop them, the agent's
gossip rejects an old sender incarnation.  A link opened later in the tick
(``receive``, ``send``, ``report``) gets its peer's life from the same view in
:func:`note_lives`, so no open link is without one.

Endowment returns (GDRL, fill ratio): a member that comes back after its
genesis share was claimed gets that share back from its claimer as a
``Report`` (cumulative, resent until acked by ``TransferAck(xfer_id=0)``).
Unlike a transfer a return is not a link debt: a ledger with
``reports_in_net=False`` leaves reports out of its link counters, so the
giver's H drops by the share when it sends and the receiver's H grows by it
when it applies it.  While a return is in flight the sum over nodes of H is
that share *below* the global amount, never above; it is exact again once
the return is applied.

Conservation.  Call ``H = holding + sum(net of open links)`` a node's
*accountable* amount.  send, receive, report (as link debt) and settle leave
H unchanged; only genesis, inheritance and endowment returns
(agent/allocators/endowment.py) change it.  Summed over
nodes, ``sum(holding) + sum(net)`` is the holdings plus everything in flight
(sent but not applied), so ``sum over nodes of H == global`` at every step,
whatever is lost, duplicated or reordered.  A crashed node takes exactly its H
with it, which equals its endowment (its genesis share plus what it inherited);
``endowment.claim_endowments`` gives that to one designated heir, so the sum is whole
again (tests/unit/netharness.py adds it up; ``drlctl status`` shows each
node's ``accountable_Bps`` and, exact, ``accountable_parts``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from drl.agent.model import Envelope, PeerView, Report, Transfer, TransferAck


@dataclass(frozen=True)
class Link:
    """Counters for one peer.  ``sent_*`` and ``rep_sent`` are ours, ``applied_*``
    and ``rep_seen`` mirror the peer's, ``acked_seq`` is the peer's last ack."""
    sent_seq: int = 0
    sent_total: int = 0
    acked_seq: int = 0
    applied_seq: int = 0
    applied_total: int = 0
    rep_sent: int = 0      # consumed quota reported to this peer (DQMP uplink)
    rep_seen: int = 0      # consumed quota this peer reported to us
    rep_acked: int = 0     # our reports the peer has acknowledged (GDRL endowment returns)

    @property
    def net(self) -> int:
        """The link counter: what we moved to the peer minus what it moved to us."""
        return self.sent_total - self.applied_total + self.rep_sent - self.rep_seen

    @property
    def unacked(self) -> bool:
        return self.acked_seq < self.sent_seq


@dataclass(frozen=True)
class Ledger:
    holding: int
    links: Mapping[str, Link] = field(default_factory=dict)
    closed: frozenset[str] = frozenset()    # settled peers; their messages are refused
    claimed: frozenset[str] = frozenset()   # failed members whose endowment we inherited
    left: frozenset[str] = frozenset()      # closed because they left the members; reopened when back
    lives: Mapping[str, int] = field(default_factory=dict)  # watched peers' incarnations (0: unknown)
    owed: frozenset[str] = frozenset()      # claimed members that came back, waiting for their share
    elsewhere: frozenset[str] = frozenset() # down before we (re)started: inherited by someone else
    reports_in_net: bool = True             # DQMP: a report is link debt; GDRL: an endowment return

    def net(self, link: Link) -> int:
        """``link``'s counter as this ledger counts it (see ``reports_in_net``)."""
        return link.net if self.reports_in_net else link.sent_total - link.applied_total

    @property
    def accountable(self) -> int:
        return self.holding + sum(self.net(link) for link in self.links.values())


def _with_link(led: Ledger, peer: str, link: Link, holding_delta: int = 0) -> Ledger:
    links = dict(led.links)
    links[peer] = link
    return dataclasses.replace(led, holding=led.holding + holding_delta, links=links)


def send(led: Ledger, dst: str, amount: int) -> tuple[Ledger, Envelope]:
    """Debit ``amount`` now and address it to ``dst``; the receiver credits on receipt."""
    link = led.links.get(dst, Link())
    link = dataclasses.replace(link, sent_seq=link.sent_seq + 1, sent_total=link.sent_total + amount)
    env = Envelope(Transfer(xfer_id=link.sent_seq, amount=amount, link_total=link.sent_total), dst=dst)
    return _with_link(led, dst, link, -amount), env


def report(led: Ledger, dst: str, consumed: int, free: int) -> tuple[Ledger, Envelope]:
    """Pass ``consumed`` up the link to ``dst`` ([Behl12] §4.3 "Consumed Quota"): the
    link counter grows by it so a crash of ``dst`` never hands it out again as free."""
    link = led.links.get(dst, Link())
    link = dataclasses.replace(link, rep_sent=link.rep_sent + consumed)
    return _with_link(led, dst, link), Envelope(Report(consumed=link.rep_sent, free=free), dst=dst)


def receive(led: Ledger, inbox: Iterable[Envelope]) -> tuple[Ledger, tuple[Envelope, ...], int]:
    """Apply transfers, acks and reports; returns (ledger, acks to send, consumed reported to us).
    A ledger that does not count reports as link debt acks them (``xfer_id=0``)."""
    acks: dict[tuple[str, bool], Envelope] = {}
    consumed_in = 0
    for env in inbox:
        body, src = env.body, env.src
        if src in led.closed:
            if isinstance(body, Transfer):
                acks[src, True] = Envelope(TransferAck(xfer_id=body.xfer_id, accepted=False), dst=src)
            continue
        link = led.links.get(src, Link())
        if isinstance(body, Transfer):
            if body.xfer_id > link.applied_seq:
                credit = int(body.link_total) - link.applied_total
                link = dataclasses.replace(link, applied_seq=body.xfer_id, applied_total=int(body.link_total))
                led = _with_link(led, src, link, credit)
            acks[src, True] = Envelope(TransferAck(xfer_id=link.applied_seq, link_total=link.applied_total), dst=src)
        elif isinstance(body, TransferAck):
            if not body.accepted:
                led = settle(led, src)
            elif body.xfer_id == 0 and src in led.links and int(body.link_total) > link.rep_acked:
                led = _with_link(led, src, dataclasses.replace(link, rep_acked=int(body.link_total)))
            elif src in led.links and body.xfer_id > link.acked_seq:
                led = _with_link(led, src, dataclasses.replace(link, acked_seq=body.xfer_id))
        elif isinstance(body, Report) and int(body.consumed) > link.rep_seen:
            consumed_in += int(body.consumed) - link.rep_seen
            led = _with_link(led, src, dataclasses.replace(link, rep_seen=int(body.consumed)))
        if isinstance(body, Report) and not led.reports_in_net:
            seen = led.links[src].rep_seen if src in led.links else 0
            acks[src, False] = Envelope(TransferAck(xfer_id=0, link_total=seen), dst=src)
    return led, tuple(acks.values()), consumed_in


def retransmit(led: Ledger, sent_now: Iterable[str], view: PeerView) -> tuple[Envelope, ...]:
    """The newest transfer again on every unacked link to an alive peer not already
    sent to this tick; being cumulative it also replaces any lost earlier one.
    Likewise an unacked endowment return (a ledger that acks its reports), every tick."""
    skip = set(sent_now)
    out = []
    for peer, link in sorted(led.links.items()):
        if not is_alive(view, peer):
            continue
        if link.unacked and peer not in skip:
            out.append(Envelope(Transfer(xfer_id=link.sent_seq, amount=0, link_total=link.sent_total), dst=peer))
        if not led.reports_in_net and link.rep_acked < link.rep_sent:
            out.append(Envelope(Report(consumed=link.rep_sent, free=0), dst=peer))
    return tuple(out)


def settle(led: Ledger, peer: str) -> Ledger:
    """Close the link to ``peer``, taking its counter into the holding ([Behl12] Fig. 6)."""
    if peer in led.closed:
        return led
    links = dict(led.links)
    link = links.pop(peer, Link())
    return dataclasses.replace(led, holding=led.holding + led.net(link), links=links, closed=led.closed | {peer})


def reopen(led: Ledger, peer: str) -> Ledger:
    """Accept ``peer`` again on a fresh link (its new life, or it is back in the members)."""
    return dataclasses.replace(led, closed=led.closed - {peer}, left=led.left - {peer})


class Churn(NamedTuple):
    restarted: frozenset[str]   # open links whose peer showed a new life: settled this tick
    back: frozenset[str]        # reopened this tick: a new life, or back in the members


def follow_members(led: Ledger, view: PeerView, watch: Iterable[str] = (),
                   keep: Iterable[str] = ()) -> tuple[Ledger, Churn]:
    """Settle the links of peers that left or restarted, reopen those that came back.

    Looks at every peer we have a link with, closed, or already watch, plus
    ``watch`` (GDRL's heir duties); ``keep`` is never settled nor reopened (DQMP's
    quota manager, restored from its snapshot with its links).  A peer with no entry
    in ``view.peers`` is no member: a leave is a failure seen at once, so its link is
    settled now.  A new incarnation settles the old life's link and opens a fresh one.
    """
    keep = set(keep)
    lives = dict(led.lives)
    restarted, back = set(), set()
    for peer in sorted((set(led.links) | led.closed | set(lives) | set(watch)) - keep):
        state = view.peers.get(peer)
        if state is None:
            if peer not in led.closed:
                led = settle(led, peer)
            led = dataclasses.replace(led, left=led.left | {peer})
            lives.setdefault(peer, 0)
            continue
        known = lives.get(peer, 0)
        new_life = bool(state.incarnation and known and state.incarnation != known)
        if new_life and peer not in led.closed:
            led = settle(led, peer)
            restarted.add(peer)
        if new_life or peer in led.left:
            led = reopen(led, peer)
            back.add(peer)
        lives[peer] = state.incarnation or known
    if lives != led.lives:
        led = dataclasses.replace(led, lives=lives)
    return led, Churn(frozenset(restarted), frozenset(back))


def note_lives(led: Ledger, view: PeerView) -> Ledger:
    """Remember the life of every peer a link was opened with this tick (by ``receive``,
    ``send`` or ``report``, after :func:`follow_members` looked), from the same view.

    Called once a tick after the last of them.  Without it a peer that restarts before
    our next tick shows its new incarnation to a link with no life known, which
    :func:`follow_members` cannot tell from the first sight of a peer, so the old life's
    link is never settled: what that life gave us on it stays in our holding while its
    share, which still counted the gift as in flight, comes back whole (capacity
    created), and the new life's counters, from zero, never match ours."""
    fresh = {peer: state.incarnation for peer in led.links if peer not in led.lives
             and (state := view.peers.get(peer)) is not None and state.incarnation}
    if not fresh:
        return led
    return dataclasses.replace(led, lives={**led.lives, **fresh})


def is_down(view: PeerView, peer: str, dead_after_s: float) -> bool:
    """Left the members, or failed (:func:`has_failed`)."""
    return view.peers.get(peer) is None or has_failed(view, peer, dead_after_s)


def is_alive(view: PeerView, peer: str) -> bool:
    state = view.peers.get(peer)
    return state is not None and state.alive


def has_failed(view: PeerView, peer: str, dead_after_s: float) -> bool:
    """Dead for at least ``dead_after_s``: shorter silences are netsplits and change
    nothing ([Ramsden] §3.1 "we take no action").  A peer never
    heard from (age inf) has not failed: it may still be starting, and inheriting
    its share then would create capacity; if it never comes up, its share stays unused."""
    state = view.peers.get(peer)
    return state is not None and not state.alive and dead_after_s <= state.age_s < math.inf


def settle_failed(led: Ledger, view: PeerView, dead_after_s: float, keep: Iterable[str] = ()) -> Ledger:
    """Settle every open link whose peer has failed, except links in ``keep``
    (DQMP's initial links to the quota manager, [Behl12] §4.3)."""
    keep = set(keep)
    for peer in sorted(led.links):
        if peer not in keep and has_failed(view, peer, dead_after_s):
            led = settle(led, peer)
    return led


def link_info(led: Ledger, view: PeerView, unit: str = "", scale: float = 1) -> dict[str, dict[str, Any]]:
    """Per-peer counters for ``drlctl status``, times ``scale``; ``unit`` suffixes the amounts'
    keys (``"_Bps"`` for a rate, which the status shows in bits/s)."""
    return {peer: {"alive": is_alive(view, peer), f"net{unit}": led.net(link) * scale,
                   f"sent_total{unit}": link.sent_total * scale, f"applied_total{unit}": link.applied_total * scale,
                   "unacked": link.unacked}
            for peer, link in sorted(led.links.items())}


def ledger_to_dict(led: Ledger) -> dict[str, Any]:
    return {"holding": led.holding, "closed": sorted(led.closed), "claimed": sorted(led.claimed),
            "left": sorted(led.left), "lives": dict(sorted(led.lives.items())), "owed": sorted(led.owed),
            "elsewhere": sorted(led.elsewhere),
            "reports_in_net": led.reports_in_net,
            "links": {p: dataclasses.asdict(link) for p, link in sorted(led.links.items())}}


def ledger_from_dict(data: Mapping[str, Any]) -> Ledger:
    # .get: snapshots written before membership changes were followed lack the newer keys
    return Ledger(holding=int(data["holding"]), closed=frozenset(data["closed"]),
                  claimed=frozenset(data["claimed"]), left=frozenset(data.get("left", ())),
                  lives=dict(data.get("lives", {})), owed=frozenset(data.get("owed", ())),
                  elsewhere=frozenset(data.get("elsewhere", ())),
                  reports_in_net=bool(data.get("reports_in_net", True)),
                  links={p: Link(**fields) for p, fields in data["links"].items()})


def replace_src(env: Envelope, src: str) -> Envelope:
    """An outgoing envelope as the receiver sees it (``dst`` cleared, ``src`` set)."""
    return Envelope(body=env.body, src=src)
