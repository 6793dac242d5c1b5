"""Per-node keys (agent/gossip/signing.py, wire.py, core.py "Per-node keys"): a datagram is
accepted only under a key registered for the node id in its header, so a host holding its
own key speaks as no other; rotation overlaps; bad key files are one line; a flood of
failing signatures costs at most VERIFY_FAILURES_PER_S verifications a second per address."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from drl.agent.gossip.core import VERIFY_FAILURES_PER_S, GossipCore, Outgoing
from drl.agent.gossip.keys import KeyFileError
from drl.agent.gossip.signing import NodeKeys, load_identity, load_node_keys, load_peer_keys, public_text
from drl.agent.gossip.wire import (MAX_DATAGRAM, Batch, ClassValue, Header, Message, Reason, decode, encode)
from drl.agent.cluster.registry import decode as decode_registry

KEY = b"0123456789abcdef0123456789abcdef"
A, B, C = (Ed25519PrivateKey.generate() for _ in range(3))
PUB = {"a": (A.public_key(),), "b": (B.public_key(),), "c": (C.public_key(),)}


def msg(node: str, seq: int = 1, value: float = 1e6) -> Message:
    return Message(Header(cluster="drl", node=node, seq=seq, sent_at=0.0, incarnation=1),
                   Batch((ClassValue(7, 1, value),)))


def keys_of(node):
    return PUB.get(node, ())


def pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.mark.parametrize("key", [None, KEY])
def test_a_signed_datagram_verifies_under_its_senders_key(key):
    data = encode(msg("a"), key, A)
    assert decode(data, key, "drl", keys_of).payload.values[0].value == 1e6


@pytest.mark.parametrize("key", [None, KEY])
def test_a_nodes_key_cannot_speak_as_another_node(key):
    """b's host holds its own key and the cluster key: as a, it is refused."""
    assert decode(encode(msg("a"), key, B), key, "drl", keys_of) is Reason.BAD_SIGNATURE


def test_an_unsigned_or_unknown_node_is_refused():
    assert decode(encode(msg("z"), None, A), None, "drl", keys_of) is Reason.UNKNOWN_KEY
    assert decode(encode(msg("a"), None), None, "drl", keys_of) in (Reason.BAD_SIGNATURE, Reason.TRUNCATED,
                                                                     Reason.GARBAGE)


def test_the_cluster_key_is_checked_before_the_signature():
    data = encode(msg("a"), KEY, A)
    assert decode(data, b"another key of 32 bytes, not it!", "drl", keys_of) is Reason.FORGED


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_tampered_datagram_decodes(data):
    """Any byte changed, cut or added in a signed datagram (without the cluster key, which
    would stop it before): never accepted."""
    good = encode(msg("a", value=data.draw(st.floats(0, 1e9))), None, A)
    i = data.draw(st.integers(0, len(good) - 1))
    how = data.draw(st.sampled_from(["flip", "cut", "add"]))
    if how == "flip":
        bad = good[:i] + bytes([good[i] ^ data.draw(st.integers(1, 255))]) + good[i + 1:]
    elif how == "cut":
        bad = good[:i] + good[i + 1:]
    else:
        bad = good[:i] + data.draw(st.binary(min_size=1, max_size=8)) + good[i:]
    assert isinstance(decode(bad, None, "drl", keys_of), Reason)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=MAX_DATAGRAM + 8))
def test_no_forged_bytes_decode_and_none_raise(blob):
    assert isinstance(decode(blob, None, "drl", keys_of), Reason)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["a", "b", "c"]), st.sampled_from(["a", "b", "c"]))
def test_only_the_named_nodes_own_key_verifies(claimed, signer):
    keys = {"a": A, "b": B, "c": C}
    out = decode(encode(msg(claimed), None, keys[signer]), None, "drl", keys_of)
    assert isinstance(out, Message) == (claimed == signer)


def test_rotation_accepts_every_listed_key_and_a_reload_drops_the_old():
    new = Ed25519PrivateKey.generate()
    both = {"a": (A.public_key(), new.public_key())}
    for signer in (A, new):
        assert isinstance(decode(encode(msg("a"), None, signer), None, "drl", both.get), Message)
    core = GossipCore("b", "drl", None, ["A"], 1, 1, keys=NodeKeys(B, both), names={"A": "a"})
    assert core.receive(encode(msg("a"), None, A), "A", 0.0) is not None
    core.set_keys(NodeKeys(B, {"a": (new.public_key(),)}))
    assert core.receive(encode(msg("a", seq=2), None, A), "A", 0.1) is None
    assert core.receive(encode(msg("a", seq=3), None, new), "A", 0.2) is not None
    assert core.stats.rejected == {"bad_signature": 1}


