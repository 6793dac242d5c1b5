"""Peer identity with real agents: a datagram signed with the real
cluster key, sent from a configured peer's address under another node id, is
rejected as ``wrong_sender``, counted, and changes nothing; a forged jump in a
peer's incarnation locks the real peer out for at most the liveness timeout.

Topology: lab/topology.py's star, 3 hosts.  h1's agent (the victim) names h2 and
h3 as peers (``ID@HOST:PORT``); h2 runs an agent, h3 none (its slot stays stale).
The forger holds the key.  From h2 it sends with a raw socket, so the datagram
leaves h2's own address and gossip port while h2's agent keeps that port bound
and keeps gossiping; from h3 an ordinary socket binds h3's gossip port.
"""
from __future__ import annotations

import struct
import time

import pytest

from drl.agent.config.build import class_key
from drl.agent.service.daemon import CLUSTER
from drl.agent.gossip.keys import load_key
from drl.agent.gossip.wire import Batch, ClassValue, Header, LimitNote, Message, encode
from drl.lab.agents import GOSSIP_PORT as PORT

pytestmark = pytest.mark.kernel

INTERVAL_S = 0.1
TIMEOUT_S = 3 * INTERVAL_S       # membership.liveness_timeout: full mesh, 3 missed intervals


def keyed(key: bytes, node: str, incarnation: int, seq: int, value_Bps: float,
          note: LimitNote | None = None) -> bytes:
    """A datagram h1 would accept from ``node``: the cluster key, cluster and dst right."""
    default = class_key("default")
    batch = Batch((ClassValue(default, seq, value_Bps),), (note,) if note else ())
    header = Header(cluster=CLUSTER, node=node, dst="h1", seq=seq, incarnation=incarnation, sent_at=0.0)
    return encode(Message(header, batch), key)


def send_raw_from(host, dst: str, datagrams: list[bytes]) -> None:
    """UDP from ``host``'s address and gossip port, without binding it (its agent holds it):
    a raw socket, the UDP header written here (checksum 0: none, valid for IPv4)."""
    packets = [struct.pack("!HHHH", PORT, PORT, 8 + len(d), 0) + d for d in datagrams]
    host.run("python3", "-c", "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_RAW, "
                              "socket.IPPROTO_UDP); "
                              f"[s.sendto(bytes.fromhex(p), ('{dst}', 0)) for p in sys.argv[1:]]",
             *(p.hex() for p in packets))


def send_bound_from(host, dst: str, datagrams: list[bytes]) -> None:
    host.run("python3", "-c", "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                              f"s.bind(('{host.addr4}', {PORT})); "
                              f"[s.sendto(bytes.fromhex(d), ('{dst}', {PORT})) for d in sys.argv[1:]]",
             *(d.hex() for d in datagrams))


def peer(st: dict, node: str) -> dict:
    [row] = [p for p in st["peers"] if p["node_id"] == node]
    return row


def steady(a1):
    """h1's status once h2 is alive and h1 has ticked with it: 2 of 3 shares (h3 is stale)."""
    st = a1.wait_for(lambda s: peer(s, "h2")["state"] == "alive" and s["effective_limit_bps"] > 6e6, 10)
    assert peer(st, "h2")["state"] == "alive" and st["effective_limit_bps"] == pytest.approx(20e6 / 3), st
    return st


