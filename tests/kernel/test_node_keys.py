"""Per-node keys with real agents (docs/security.md "Per-node keys"): three agents that sign
with their own Ed25519 keys (and the cluster key as outer MAC) hold the limit; the owner of
h2's host, holding h2's key and the cluster key, forging datagrams as h3 from h2's address
is refused (``bad_signature``) and changes nothing; h2's key is rotated with reloads and
gossip goes on.

Topology: lab/topology.py's star, 3 hosts, one shared peer keys file.  The forger sends
with tests/kernel/test_agent_identity.py's raw socket (h2's address and port, while h2's
agent keeps gossiping).
"""
from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from drl.agent.config.build import class_key
from drl.agent.gossip.keys import load_key
from drl.agent.gossip.signing import public_text
from drl.agent.gossip.wire import LimitNote
from drl.agent.service.control import request
from drl.agent.service.daemon import CLUSTER
from drl.agent.gossip.wire import Batch, ClassValue, Header, Message, encode

from tests.kernel.test_agent_identity import peer, send_raw_from

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

GLOBAL_BPS = 10e6


def write_identity(path, key: Ed25519PrivateKey) -> None:
    path.touch(mode=0o600)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def write_peer_keys(path, keys: dict[str, list[Ed25519PrivateKey]]) -> None:
    path.write_text("".join(f"{node} {public_text(k)}\n" for node, ks in keys.items() for k in ks))


def all_alive(st: dict) -> bool:
    return all(p["state"] == "alive" for p in st["peers"])


def steady(st: dict) -> bool:
    """Every peer heard, so none's share is held back: the whole global limit in force."""
    return all_alive(st) and st["effective_limit_bps"] == GLOBAL_BPS


def forged_as_h3(cluster_key: bytes, signer: Ed25519PrivateKey, seq: int) -> bytes:
    """What h1 would take from h3 (cluster key, dst, cluster right), signed with h2's key."""
    batch = Batch((ClassValue(class_key("default"), seq, 1e12),), (LimitNote(class_key("default"), 99, 1000.0),))
    header = Header(cluster=CLUSTER, node="h3", dst="h1", seq=seq, incarnation=2**50, sent_at=0.0)
    return encode(Message(header, batch), cluster_key, signer)


def reload(agent) -> None:
    reply = request(agent.socket, "reload", timeout_s=5.0)
    assert reply["ok"] and reply["public_key"], reply


def test_per_node_keys_hold_the_limit_refuse_a_host_forging_another_and_rotate_by_reload(net3, agents, tmp_path):
    hosts = h1, h2, h3 = net3.hosts
    keys = {h.name: Ed25519PrivateKey.generate() for h in hosts}
    for h in hosts:
        write_identity(tmp_path / f"{h.name}.key", keys[h.name])
    peers_file = tmp_path / "peers.pub"
    write_peer_keys(peers_file, {n: [k] for n, k in keys.items()})
    started = [agents.start(h, [p for p in hosts if p is not h], "grd", "10mbit", "--interval", "100ms",
                            "--identity", str(tmp_path / f"{h.name}.key"), "--peer-keys", str(peers_file))
               for h in hosts]
    a1, a2, a3 = started
    # the limit held: everyone hears everyone, and the three shares make the global limit
    sts = [a.wait_for(steady, 10) for a in started]
    assert all(map(steady, sts)), [(s["peers"], s["effective_limit_bps"]) for s in sts]
    before = a1.status()
    assert not before["gossip"]["rejected_by_reason"], before["gossip"]

    # h2's owner, holding h2's key and the cluster key, speaks as h3: refused, nothing changes
    cluster_key = load_key(tmp_path / "cluster.key")
    send_raw_from(h2, h1.addr4, [forged_as_h3(cluster_key, keys["h2"], seq) for seq in range(1, 6)])
    after = a1.wait_for(lambda s: s["gossip"]["rejected"] >= 5, 5)
    assert after["gossip"]["rejected_by_reason"] == {"bad_signature": 5}, after["gossip"]
    assert peer(after, "h3")["incarnation"] == peer(before, "h3")["incarnation"] < 2**50
    for k in ("global_limit_bps", "limit_version", "effective_limit_bps"):
        assert after[k] == before[k], (k, before[k], after[k])
    assert after["allocator_state"]["global_demand_bps"] < 1e6, after["allocator_state"]

    # rotation: every host learns h2's new key beside the old, h2 switches, the old goes
    new = Ed25519PrivateKey.generate()
    write_peer_keys(peers_file, {"h1": [keys["h1"]], "h2": [keys["h2"], new], "h3": [keys["h3"]]})
    for a in (a1, a3):
        reload(a)
    write_identity(tmp_path / "h2.key", new)
    reload(a2)
    time.sleep(1.0)         # the overlap: h2's Hellos under the new key reach its peers (pairs.py)
    write_peer_keys(peers_file, {"h1": [keys["h1"]], "h2": [new], "h3": [keys["h3"]]})
    for a in (a1, a3):
        reload(a)
    heard = [a.status()["gossip"]["received"] for a in (a1, a3)]
    later = [a.wait_for(lambda s, n=n: s["gossip"]["received"] > n + 20 and steady(s), 5)
             for a, n in zip((a1, a3), heard)]
    for st in later:
        assert steady(st), (st["peers"], st["effective_limit_bps"])
        # nothing refused but the forgery: h2's new key verified from the first datagram it signed
        assert st["gossip"]["rejected_by_reason"] == ({"bad_signature": 5} if st is later[0] else {}), st["gossip"]
    assert public_text(new) in a2.log.read_text()          # event=identity of the reload