def test_registry_keys_verify_when_the_file_has_none_and_bad_ones_are_left_out():
    core = GossipCore("b", "drl", None, ["A"], 1, 1, keys=NodeKeys(B, {}))
    assert core.receive(encode(msg("a"), None, A), "A", 0.0) is None
    core.set_registry_keys({"a": ["not base64!", public_text(A)]})
    assert core.receive(encode(msg("a", seq=2), None, A), "A", 0.1) is not None
    assert core.stats.rejected == {"unknown_key": 1}


def test_the_registry_record_carries_the_public_key():
    members, *_ = decode_registry("/drl/p/", {"/drl/p/members/a": b'{"addr": "10.0.0.1:7470", "keys": ["K"]}'})
    assert members["a"].keys == ("K",)


def test_two_signed_cores_gossip_and_every_datagram_fits_at_1000_classes():
    a = GossipCore("a", "drl", KEY, ["B"], 1, 1, keys=NodeKeys(A, {"b": PUB["b"]}))
    b = GossipCore("b", "drl", KEY, ["A"], 1, 1, keys=NodeKeys(B, {"a": PUB["a"]}))
    out = a.publish({k: Outgoing(float(k) * 1e6, 2**40, True, 1e9) for k in range(1000)}, 0.0)
    assert all(len(data) <= MAX_DATAGRAM for _, data in out) and len(out) > 5
    got = [b.receive(data, "A", 0.0) for _, data in out]
    assert got[-1] is None                  # the Hello (pairs.py), taken by the core
    assert sum(len(rx.payload.values) for rx in got[:-1]) == 1000 and not b.stats.rejected


def test_a_flood_of_bad_signatures_costs_at_most_the_budget_then_refills():
    core = GossipCore("b", "drl", None, ["A"], 1, 1, keys=NodeKeys(B, {"a": PUB["a"]}))
    forged = [encode(msg("a", seq=s), None, C) for s in range(1, 1001)]
    for data in forged:
        core.receive(data, "A", 0.0)
    assert core.stats.rejected == {"bad_signature": VERIFY_FAILURES_PER_S, "over_budget": 1000 - VERIFY_FAILURES_PER_S}
    assert core.receive(encode(msg("a", seq=2000), None, A), "A", 0.001) is None        # still empty
    assert core.receive(encode(msg("a", seq=2001), None, A), "A", 1.0) is not None      # refilled


@pytest.mark.parametrize("content, why", [
    (b"", "is empty"),
    (b"not a key at all", "not a PEM private key"),
    (pem(ec.generate_private_key(ec.SECP256R1())), "EllipticCurve key, not an Ed25519"),
])
def test_a_bad_identity_file_is_one_line(tmp_path, content, why):
    path = tmp_path / "node.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match=why) as e:
        load_identity(path)
    assert "\n" not in str(e.value)


def test_a_missing_identity_says_how_to_make_one(tmp_path):
    with pytest.raises(KeyFileError, match="openssl genpkey -algorithm ed25519"):
        load_identity(tmp_path / "none.key")


def test_a_world_readable_identity_is_warned_about(tmp_path, caplog):
    path = tmp_path / "node.key"
    path.write_bytes(pem(A))
    os.chmod(path, 0o644)
    assert public_text(load_identity(path)) == public_text(A)
    assert "key_file_readable" in caplog.text


@pytest.mark.parametrize("line, why", [
    ("a", "expected 'NODE_ID BASE64_KEY'"),
    ("a !!!", "not base64"),
    ("a " + "QUJD", "3 bytes, an Ed25519 public key has 32"),
    ("\n".join(f"a {public_text(Ed25519PrivateKey.generate())}" for _ in range(5)), "more than 4 keys"),
])
def test_a_bad_peer_keys_file_is_one_line(tmp_path, line, why):
    path = tmp_path / "peers.pub"
    path.write_text(f"# comment\nb {public_text(B)}\n{line}\n")
    with pytest.raises(KeyFileError, match=why) as e:
        load_peer_keys(path)
    assert "\n" not in str(e.value)


def test_the_peer_keys_file_lists_several_keys_a_node(tmp_path):
    (tmp_path / "node.key").write_bytes(pem(A))
    os.chmod(tmp_path / "node.key", 0o600)
    (tmp_path / "peers.pub").write_text(f"b {public_text(B)}  # old\nb {public_text(C)}\nc {public_text(C)}\n")
    keys = load_node_keys(tmp_path / "node.key", tmp_path / "peers.pub")
    assert [public_text(k) for k in keys.peers["b"]] == [public_text(B), public_text(C)] and keys.public == public_text(A)
