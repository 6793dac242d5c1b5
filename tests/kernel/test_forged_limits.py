"""Forged limit notes against 3 real agents, then the operator's ``drlctl set`` (issue 44).

Seen before: a note at version 2^63 - 3 and 1 Tbit/s, signed with the cluster key, was
adopted by every agent, and no set could follow it.  Now (agent/cluster/limits.py): a
version further than 60 s ahead of an agent's clock is never adopted, refused and logged
once per sender; a forged near-future one is adopted (within the bound, as any key holder's
note) and the next set, one more than it, wins on every agent within a few intervals.

Topology: lab/topology.py's star, 3 hosts, an agent on each, every other one its peer.  The
forger holds the key and speaks as a peer from that peer's own address and gossip port
(test_agent_identity.py's raw socket), with a new incarnation, which locks the real peer
out for at most the liveness timeout.
"""
from __future__ import annotations

import subprocess
import time

import pytest
from test_agent_identity import send_raw_from

from drl.agent.config.build import class_key
from drl.agent.gossip.keys import load_key
from drl.agent.gossip.wire import Batch, Header, LimitNote, Message, encode
from drl.agent.service.daemon import CLUSTER
from drl.lab.agents import installed

pytestmark = pytest.mark.kernel

TBIT_Bps = 1.25e11
TOP = 2**63 - 3          # the incident's version: the wire still lets it through, the book does not


def forged(key: bytes, speaker: str, to: str, incarnation: int, version: int) -> list[bytes]:
    """Ten datagrams from ``speaker`` to ``to`` carrying a 1-Tbit/s limit at ``version``."""
    note = LimitNote(class_key("default"), version, TBIT_Bps)
    return [encode(Message(Header(cluster=CLUSTER, node=speaker, dst=to, seq=seq, incarnation=incarnation,
                                  sent_at=0.0), Batch((), (note,))), key) for seq in range(1, 11)]


def incarnation_of(agent, node: str) -> int:
    [row] = [p for p in agent.status()["peers"] if p["node_id"] == node]
    return row["incarnation"]


def everyone(agents, predicate, timeout_s: float) -> list[dict]:
    return [a.wait_for(predicate, timeout_s) for a in agents]


def test_a_forged_top_version_is_never_adopted_and_a_set_beats_a_near_future_one(net3, cluster, tmp_path):
    hosts = net3.hosts
    agents = cluster(net3).start_mesh(hosts, "fps", "10mbit", "--interval", "100ms")
    key = load_key(tmp_path / "cluster.key")
    everyone(agents, lambda s: all(p["state"] == "alive" for p in s["peers"]), 10)
    # each agent hears the top version from the next host's address, as that host, for ~1 s
    for i, (host, agent) in enumerate(zip(hosts, agents)):
        speaker = hosts[(i + 1) % 3]
        for d in forged(key, speaker.name, host.name, incarnation_of(agent, speaker.name) + 1, TOP):
            send_raw_from(speaker, host.addr4, [d])
            time.sleep(0.03)
    time.sleep(0.5)
    for i, (host, agent) in enumerate(zip(hosts, agents)):
        st = agent.status()
        assert st["global_limit_bps"] == 10e6 and st["limit_version"] == 0, (host.name, st["limit_version"])
        lines = [ln for ln in agent.log.read_text().splitlines() if "event=limit_ahead" in ln]
        assert len(lines) == 1 and f"from={hosts[(i + 1) % 3].name}" in lines[0], lines     # once per sender

    # a near-future one, to h1 only: adopted (within the bound), and gossip spreads it
    near = int(time.time() * 1000) + 30_000
    h1, h2, h3 = hosts
    send_raw_from(h2, h1.addr4, forged(key, "h2", "h1", incarnation_of(agents[0], "h2") + 2, near)[:1])
    sts = everyone(agents, lambda s: s["global_limit_bps"] == 8 * TBIT_Bps, 5)
    assert [s["limit_version"] for s in sts] == [near] * 3, [s["limit_version"] for s in sts]

    t_set = time.monotonic()
    ctl = subprocess.run([installed("drlctl"), "--socket", agents[2].socket, "set", "default", "--global",
                          "20mbit"], capture_output=True, text=True)
    assert ctl.returncode == 0, ctl.stderr
    sts = everyone(agents, lambda s: s["global_limit_bps"] == 20e6, 5)
    took_s = time.monotonic() - t_set
    assert all(s["global_limit_bps"] == 20e6 and s["limit_version"] == near + 1 for s in sts), \
        [(s["global_limit_bps"], s["limit_version"]) for s in sts]
    print(f"measured: every agent at the operator's 20 Mbit/s {took_s:.2f} s after the set")
    assert took_s < 3.0
