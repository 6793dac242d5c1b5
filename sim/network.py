"""The simulated network between limiters: loss, delay, crashes, partitions.

    net = Network(n_nodes=100, interval_s=0.05, loss=0.01, delay_s=0.02, rng=rng)
    net.send_updates(src, dst, values, seqs, tick)   # numpy arrays, one entry per message
    net.send_envelope(src, dst, envelope, seq, tick) # one point-to-point Envelope
    net.send_envelopes(src, dst, envelopes, seqs, tick)  # many (arrays, a list of Envelopes)
    ups = net.due_updates(tick + 1)                  # what arrives one tick later
    net.crash([3, 4]); net.partition(groups); net.heal(); net.rejoin([3])

Time is counted in ticks (estimate intervals).  A message sent during tick k
arrives for the allocator step of tick k + ceil(delay / interval) (at least
k + 1), so a delay shorter than an interval costs one tick, as on the agent,
where updates are read at the next tick.  A message is lost when the coin
says so, when src and dst are in different partitions at send time, or when
either end is down (src at send time, dst at arrival time).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from drl.agent.model import Envelope


@dataclass(frozen=True)
class Updates:
    """A batch of gossiped values; arrays of equal length."""
    src: np.ndarray
    dst: np.ndarray
    value: np.ndarray
    seq: np.ndarray

    @staticmethod
    def concat(parts: list["Updates"]) -> "Updates":
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Updates(empty, empty, np.zeros(0), empty)
        return Updates(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("src", "dst", "value", "seq")))

    def select(self, mask: np.ndarray) -> "Updates":
        return Updates(self.src[mask], self.dst[mask], self.value[mask], self.seq[mask])


class Network:
    def __init__(self, n_nodes: int, interval_s: float, rng: np.random.Generator,
                 loss: float = 0.0, delay_s: float = 0.0, jitter_s: float = 0.0):
        self.n_nodes, self.interval_s, self.rng = n_nodes, interval_s, rng
        self.loss, self.delay_s, self.jitter_s = loss, delay_s, jitter_s
        self.alive = np.ones(n_nodes, dtype=bool)
        self.group = np.zeros(n_nodes, dtype=np.int64)
        self._updates: dict[int, list[Updates]] = defaultdict(list)
        self._envelopes: dict[int, list[tuple[int, Envelope, int]]] = defaultdict(list)
        self.sent = 0
        self.dropped = 0

    # --- faults -------------------------------------------------------
    def crash(self, nodes) -> None:
        self.alive[np.asarray(nodes, dtype=np.int64)] = False

    def rejoin(self, nodes) -> None:
        self.alive[np.asarray(nodes, dtype=np.int64)] = True

    def partition(self, groups: np.ndarray) -> None:
        """``groups[i]`` is node i's side; only same-side messages get through."""
        self.group = np.asarray(groups, dtype=np.int64).copy()

    def heal(self) -> None:
        self.group[:] = 0

    def purge(self, node: int, node_id: str) -> None:
        """Drop what is in flight to or from ``node``: its old life's messages never reach
        its new one, nor does its new life get what was sent to the old (agent.gossip's
        incarnations; a restart takes longer than a message in the agent)."""
        for tick, parts in self._updates.items():
            self._updates[tick] = [p.select((p.src != node) & (p.dst != node)) for p in parts]
        for tick, items in self._envelopes.items():
            self._envelopes[tick] = [it for it in items if it[0] != node and it[1].src != node_id]

    # --- sending ------------------------------------------------------
    def _survives(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        ok = self.alive[src] & (self.group[src] == self.group[dst])
        if self.loss > 0:
            ok &= self.rng.random(len(src)) >= self.loss
        self.sent += len(src)
        self.dropped += int(len(src) - ok.sum())
        return ok

    def _arrival_ticks(self, tick: int, n: int) -> np.ndarray:
        delay = np.full(n, self.delay_s)
        if self.jitter_s:
            delay += self.rng.random(n) * self.jitter_s
        return tick + np.maximum(1, np.ceil(delay / self.interval_s - 1e-9)).astype(np.int64)

    def send_updates(self, src: np.ndarray, dst: np.ndarray, value: np.ndarray,
                     seq: np.ndarray, tick: int) -> None:
        ok = self._survives(src, dst)
        batch = Updates(src, dst, value, seq).select(ok)
        arrive = self._arrival_ticks(tick, len(batch.src))
        for t in np.unique(arrive):
            self._updates[int(t)].append(batch.select(arrive == t))

    def send_envelope(self, src: int, dst: int, env: Envelope, seq: int, tick: int) -> None:
        self.send_envelopes(np.array([src]), np.array([dst]), [env], np.array([seq]), tick)

    def send_envelopes(self, src: np.ndarray, dst: np.ndarray, envs: list[Envelope], seq: np.ndarray,
                       tick: int) -> None:
        """Point-to-point messages, one per entry (the sum tree sends thousands a tick)."""
        ok = np.flatnonzero(self._survives(src, dst))
        arrive = self._arrival_ticks(tick, len(ok))
        for t, j in zip(arrive.tolist(), ok.tolist()):
            self._envelopes[t].append((int(dst[j]), envs[j], int(seq[j])))

    # --- receiving ----------------------------------------------------
    def due_updates(self, tick: int) -> Updates:
        batch = Updates.concat(self._updates.pop(tick, []))
        return batch.select(self.alive[batch.dst])

    def due_envelopes(self, tick: int) -> list[tuple[int, Envelope, int]]:
        """(dst, envelope with src set, sequence number) for every one arriving now."""
        return [item for item in self._envelopes.pop(tick, []) if self.alive[item[0]]]

