"""Per-node identity: each agent's Ed25519 key pair signs what it sends, and a receiver
accepts a datagram only under a public key registered for the node id in its header, so a
host holding its own key can speak only as itself (docs/security.md "Per-node keys").

    keys = load_node_keys("/etc/drl/node.key", "/etc/drl/peers.pub")   # --identity, --peer-keys
    sig = keys.identity.sign(body)                   # wire.encode does this
    keys.peers["h2"]                                 # h2's public keys: any may verify (rotation)

The identity file is a PKCS#8 PEM private key (``openssl genpkey -algorithm ed25519``); the
peer keys file has lines ``NODE_ID BASE64`` (the raw 32-byte public key, ``public_text``;
``#`` starts a comment), several lines for a node while its key is being replaced.
Every problem is one keys.KeyFileError line.
"""
from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from drl.agent import logs
from drl.agent.gossip.keys import KeyFileError, read_key_file

SIG_BYTES = 64
PUBLIC_BYTES = 32
MAX_KEYS_PER_NODE = 4     # a forged datagram costs a verification per key its claimed sender has
MAX_PEER_KEYS_FILE = 1 << 20
MAKE_IDENTITY = "openssl genpkey -algorithm ed25519 -out {path} && chmod 600 {path}"

log = logs.get_logger("drl.keys")


def public_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """A public key as the peer keys file and the registry write it: base64 of its 32 bytes."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return base64.b64encode(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def parse_public(text: str) -> Ed25519PublicKey:
    """``public_text`` back; raises ValueError saying what is wrong."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{text[:16]!r} is not base64") from None
    if len(raw) != PUBLIC_BYTES:
        raise ValueError(f"{len(raw)} bytes, an Ed25519 public key has {PUBLIC_BYTES} "
                         "(openssl pkey -in KEY -pubout -outform DER | tail -c 32 | base64)")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify(keys: Iterable[Ed25519PublicKey], sig: bytes, body: bytes) -> bool:
    """Whether ``sig`` is some key's of ``keys`` over ``body``."""
    for key in keys:
        try:
            key.verify(sig, body)
            return True
        except InvalidSignature:
            continue
    return False


@dataclass(frozen=True)
class NodeKeys:
    """This agent's private key and the public keys of the node ids it accepts (from the peer
    keys file; the registry's are added in GossipCore)."""
    identity: Ed25519PrivateKey
    peers: Mapping[str, tuple[Ed25519PublicKey, ...]] = field(default_factory=dict)

    @property
    def public(self) -> str:
        return public_text(self.identity)


def load_identity(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The private key of ``--identity``; warns when every user may read it."""
    data = read_key_file(path, "identity file", MAKE_IDENTITY.format(path=path))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:            # an encrypted one: the agent starts unattended
        raise KeyFileError(f"identity file {path} is encrypted: give it without a passphrase") from None
    except ValueError:
        raise KeyFileError(f"identity file {path} is not a PEM private key "
                           f"(make one: {MAKE_IDENTITY.format(path=path)})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"identity file {path} holds a {type(key).__name__.removesuffix('PrivateKey') or 'other'} "
                           "key, not an Ed25519 one (openssl genpkey -algorithm ed25519)")
    return key


def load_peer_keys(path: str | os.PathLike) -> dict[str, tuple[Ed25519PublicKey, ...]]:
    """``--peer-keys``: node id -> its public keys, in the order of the file."""
    text = read_key_file(path, "peer keys file", "a line 'NODE_ID KEY' per node, KEY from "
                         "openssl pkey -in NODE.key -pubout -outform DER | tail -c 32 | base64",
                         secret=False, most=MAX_PEER_KEYS_FILE)
    peers: dict[str, list[Ed25519PublicKey]] = {}
    for n, line in enumerate(text.decode(errors="replace").splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise KeyFileError(f"peer keys file {path} line {n}: expected 'NODE_ID BASE64_KEY', got {line.strip()!r}")
        node, text_key = words
        try:
            key = parse_public(text_key)
        except ValueError as e:
            raise KeyFileError(f"peer keys file {path} line {n}: key of {node!r}: {e}") from None
        keys = peers.setdefault(node, [])
        if len(keys) == MAX_KEYS_PER_NODE:
            raise KeyFileError(f"peer keys file {path} line {n}: more than {MAX_KEYS_PER_NODE} keys for {node!r}")
        keys.append(key)
    return {node: tuple(keys) for node, keys in peers.items()}


def load_node_keys(identity: str | os.PathLike, peer_keys: str | os.PathLike | None) -> NodeKeys:
    """Both files (``peer_keys`` None: with a registry, the members' own); raises KeyFileError."""
    keys = NodeKeys(load_identity(identity), load_peer_keys(peer_keys) if peer_keys else {})
    log.info("identity", file=str(identity), public_key=keys.public, peers_with_keys=len(keys.peers))
    return keys