def test_a_keyed_datagram_with_a_foreign_id_from_a_peers_address_is_rejected_and_changes_nothing(
        net3, agents, tmp_path):
    h1, h2, h3 = net3.hosts
    a1 = agents.start(h1, [h2, h3], "grd", "10mbit", "--interval", "100ms")
    agents.start(h2, [h1], "grd", "10mbit", "--interval", "100ms")
    before = steady(a1)
    key = load_key(tmp_path / "cluster.key")
    # h3's id from h2's address: a huge demand and a newer, tiny limit
    as_h3 = [keyed(key, "h3", 2**50, seq, 1e12, LimitNote(class_key("default"), 99, 1000.0)) for seq in range(1, 6)]
    send_raw_from(h2, h1.addr4, as_h3)
    # h2's id from h3's address (configured, named h3)
    as_h2 = [keyed(key, "h2", 2**50, seq, 1e12, LimitNote(class_key("default"), 99, 1000.0)) for seq in range(1, 6)]
    send_bound_from(h3, h1.addr4, as_h2)
    # h2 alive and counted as before: a 0.3-s stall of a busy machine makes it stale for a moment,
    # which the forgery must not make lasting
    # (and heard since: a status the tick after the forgeries may have none of h2's yet)
    after = a1.wait_for(lambda s: s["gossip"]["rejected"] >= 10 and peer(s, "h2")["state"] == "alive"
                        and s["effective_limit_bps"] == before["effective_limit_bps"]
                        and s["gossip"]["received"] > before["gossip"]["received"], 5)
    assert after["gossip"]["rejected_by_reason"] == {"wrong_sender": 10}, after["gossip"]
    assert [(p["node_id"], p["address"]) for p in after["peers"]] == \
        [("h2", f"{h2.addr4}:{PORT}"), ("h3", f"{h3.addr4}:{PORT}")], after["peers"]
    assert peer(after, "h2")["state"] == "alive" and peer(after, "h3")["state"] == "stale", after["peers"]
    assert peer(after, "h2")["incarnation"] == peer(before, "h2")["incarnation"] < 2**50
    assert peer(after, "h3")["incarnation"] == 0 and peer(after, "h3")["last_seen_s"] is None
    # not "mode": h1 is held in bucket mode at its safe rate whenever h2 says it has not heard
    # h1 within the timeout (model.heard_cap), which a 0.3-s stall of a busy CI machine does
    for k in ("global_limit_bps", "limit_version", "effective_limit_bps", "drop_probability"):
        assert after[k] == before[k], (k, before[k], after[k])
    assert after["global_limit_bps"] == 10e6 and after["limit_version"] == 0
    assert after["allocator_state"]["global_demand_bps"] < 1e6, after["allocator_state"]
    assert after["gossip"]["received"] > before["gossip"]["received"]     # h2 goes on being heard


def test_a_forged_higher_incarnation_locks_the_real_peer_out_for_at_most_the_timeout(net3, agents, tmp_path):
    """The forger has everything (key, h2's address and id): its datagram is accepted, and
    it is h2 for a moment; but the real h2 is back once the forged life is silent."""
    h1, h2, h3 = net3.hosts
    a1 = agents.start(h1, [h2, h3], "grd", "10mbit", "--interval", "100ms")
    agents.start(h2, [h1], "grd", "10mbit", "--interval", "100ms")
    real = peer(steady(a1), "h2")["incarnation"]
    key = load_key(tmp_path / "cluster.key")
    send_raw_from(h2, h1.addr4, [keyed(key, "h2", 2**50, 1, 1e12)])
    jumped = a1.wait_for(lambda s: s["gossip"]["rejected_by_reason"].get("old_incarnation"), 5)
    assert jumped["gossip"]["rejected_by_reason"].get("old_incarnation"), jumped["gossip"]   # h2 shouted down
    back = a1.wait_for(lambda s: peer(s, "h2")["incarnation"] == real and peer(s, "h2")["state"] == "alive", 5)
    assert peer(back, "h2")["incarnation"] == real and peer(back, "h2")["state"] == "alive", back["peers"]
    # shouted down for about the liveness timeout: a few of h2's datagrams, not the rest of the run
    shouted = back["gossip"]["rejected_by_reason"]["old_incarnation"]
    assert shouted <= (TIMEOUT_S + 0.3) / INTERVAL_S, back["gossip"]
    time.sleep(2)
    later = a1.wait_for(lambda s: peer(s, "h2")["state"] == "alive", 3)     # alive again after a stall
    assert later["gossip"]["rejected_by_reason"] == back["gossip"]["rejected_by_reason"], later["gossip"]
    assert peer(later, "h2")["state"] == "alive" and later["allocator_state"]["global_demand_bps"] < 1e6
