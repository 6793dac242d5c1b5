"""Genesis shares, and who holds a down member's share ([Stanojevic09] §IV "Node Failures"):
what each member is endowed with at genesis, its best friend (heir) while it is down, what an
heir claims, and what it returns when the member is back.

    >>> share(10, ("a", "b", "c"), "a"), share(10, ("a", "b", "c"), "b")
    (4, 3)

Used by GDRL (agent/allocators/gdrl.py); the amounts move over agent/allocators/transfer.py's
links (a return is a ``report``), so their sums stay exact.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

from drl.agent.model import Envelope, PeerView
from .transfer import Ledger, is_down, report


def share(total: int, genesis: tuple[str, ...], node_id: str) -> int:
    """``node_id``'s genesis share of ``total``: total // N, the remainder one unit
    each to the first members, so the shares add up to ``total`` exactly ([Stanojevic09] eq. 6)."""
    if node_id not in genesis:
        return 0
    base, extra = divmod(total, len(genesis))
    return base + (1 if genesis.index(node_id) < extra else 0)


def _shares(total: int, genesis: tuple[str, ...], members: Iterable[str]) -> int:
    """The genesis shares of ``members``, added up."""
    return sum(share(total, genesis, m) for m in members)


def predecessors(genesis: tuple[str, ...], node_id: str) -> Iterator[str]:
    """The members before ``node_id`` in ring order, nearest first (lazily: the
    callers stop at the first one up).  A member's best friend, which holds its
    endowment when it is down, is the first member after it in genesis order that
    is up: its ring successor ([Stanojevic09] §IV "Node Failures", [Ramsden] §3.2
    "best buddy"); so we are the best friend of the down run of our predecessors."""
    k, n = genesis.index(node_id), len(genesis)
    return (genesis[(k - step) % n] for step in range(1, n))


def heir(genesis: tuple[str, ...], node_id: str, view: PeerView, dead_after_s: float, me: str) -> str | None:
    """Who holds ``node_id``'s share while it is down, as ``me`` sees the members: the first
    member after it in ring order that is up (its best friend); ``me`` is up."""
    if node_id not in genesis:
        return None
    k, n = genesis.index(node_id), len(genesis)
    for step in range(1, n):
        m = genesis[(k + step) % n]
        if m == me or not is_down(view, m, dead_after_s):
            return m
    return None


def down_run(genesis: tuple[str, ...], node_id: str, view: PeerView, dead_after_s: float,
             restarted: Iterable[str] = ()) -> tuple[list[str], str | None]:
    """Our predecessors that are down (or whose old life just ended), nearest first,
    up to the first one up: ``(run, first up)``.  We are the heir of everyone in the run."""
    restarted = set(restarted)
    run: list[str] = []
    if node_id not in genesis:
        return run, None
    for d in predecessors(genesis, node_id):
        if d not in restarted and not is_down(view, d, dead_after_s):
            return run, d
        run.append(d)
    return run, None


def heir_watch(genesis: tuple[str, ...], node_id: str, view: PeerView, dead_after_s: float) -> list[str]:
    """The predecessors whose lives we follow: the run of down ones and the next two up.
    A restart of the first one up makes us its heir; following the second as well
    lets us see its restart in the same tick as the first one leaves."""
    watch: list[str] = []
    ups = 0
    for d in predecessors(genesis, node_id) if node_id in genesis else ():
        watch.append(d)
        ups += not is_down(view, d, dead_after_s)
        if ups == 2:
            break
    return watch


def start_elsewhere(led: Ledger, genesis: tuple[str, ...], node_id: str, view: PeerView,
                    dead_after_s: float) -> Ledger:
    """A restarted member's first tick: what is down behind us now was inherited while
    we were away (by our old life, now by its heir), so it is not ours to claim; our
    best friend returns those shares with ours (:func:`bundle`), and they are ours
    once that return has come in."""
    run, _ = down_run(genesis, node_id, view, dead_after_s)
    return dataclasses.replace(led, elsewhere=frozenset(run))


def claim_endowments(led: Ledger, node_id: str, genesis: tuple[str, ...], total: int,
                     view: PeerView, dead_after_s: float, restarted: Iterable[str] = ()) -> Ledger:
    """Inherit the genesis share of every down member (failed, left, or whose old life
    just ended: ``restarted``) whose heir we now are.

    We are ``d``'s heir (best friend) when every member between ``d`` and us in
    ring order is down too; walking our predecessors back to the first one up
    finds exactly those, in O(run).
    Members down since before we restarted (``elsewhere``) were inherited by
    someone else; once seen up again they are ordinary members.

    What is inherited, exactly: a failed node's accountable amount H is its
    genesis share plus the shares it had inherited itself; its neighbours'
    settled link counters already account for everything it lent or borrowed.
    The heir of a node that had inherited from others becomes, by the same
    successor rule, the heir of those others too, so re-claiming genesis
    shares per failed member gives back exactly the H that was lost.
    """
    if node_id not in genesis:
        return led
    run, _ = down_run(genesis, node_id, view, dead_after_s, restarted)
    if led.elsewhere - set(run):
        led = dataclasses.replace(led, elsewhere=led.elsewhere & set(run))
    gained = set(run) - led.claimed - led.elsewhere
    if not gained:
        return led
    extra = _shares(total, genesis, gained)
    return dataclasses.replace(led, holding=led.holding + extra, claimed=led.claimed | gained)


def bundle(led: Ledger, genesis: tuple[str, ...], peer: str, view: PeerView, dead_after_s: float) -> set[str]:
    """What we give back to ``peer`` when it is back: its own share and those of the down
    members behind it that we hold, whose best friend it is again."""
    run, _ = down_run(genesis, peer, view, dead_after_s)
    return {peer} | (led.claimed & set(run))


def owed_amount(led: Ledger, genesis: tuple[str, ...], total: int, view: PeerView, dead_after_s: float) -> int:
    """The returns we owe and have not paid yet (set aside from the holding)."""
    return sum(_shares(total, genesis, bundle(led, genesis, p, view, dead_after_s)) for p in led.owed)


def return_endowments(led: Ledger, genesis: tuple[str, ...], total: int, view: PeerView, back: Iterable[str],
                      dead_after_s: float) -> tuple[Ledger, tuple[Envelope, ...]]:
    """Give a claimed member that came back (``back``) its :func:`bundle` as one return
    (module docstring); the rejoiner expects the same bundle from its own view
    (:func:`start_elsewhere`).  Paid once our holding covers it, so no limit goes
    negative; a member that goes down again before that is no longer owed."""
    owed = {p for p in led.owed | (led.claimed & set(back)) if p not in led.closed and view.peers.get(p) is not None}
    out = []
    for peer in sorted(owed):
        given = bundle(led, genesis, peer, view, dead_after_s)
        amount = _shares(total, genesis, given)
        if led.holding < amount:
            continue
        led = dataclasses.replace(led, holding=led.holding - amount, claimed=led.claimed - given)
        led, env = report(led, peer, amount, 0)
        out.append(env)
        owed.discard(peer)
    return dataclasses.replace(led, owed=frozenset(owed)), tuple(out)
