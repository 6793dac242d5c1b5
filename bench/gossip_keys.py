"""What per-node keys cost a tick: the cluster key alone, signatures, pair keys.

    .venv/bin/python bench/gossip_keys.py                   # 1,000 classes, 64 agents, ~30 s
    .venv/bin/python bench/gossip_keys.py --classes 100 --agents 16 --rounds 20

Two real GossipCores (agent/gossip/core.py), in one process, no socket: ``a`` publishes
every class (all active, values changing) to ``b`` every round and ``b`` receives them,
``--rounds`` times, in three modes:

    hmac      the cluster key's MAC alone (no --identity)
    signed    --identity, b's Hellos lost: each datagram signed and verified (wire version 6's way)
    paired    --identity, the pair key agreed (pairs.py): Hellos signed, everything else MACed

A round's datagrams to one peer and the time ``a`` takes to make them and ``b`` to check and
read them are measured; a tick's cost for one agent of ``--agents`` is then what it sends
to its targets (min(branching, agents - 1)) plus what it receives (as many, on average:
every agent sends to that many), for the default branching and for a full mesh.
"""
from __future__ import annotations

import argparse
import statistics
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from drl.agent.gossip.core import GossipCore, Outgoing
from drl.agent.gossip.signing import NodeKeys

KEY = b"0123456789abcdef0123456789abcdef"
BRANCHING = 16          # the agent's default (--branching)


def pair(mode: str):
    ids = {n: Ed25519PrivateKey.generate() for n in "ab"}
    pub = {n: (k.public_key(),) for n, k in ids.items()}

    def core(me, other):
        keys = None if mode == "hmac" else NodeKeys(ids[me], pub)
        return GossipCore(me, "drl", KEY, [other.upper()], 1, 1, names={other.upper(): other}, keys=keys)
    return core("a", "b"), core("b", "a")


def settle(a: GossipCore, b: GossipCore, now: float) -> float:
    """A few rounds both ways: the Hellos agree on the pair key."""
    for _ in range(5):
        now += 0.1
        for src, dst, addr in ((a, b, "A"), (b, a, "B")):
            for _, data in src.publish({1: Outgoing(1.0)}, now):
                dst.receive(data, addr, now)
    return now


def measure(mode: str, classes: int, rounds: int) -> tuple[int, float, float]:
    """(datagrams a round, ms to send them, ms to receive them): medians over ``rounds``."""
    a, b = pair(mode)
    # signed: b's Hellos never reach a, so a never learns b's key and signs everything
    now = settle(a, b, 0.0) if mode == "paired" else 0.0
    sends, recvs, count = [], [], 0
    for r in range(rounds):
        now += 0.1
        out = {k: Outgoing(1e6 + r * 1000.0 + k) for k in range(classes)}
        t0 = time.perf_counter()
        sent = a.publish(out, now)
        t1 = time.perf_counter()
        for _, data in sent:
            b.receive(data, "A", now)
        t2 = time.perf_counter()
        sends.append((t1 - t0) * 1e3)
        recvs.append((t2 - t1) * 1e3)
        count = len(sent)
    assert not b.stats.rejected, b.stats.rejected
    return count, statistics.median(sends), statistics.median(recvs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    peers = args.agents - 1
    print(f"{args.classes} active classes, {args.agents} agents, medians of {args.rounds} rounds")
    print("| mode | datagrams a peer | send to one peer (ms) | receive from one (ms) "
          f"| tick at branching {BRANCHING} (ms) | tick, full mesh of {args.agents} (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in ("hmac", "signed", "paired"):
        n, send, recv = measure(mode, args.classes, args.rounds)
        fan = min(BRANCHING, peers)
        print(f"| {mode} | {n} | {send:.2f} | {recv:.2f} | {fan * (send + recv):.1f} | {peers * (send + recv):.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
