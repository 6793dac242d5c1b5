"""What every simulated node has heard from its peers, as numpy arrays.

    table = ViewTable(node_ids, interval_s=0.05, stale_ticks=20)
    table.receive(updates, tick)        # a batch from Network.due_updates
    table.expire(tick)                  # peers not heard for stale_ticks go stale
    view = table.view(i, tick)          # agent.model.PeerView for node i

Row i holds node i's knowledge: the last value received from each peer, the
tick it was heard and its sequence number.  ``remote_sum`` and ``n_alive`` are
kept incrementally (O(messages) per tick, not O(N^2)), so an allocator that
only reads the sums costs O(1) per node; ``view.peers`` is a lazy Mapping that
builds a PeerState only for the entries the allocator looks at.

The stale rule is agent.membership's own (``alive``, ``reported``, [Raghavan07] §5.6), on
ticks: a peer heard ``stale_ticks`` or more ticks ago is not alive and its value counts
zero; any accepted datagram (``touch``) is a sign of life.
An update older than the newest one seen from the same sender (reordered by
the network's jitter) does not overwrite it, but shows the sender alive.
tests/unit/gossip/test_stale_rule.py holds this table to agent.membership.  Loss *detection* is
sim.wiretap's job, with the agent's own SeqWindow.

Membership, as a registry's watch gives it to agent.membership (``set_peers``):
``leave(j)`` takes j out of ``view.members`` at every node at once (it is no
member, not a stale one: its value and liveness are forgotten), ``join(j)``
puts it back in, stale until heard.  ``restart(i)`` also starts i's next
life, which every PeerState reports as ``incarnation`` (the sim's gossip
delivers nothing of an old life, so every node may know the current one).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterator, Mapping, Sequence

import numpy as np

from drl.agent.gossip import membership
from drl.agent.gossip.membership import NEVER
from drl.agent.model import PeerState, PeerView

from .network import Updates

NO_SEQ = -1        # the newest sequence number of a sender not heard in its current life


class ViewTable:
    def __init__(self, node_ids: Sequence[str], interval_s: float, stale_ticks: int,
                 members: np.ndarray | None = None):
        n = len(node_ids)
        self.node_ids = tuple(node_ids)
        self.index = {nid: i for i, nid in enumerate(self.node_ids)}
        self.interval_s, self.stale_ticks = interval_s, stale_ticks
        self.timeout_ticks = stale_ticks - 1       # the stale rule's timeout: alive while silent for so many
        # float32/int32: at N = 10,000 the three tables take 1.2 GB instead of 2.4 GB.  Ticks are
        # exact in a float32 up to 2^24, and a float holds NEVER (-inf), which the rule needs.
        self.values = np.zeros((n, n), dtype=np.float32)
        self.heard = np.full((n, n), NEVER, dtype=np.float32)
        self.last_seq = np.full((n, n), NO_SEQ, dtype=np.int32)
        self.remote_sum = np.zeros(n)
        self.n_alive = np.zeros(n, dtype=np.int64)
        self.member = np.ones(n, dtype=bool) if members is None else np.asarray(members, dtype=bool).copy()
        self.life = np.ones(n, dtype=np.int64)
        self._members = self._member_ids()
        self._expiry: dict[int, list[tuple[np.ndarray, np.ndarray, int]]] = defaultdict(list)

    def receive(self, batch: Updates, tick: int) -> None:
        """Apply gossiped Updates: newest (highest seq) wins, as in agent.membership."""
        if len(batch.src) == 0:
            return
        dst, src, value, seq = _newest_per_pair(batch, len(self.node_ids))
        fresh = seq > self.last_seq[dst, src]
        if not fresh.all():     # a late (reordered) update is still a sign of life
            self.touch(dst[~fresh], src[~fresh], tick)
        dst, src, value, seq = dst[fresh], src[fresh], value[fresh], seq[fresh]
        self._heard(dst, src, value, tick)
        self.last_seq[dst, src] = seq

    def touch(self, dst: np.ndarray, src: np.ndarray, tick: int) -> None:
        """Any other accepted datagram is a sign of life too.  The value stays, unless the
        sender has published nothing in its current life: agent.membership forgets a
        restarted peer's values as soon as it hears the new incarnation."""
        key = np.unique(dst * len(self.node_ids) + src)
        dst, src = key // len(self.node_ids), key % len(self.node_ids)
        again = self.heard[dst, src] == tick         # heard this tick already: one expiry per hearing
        dst, src = dst[~again], src[~again]
        value = np.where(self.last_seq[dst, src] == NO_SEQ, 0.0, self.values[dst, src])
        self._heard(dst, src, value, tick)

    def _heard(self, dst: np.ndarray, src: np.ndarray, value: np.ndarray, tick: int) -> None:
        """(dst, src) pairs unique: update values and the running sums incrementally."""
        n = len(self.node_ids)
        # Sum what the table stores (float32), so an expiry subtracts exactly what was added.
        value = np.asarray(value, dtype=np.float32).astype(float)
        was_alive = self._alive(dst, src, tick)
        delta = value - membership.reported(self.values[dst, src], was_alive)
        self.remote_sum += np.bincount(dst, weights=delta, minlength=n)
        self.n_alive += np.bincount(dst[~was_alive], minlength=n)
        self.values[dst, src] = value
        self.heard[dst, src] = tick
        self._expiry[tick + self.stale_ticks].append((dst, src, tick))

    def expire(self, tick: int) -> None:
        """Drop peers whose newest update is exactly ``stale_ticks`` old."""
        n = len(self.node_ids)
        for dst, src, heard in self._expiry.pop(tick, []):
            gone = self.heard[dst, src] == heard
            dst, src = dst[gone], src[gone]
            self.remote_sum -= np.bincount(dst, weights=self.values[dst, src], minlength=n)
            self.n_alive -= np.bincount(dst, minlength=n)

    def restart(self, i: int) -> None:
        """Node i restarted: it knows nothing, and its new life's sequence numbers
        start over (agent.gossip: a higher incarnation resets the receivers' windows),
        with no value until it publishes one (agent.membership)."""
        self.heard[i, :] = NEVER          # its pending expiries no longer match
        self.remote_sum[i] = 0.0
        self.n_alive[i] = 0
        self.last_seq[:, i] = NO_SEQ
        self.life[i] += 1

    def leave(self, j: int, tick: int) -> None:
        """j left the members: every node forgets it at once."""
        rows = np.arange(len(self.node_ids))
        alive = self._alive(rows, np.full_like(rows, j), tick) & (rows != j)
        self.remote_sum -= membership.reported(self.values[:, j], alive)
        self.n_alive -= alive
        self.heard[:, j], self.last_seq[:, j] = NEVER, NO_SEQ
        self.values[:, j] = 0.0
        self.member[j] = False
        self._members = self._member_ids()

    def join(self, j: int) -> None:
        """j is a member (again): stale everywhere until heard."""
        self.member[j] = True
        self._members = self._member_ids()

    def _member_ids(self) -> tuple[str, ...]:
        return tuple(nid for nid, m in zip(self.node_ids, self.member) if m)

    def _alive(self, dst: np.ndarray, src: np.ndarray, tick: int) -> np.ndarray:
        return membership.alive(self.heard[dst, src], tick, self.timeout_ticks)

    def view(self, i: int, tick: int, neighbours: Sequence[int] | None = None) -> PeerView:
        return PeerView(members=self._members,
                        peers=LazyPeers(self, i, tick, neighbours),
                        remote_sum=float(self.remote_sum[i]),
                        n_alive=int(self.n_alive[i]))


