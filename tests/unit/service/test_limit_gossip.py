"""agent/service/limit_gossip.py: peers' limit notes adopted when newer and within the clock
bound; a note from the future is refused, counted per sender and logged once per sender."""
from __future__ import annotations

import logging
from types import SimpleNamespace as NS

from drl.agent.cluster.limits import MAX_AHEAD_MS, Limit, LimitBook
from drl.agent.gossip.wire import Batch, LimitNote
from drl.agent.service.limit_gossip import LimitGossip

NOW = 1_796_000_000_000
KEY = 7


class Transport:
    def __init__(self):
        self.told = []

    def announce(self, note, addr=None):
        self.told.append((note, addr))


def gossip(clock: list[int] | None = None):
    clock = clock or [NOW]
    book = LimitBook(clock=lambda: clock[0])
    book.configure("gold", 1e6)
    run = NS(name="gold", conf=NS(key=KEY))
    table = NS(by_key=lambda key: run if key == KEY else None)
    return LimitGossip(book, table, Transport()), book


def rx(node: str, *notes: LimitNote):
    return NS(payload=Batch((), notes), header=NS(node=node), addr=(node, 7470))


def test_a_newer_note_within_the_bound_is_adopted_and_an_older_one_answered():
    limits, book = gossip()
    limits.heard(rx("b", LimitNote(KEY, NOW + 1000, 2e6)))
    assert book.get("gold") == Limit(NOW + 1000, 2e6) and not limits.transport.told
    limits.heard(rx("c", LimitNote(KEY, 5, 9e6)))             # an old file's version: told ours
    assert limits.transport.told == [(LimitNote(KEY, NOW + 1000, 2e6), ("c", 7470))]


def test_a_note_from_the_future_is_refused_counted_per_sender_and_logged_once(caplog):
    limits, book = gossip()
    forged = LimitNote(KEY, 2**63 - 3, 1.25e11)
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            limits.heard(rx("x", forged, LimitNote(KEY, NOW + MAX_AHEAD_MS + 1, 1.25e11)))
        limits.heard(rx("y", forged))
    assert book.get("gold") == Limit(0, 1e6)
    assert limits.ahead == {"x": 100, "y": 1}
    lines = [r.getMessage() for r in caplog.records if "limit_ahead" in r.getMessage()]
    assert len(lines) == 2 and "from=x" in lines[0] and "from=y" in lines[1], lines
    assert not limits.transport.told          # nothing answered to a forger


def test_a_set_after_a_forgery_at_the_bound_is_adopted_by_a_peer_that_holds_it_a_ms_later():
    """The set is one more than the forgery: a peer refuses it in the same millisecond, and
    adopts it when the setter tells it again (its values carry the older version)."""
    clock = [NOW]
    limits, book = gossip(clock)
    limits.heard(rx("x", LimitNote(KEY, NOW + MAX_AHEAD_MS, 1.25e11)))   # within the bound: adopted
    operator, _ = gossip(clock)
    operator.book.merge("gold", book.get("gold"))
    mine = operator.book.set("gold", 3e6)
    note = LimitNote(KEY, mine.version, mine.global_Bps)
    limits.heard(rx("a", note))
    assert book.get("gold").global_Bps == 1.25e11
    clock[0] += 1
    limits.heard(rx("a", note))
    assert book.get("gold") == Limit(NOW + MAX_AHEAD_MS + 1, 3e6)
