"""Acknowledged pairwise transfers with link counters: the conservation core of GDRL,
fill ratio and DQMP.

A node's :class:`Ledger` is what it holds (a rate in B/s, or free quota in
bytes, always a Python int so sums are exact) plus one :class:`Link` per peer::

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

Conservation.  Call ``H = holding + sum(net of open links)`` a node's
*accountable* amount.  send, receive, report and settle leave H unchanged;
only genesis and inheritance (:func:`claim_endowments`) change it.  Summed over
nodes, ``sum(holding) + sum(net)`` is the holdings plus everything in flight
(sent but not applied), so ``sum over nodes of H == global`` at every step,
whatever is lost, duplicated or reordered.  A crashed node takes exactly its H
with it, which equals its endowment (its genesis share plus what it inherited);
:func:`claim_endowments` gives that to one designated heir, so the sum is whole
again (``conserved_total`` computes it for tests and ``drlctl status``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

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

    @property
    def accountable(self) -> int:
        return self.holding + sum(link.net for link in self.links.values())


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
    """Apply transfers, acks and reports; returns (ledger, acks to send, consumed reported to us)."""
    acks: dict[str, Envelope] = {}
    consumed_in = 0
    for env in inbox:
        body, src = env.body, env.src
        if src in led.closed:
            if isinstance(body, Transfer):
                acks[src] = Envelope(TransferAck(xfer_id=body.xfer_id, accepted=False), dst=src)
            continue
        link = led.links.get(src, Link())
        if isinstance(body, Transfer):
            if body.xfer_id > link.applied_seq:
                credit = int(body.link_total) - link.applied_total
                link = dataclasses.replace(link, applied_seq=body.xfer_id, applied_total=int(body.link_total))
                led = _with_link(led, src, link, credit)
            acks[src] = Envelope(TransferAck(xfer_id=link.applied_seq, link_total=link.applied_total), dst=src)
        elif isinstance(body, TransferAck):
            if not body.accepted:
                led = settle(led, src)
            elif src in led.links and body.xfer_id > link.acked_seq:
                led = _with_link(led, src, dataclasses.replace(link, acked_seq=body.xfer_id))
        elif isinstance(body, Report) and int(body.consumed) > link.rep_seen:
            consumed_in += int(body.consumed) - link.rep_seen
            led = _with_link(led, src, dataclasses.replace(link, rep_seen=int(body.consumed)))
    return led, tuple(acks.values()), consumed_in


def retransmit(led: Ledger, sent_now: Iterable[str], view: PeerView) -> tuple[Envelope, ...]:
    """The newest transfer again on every unacked link to an alive peer not already
    sent to this tick; being cumulative it also replaces any lost earlier one."""
    skip = set(sent_now)
    out = []
    for peer, link in sorted(led.links.items()):
        if link.unacked and peer not in skip and is_alive(view, peer):
            out.append(Envelope(Transfer(xfer_id=link.sent_seq, amount=0, link_total=link.sent_total), dst=peer))
    return tuple(out)


def settle(led: Ledger, peer: str) -> Ledger:
    """Close the link to ``peer``, taking its counter into the holding ([Behl12] Fig. 6)."""
    if peer in led.closed:
        return led
    links = dict(led.links)
    link = links.pop(peer, Link())
    return dataclasses.replace(led, holding=led.holding + link.net, links=links, closed=led.closed | {peer})


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


def share(total: int, genesis: tuple[str, ...], node_id: str) -> int:
    """``node_id``'s genesis share of ``total``: total // N, the remainder one unit
    each to the first members, so the shares add up to ``total`` exactly ([Stanojevic09] eq. 6)."""
    if node_id not in genesis:
        return 0
    base, extra = divmod(total, len(genesis))
    return base + (1 if genesis.index(node_id) < extra else 0)


def heir(dead: str, genesis: tuple[str, ...], failed: set[str]) -> str | None:
    """The best friend holding ``dead``'s endowment: the first member after it in
    genesis order that has not failed (its ring successor, a neighbour on the
    ring; [Stanojevic09] §IV "Node Failures", [Ramsden] §3.2 "best buddy")."""
    k = genesis.index(dead)
    for step in range(1, len(genesis)):
        candidate = genesis[(k + step) % len(genesis)]
        if candidate not in failed:
            return candidate
    return None


def claim_endowments(led: Ledger, node_id: str, genesis: tuple[str, ...], total: int,
                     view: PeerView, dead_after_s: float) -> Ledger:
    """Inherit the genesis share of every failed member whose heir we now are.

    What is inherited, exactly: a failed node's accountable amount H is its
    genesis share plus the shares it had inherited itself; its neighbours'
    settled link counters already account for everything it lent or borrowed.
    The heir of a node that had inherited from others becomes, by the same
    successor rule, the heir of those others too, so re-claiming genesis
    shares per failed member gives back exactly the H that was lost.
    """
    if node_id not in genesis:
        return led
    failed = {m for m in genesis if m != node_id and has_failed(view, m, dead_after_s)}
    gained = {d for d in failed - led.claimed if heir(d, genesis, failed) == node_id}
    if not gained:
        return led
    extra = sum(share(total, genesis, d) for d in gained)
    return dataclasses.replace(led, holding=led.holding + extra, claimed=led.claimed | gained)


def link_info(led: Ledger, view: PeerView, unit: str = "") -> dict[str, dict[str, Any]]:
    """Per-peer counters for ``drlctl status``; ``unit`` suffixes the amounts' keys
    (``"_Bps"`` for a rate, which the status shows in bits/s)."""
    return {peer: {"alive": is_alive(view, peer), f"net{unit}": link.net, f"sent_total{unit}": link.sent_total,
                   f"applied_total{unit}": link.applied_total, "unacked": link.unacked}
            for peer, link in sorted(led.links.items())}


def ledger_to_dict(led: Ledger) -> dict[str, Any]:
    return {"holding": led.holding, "closed": sorted(led.closed), "claimed": sorted(led.claimed),
            "links": {p: dataclasses.asdict(link) for p, link in sorted(led.links.items())}}


def ledger_from_dict(data: Mapping[str, Any]) -> Ledger:
    return Ledger(holding=int(data["holding"]), closed=frozenset(data["closed"]),
                  claimed=frozenset(data["claimed"]),
                  links={p: Link(**fields) for p, fields in data["links"].items()})


def replace_src(env: Envelope, src: str) -> Envelope:
    """An outgoing envelope as the receiver sees it (``dst`` cleared, ``src`` set)."""
    return Envelope(body=env.body, src=src)
