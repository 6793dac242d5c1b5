"""Peers never heard since the agent started: each is a member (N counts it, so every class
keeps a share for it) that passes nothing.  A configured peer that never comes up holds every
host at G/N for good; this makes that visible instead of a quiet ``last seen never``.

    unseen = UnseenPeers(started=now, grace_s=members.timeout_s)
    unseen.observe(now, members.status(now))     # at most once a second: logs a change
    unseen.peers                                 # status' ``unseen_peers``, the metric's count

A peer becomes unseen once the agent has run for ``grace_s`` (the liveness timeout: a
peer that is up is heard well within it) without hearing it; ``event=peers_unseen``
names them whenever the set changes, ``event=peers_seen`` when it empties.
"""
from __future__ import annotations

from drl.agent import logs

log = logs.get_logger("drl.agent")
CHECK_EVERY_S = 1.0      # a status row per member: not every tick at thousands of members


class UnseenPeers:
    def __init__(self, started: float, grace_s: float):
        self.started, self.grace_s = started, grace_s
        self.peers: list[str] = []
        self._next = started

    def due(self, now: float) -> bool:
        return now >= self._next

    def observe(self, now: float, rows: list[dict]) -> None:
        """``rows``: Membership.status(now)."""
        self._next = now + CHECK_EVERY_S
        if now - self.started < self.grace_s:
            return
        unseen = sorted(r["node_id"] or r["address"] for r in rows if r["last_seen_s"] is None)
        if unseen == self.peers:
            return
        if unseen:
            log.warning("peers_unseen", count=len(unseen), peers=",".join(unseen),
                        error=f"capacity reserved for {len(unseen)} unseen peers: never heard since start")
        else:
            log.info("peers_seen")
        self.peers = unseen