class LazyPeers(Mapping[str, PeerState]):
    """Node i's peers, a PeerState built on access.  Iteration covers the members it
    gossips with (its graph neighbours, if any); any member can be looked up (GDRL's
    heir watches its ring predecessors); a non-member has no entry."""

    def __init__(self, table: ViewTable, row: int, tick: int, neighbours: Sequence[int] | None):
        self._t, self._row, self._tick = table, row, tick
        self._cols = neighbours

    def _columns(self) -> Sequence[int]:
        cols = range(len(self._t.node_ids)) if self._cols is None else self._cols
        return [j for j in cols if j != self._row and self._t.member[j]]

    def _col(self, node_id: str) -> int | None:
        j = self._t.index.get(node_id)
        return None if j is None or j == self._row or not self._t.member[j] else j

    def __getitem__(self, node_id: str) -> PeerState:
        j = self._col(node_id)
        if j is None:
            raise KeyError(node_id)
        t, row = self._t, self._row
        heard = float(t.heard[row, j])
        alive = membership.alive(heard, self._tick, t.timeout_ticks)
        return PeerState(node_id, membership.reported(float(t.values[row, j]), alive), alive,
                         (self._tick - heard) * t.interval_s, int(t.life[j]))

    def get(self, node_id: str, default=None):
        # Mapping.get via a raised KeyError costs ~1 us; allocators probe every member.
        return default if self._col(node_id) is None else self[node_id]

    def __iter__(self) -> Iterator[str]:
        return (self._t.node_ids[j] for j in self._columns())

    def __len__(self) -> int:
        return len(self._columns())


def _newest_per_pair(batch: Updates, n: int):
    """Keep one update per (dst, src): the highest sequence number in the batch."""
    key = batch.dst * n + batch.src
    order = np.lexsort((batch.seq, key))
    key = key[order]
    last = np.ones(len(key), dtype=bool)
    last[:-1] = key[1:] != key[:-1]
    pick = order[last]
    return batch.dst[pick], batch.src[pick], batch.value[pick], batch.seq[pick]
