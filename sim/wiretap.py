"""The simulated traffic as the agent's wire code sees it: real sizes, real loss detection.

    tap = WireTap(node_ids, rng, monitors=64)
    tap.updates_sent(seq)                               # -> bytes on the wire, via agent.wire.encode
    tap.envelope_sent(src_id, env, seq, sent_at)        # -> bytes of one point-to-point message
    tap.received(dst, src, seq)                          # feeds agent.gossip.lives.SeqWindow
    tap.loss_detected                                    # lost / expected, as the receivers count it

Sizes: every datagram is ``agent.wire.encode`` output (protobuf + 32-byte
HMAC-SHA256 tag) plus 28 bytes of IPv4 + UDP header, the way
[Raghavan07] §3.1 counts its "48-byte" updates.  A protobuf's size
depends only on which fields are non-default and on the varint lengths, so the
size of a node's update (a Batch holding its one class, whose per-class seq
equals the link's) is encoded once per seq varint length and cached: exact,
without an HMAC per simulated message.

Loss detection runs the agent's own ``SeqWindow`` (one per sender, receiver
stream) on every update delivered to a sample of ``monitors`` receivers, so its
cost stays bounded at 10,000 limiters.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from drl.agent.gossip import lives, wire
from drl.agent.gossip.core import new_incarnation
from drl.agent.model import Envelope

IP_UDP_BYTES = 28
CLUSTER = "sim"
KEY = bytes(32)
CLASS_ID = 1
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_len(x: np.ndarray) -> np.ndarray:
    return np.searchsorted(_VARINT_LIMITS, np.asarray(x, dtype=np.uint64), side="right") + 1


class WireTap:
    def __init__(self, node_ids: Sequence[str], rng: np.random.Generator, monitors: int = 64):
        self.node_ids = node_ids
        n = len(node_ids)
        self.monitored = np.zeros(n, dtype=bool)
        self.monitored[rng.choice(n, size=min(n, monitors), replace=False)] = True
        self.incarnation = new_incarnation()       # wall-clock ms, as the agent's: 6 varint bytes
        self._windows: dict[tuple[int, int], lives.SeqWindow] = {}
        self._size_cache: dict = {}        # datagram shape -> bytes
        self.lost = 0          # net count from SeqWindow.accept: gaps minus late arrivals
        self.accepted = 0
        self.replayed = 0

    def _datagram_bytes(self, src: str, dst: str, seq: int, sent_at: float, payload, class_id: int = 0) -> int:
        header = wire.Header(cluster=CLUSTER, node=src, seq=seq, incarnation=self.incarnation,
                             sent_at=sent_at, class_id=class_id, dst=dst)
        return len(wire.encode(wire.Message(header, payload), KEY)) + IP_UDP_BYTES

    def update_size(self, seq: int) -> int:
        """Bytes of one update datagram: a Batch with the node's class (a float is 4 bytes, any value)."""
        key = int(varint_len(np.array([seq]))[0])
        if key not in self._size_cache:
            # sent_at is never 0 on the agent (a monotonic clock), so a fixed one is exact.
            batch = wire.Batch((wire.ClassValue(CLASS_ID, seq, 1.5),))
            self._size_cache[key] = self._datagram_bytes(self.node_ids[0], self.node_ids[-1], seq, 1.5, batch)
        return self._size_cache[key]

    def updates_sent(self, seq: np.ndarray) -> int:
        """Total bytes on the wire for a batch of update datagrams."""
        lens = varint_len(seq)
        return sum(int(np.sum(lens == length)) * self.update_size(int(1 << (7 * (length - 1))))
                   for length in np.unique(lens))

    def envelope_sent(self, src: str, env: Envelope, seq: int, sent_at: float) -> int:
        return self._datagram_bytes(src, env.dst, seq, sent_at, env.body, CLASS_ID)

    def sums_sent(self, envs: list[Envelope], seq: np.ndarray, sent_at: float) -> int:
        """Total bytes of sum-tree datagrams (agent.gossip.tree): sized once per shape, the way
        update_size is (a Sums' size depends on its kind, counts and lengths, not on its sums)."""
        total = 0
        shapes: dict[int, tuple] = {}       # id(body) -> its shape: a PARTIAL goes to ~30 summers
        for env, length in zip(envs, varint_len(seq).tolist()):
            body = env.body
            shape = shapes.get(id(body))
            if shape is None:
                shape = shapes[id(body)] = (body.kind, body.nodes.bit_length() // 7, len(body.values),
                                            len(body.summers), sum(map(len, body.summers)))
            shape = (length, *shape)
            size = self._size_cache.get(shape)
            if size is None:
                size = self._size_cache[shape] = self._datagram_bytes(
                    env.src, env.dst, 1 << (7 * (length - 1)), sent_at or 1.5, body)
            total += size
        return total

    def received(self, dst: np.ndarray, src: np.ndarray, seq: np.ndarray) -> None:
        """Datagrams delivered (any kind, one sequence stream per link, as in agent.gossip)."""
        mine = self.monitored[dst]
        for d, s, q in zip(dst[mine].tolist(), src[mine].tolist(), seq[mine].tolist()):
            change = self._windows.setdefault((d, s), lives.SeqWindow()).accept(q)
            if change is None:
                self.replayed += 1
            else:
                self.lost += change
                self.accepted += 1

    def restart(self, i: int) -> None:
        """Node i's new incarnation: receivers start fresh windows for it."""
        for key in [key for key in self._windows if key[1] == i]:
            del self._windows[key]

    @property
    def loss_detected(self) -> float:
        """Share of the monitored streams' updates the receivers count as lost."""
        expected = self.accepted + self.lost
        return self.lost / expected if expected else 0.0
