"""Pair keys: per-node identity at the cost of an HMAC a datagram, not a signature.

    pairs = Pairs("drl", "h1")                   # a fresh X25519 key pair for this life
    hello = pairs.hello(addr, "h2", now)         # a Hello due to h2 (sent signed), or None
    pairs.heard("h2", key, knows, ok, signer)    # a Hello from h2, accepted; signer: the key it verified under
    pairs.sending_key("h2")                      # the key to MAC what we send h2, once it holds ours
    pairs.key("h2")                              # the key h2's datagrams are checked with

Why.  An Ed25519 signature costs ~60 us to make and ~150 us to check (docs/security.md
"Per-node keys"): at 1,000 classes a tick's Batches are 13 datagrams a peer, and a full mesh
of 64 agents would spend more than a 100-ms tick checking its peers' signatures.  What a
signature proves, that the sender holds its node's private key, needs proving once a life.

How.  Every agent makes an X25519 key pair when it starts and sends its public key in a Hello,
signed with its Ed25519 key like any datagram (so a Hello is its node's and nobody else's, and
the replay window and incarnations apply to it as to the rest).  Two agents that hold each
other's X25519 public keys derive the same pair key: HKDF-SHA256 of their X25519 shared secret,
bound to the cluster, both node ids and both public keys.  Only those two can compute it, so
a datagram MACed with it is from the one of them that did not receive it: as strong as the
signature for what the receiver accepts, at ~3 us.  (The same construction as a signed
ephemeral Diffie-Hellman, e.g. SIGMA, Krawczyk, CRYPTO 2003; all primitives from
``cryptography``.)

A sender MACs with the pair key only once the receiver has said, in a Hello, that it holds the
sender's current public key (``knows``); until then it signs.  Each Hello also says whether
its sender has heard that much from the receiver (``ok``), so both ends know when to stop: a
Hello goes to a peer whenever what it would say changed, and once a second while the pair is
not settled both ways.  A restart makes a new key pair: the peers hear its Hello, stop MACing
with the old key (a datagram under it is ``bad_pair_mac``, as one from a life it no longer
has would be ``other_life``) and agree on the new one within a few Hellos.  A pair is kept
while the Ed25519 key its latest Hello verified under is listed for its node: a key retired
(a reload, the registry) ends the pairs it made, so whoever held it cannot go on with a pair
key either.  A rotation keeps them: the node's reload with its new identity sends every peer
a Hello signed with it (``renew``), so once the old key goes the pairs are the new key's.
"""
from __future__ import annotations

import math
from typing import Callable, Hashable, Iterable

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

X25519_BYTES = 32
HELLO_RETRY_S = 1.0     # a Hello again, while the pair is not settled both ways


class _Peer:
    """What we hold of one peer: its public key, the pair key, and what its last Hello said."""
    __slots__ = ("theirs", "key", "holds_ours", "ok", "signer")

    def __init__(self, theirs: bytes, key: bytes) -> None:
        self.theirs, self.key = theirs, key
        self.holds_ours = self.ok = False
        self.signer: str | None = None      # the Ed25519 key (public_text) its latest signed Hello verified under


class Pairs:
    def __init__(self, cluster: str, node_id: str) -> None:
        self.cluster, self.node_id = cluster, node_id
        self._private = X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(serialization.Encoding.Raw,
                                                               serialization.PublicFormat.Raw)
        self._peers: dict[str, _Peer] = {}
        self._said: dict[Hashable, tuple[tuple, float]] = {}     # per address: the last Hello, when

    def key(self, node: str) -> bytes | None:
        """The pair key ``node``'s pair-MACed datagrams verify under; None: none agreed."""
        peer = self._peers.get(node)
        return None if peer is None else peer.key

    def sending_key(self, node: str) -> bytes | None:
        """The pair key to MAC what we send ``node``, once it has said it holds our public key."""
        peer = self._peers.get(node)
        return peer.key if peer is not None and peer.holds_ours else None

    def hello(self, addr: Hashable, node: str, now: float) -> tuple[bytes, bytes, bool] | None:
        """(key, knows, ok) of the Hello due to ``node`` at ``addr`` now, or None: when what it
        would say changed since the last one, or HELLO_RETRY_S after it while not settled."""
        peer = self._peers.get(node)
        say = (self.public, b"", False) if peer is None else (self.public, peer.theirs, peer.holds_ours)
        last, at = self._said.get(addr, ((), -math.inf))
        settled = peer is not None and peer.holds_ours and peer.ok
        if say != last or (not settled and now - at >= HELLO_RETRY_S):
            self._said[addr] = (say, now)
            return say
        return None

    def heard(self, node: str, key: bytes, knows: bytes, ok: bool, signer: str | None) -> bool:
        """A Hello ``node`` sent, accepted (authenticated as ``node``'s, not a replay); ``signer``:
        the Ed25519 key it verified under (None: it came under the pair key).  False when its
        key cannot make a shared secret (a low-order point), which then changes nothing."""
        peer = self._peers.get(node)
        if peer is None or peer.theirs != key:
            pair = self._derive(node, key)
            if pair is None:
                return False
            peer = self._peers[node] = _Peer(key, pair)
        peer.holds_ours, peer.ok = knows == self.public, ok
        peer.signer = signer or peer.signer
        return True

    def retire(self, listed: Callable[[str], Iterable[str]]) -> None:
        """The keys listed for each node changed: a pair whose signer is no longer among
        ``listed(node)`` (public_text) ends."""
        for node in [n for n, p in self._peers.items() if p.signer not in set(listed(n))]:
            del self._peers[node]

    def renew(self) -> None:
        """Our own Ed25519 key changed: every peer gets a Hello signed with the new one."""
        self._said.clear()

    def paired(self) -> int:
        """Peers we MAC for and that MAC for us."""
        return sum(1 for p in self._peers.values() if p.holds_ours and p.ok)

    def _derive(self, node: str, theirs: bytes) -> bytes | None:
        try:
            secret = self._private.exchange(X25519PublicKey.from_public_bytes(theirs))
        except ValueError:              # an all-zero shared secret: a low-order point
            return None
        ids = sorted((self.node_id, node))
        pubs = sorted((self.public, theirs))
        parts = [b"drl pair key 1", self.cluster.encode(), *(i.encode() for i in ids), *pubs]
        info = b"".join(len(part).to_bytes(2, "big") + part for part in parts)     # unambiguous
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
