"""Gossip on a UDP socket: a :class:`GossipCore` (agent/gossip/core.py) bound to ``--listen``.

The daemon's tick (agent/service/tick.py)::

    peers = parse_peers(text)
    transport = UdpTransport.bind(parse_hostport(listen), [p.addr for p in peers], node_id=..., cluster=...,
                                  key=load_key(path),   # None only with --insecure
                                  branching=3, incarnation=new_incarnation(),
                                  names={p.addr: p.node_id for p in peers if p.node_id}, timeout_s=...)
    members = Membership(node_id, transport.peer_addrs,
                         liveness_timeout(interval, len(transport.peer_addrs), 3),
                         names={transport.resolved[p.addr]: p.node_id for p in peers if p.node_id})
    every interval (now = time.monotonic()):
        for rx in transport.poll(now):           # validated, de-duplicated, counted
            members.observe(rx, now)
            if rx.envelope: inbox[rx.header.class_id].append(rx.envelope)
        view = members.view(class_key, now)      # -> allocator Snapshot.view
        transport.publish({class_key: Outgoing(decision.publish, version, active), ...}, now)
        for env in step.outbox: transport.send(env, class_key, now)
    when the registry's set changes ({address: node id}, this node's entry left out):
        members.set_peers(transport.set_peers(current, timeout_s=t), timeout_s=t)   # t: None if fixed
    transport.close()
"""
from __future__ import annotations

import errno
import math
import random
import socket
import sys
from typing import Callable, Mapping, Sequence

from drl.agent.gossip.core import GossipCore, Outgoing, PeerList, Received, Stats
from drl.agent.model import Envelope
from drl.agent.gossip.peers import HostPort, format_addr
from drl.agent.gossip.signing import NodeKeys
from drl.agent.gossip.wire import MAX_DATAGRAM, ClassClients, LimitNote, Reason, Sums


class TransportError(Exception):
    """The UDP socket cannot be set up (port in use, address not local, name unresolvable)."""


def _resolve(host: str, port: int, family: int) -> HostPort:
    """One (host, port) in ``family``, in the form recvfrom reports it."""
    flags = socket.AI_V4MAPPED if family == socket.AF_INET6 else 0
    try:
        info = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM, 0, flags)
    except socket.gaierror as e:
        raise TransportError(f"cannot resolve {format_addr((host, port))}: {e.strerror}") from None
    return info[0][4][:2]


def _bind(listen: HostPort, mark: int | None = None) -> socket.socket:
    host, port = listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    addr = _resolve(host, port, family)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if mark is not None:
            _set_mark(sock, mark)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)   # IPv4 peers too
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = {errno.EADDRINUSE: "port already in use",
               errno.EADDRNOTAVAIL: "address is not on this host"}.get(e.errno, e.strerror)
        raise TransportError(f"cannot listen on {format_addr(listen)}: {why}") from None
    return sock


def _set_mark(sock: socket.socket, mark: int) -> None:
    """SO_MARK: every datagram the socket sends carries ``mark`` as skb->mark, which is
    how bpf/limiter.c tells the agent's own gossip from other traffic on its port
    (agent/abi.py GOSSIP_MARK).  Needs CAP_NET_ADMIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark.to_bytes(4, sys.byteorder))   # > INT_MAX too
    except OSError as e:
        sock.close()
        raise TransportError(f"cannot mark the gossip socket ({mark:#x}): {e.strerror} "
                             "(needs CAP_NET_ADMIN)") from None


# <asm-generic/socket.h>; Python's socket module names neither
SO_RCVBUFFORCE = 33
SO_RXQ_OVFL = 40
_DROPS_SPACE = socket.CMSG_SPACE(4)
RCVBUF_BYTES = 4 << 20     # ~10,000 small datagrams (the kernel doubles it; ~830 B each): a tick's worth of a 100-kpps flood


def _size_buffer(sock: socket.socket) -> None:
    """A deep receive buffer, so that a flood overruns it only when it outpaces the loop's
    reads, not while the loop ticks; and each datagram stamped with the kernel's count of the
    datagrams it dropped (SO_RXQ_OVFL), which ``poll`` counts as ``queue_full``."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)    # past rmem_max: CAP_NET_ADMIN
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)  # capped at net.core.rmem_max
    sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)


class UdpTransport:
    """A GossipCore on a UDP socket: ``UdpTransport.bind(listen, peers, ...)`` binds ``listen``;
    the constructor takes a socket already bound (tests bind port 0 first, so that
    peers can name each other's ports) and owns it from then on.

    ``poll(now)`` reads and validates at most ``queue_size`` datagrams a call and
    leaves the rest in the socket's buffer for the next (the loop ticks between
    calls, so a flood delays a tick by one call's work, ~5 ms, and every datagram
    that reaches the buffer is checked, none discarded unread); what the kernel
    dropped because the buffer was full is counted as ``queue_full``.  Send errors
    are counted, never raised.  ``peer_addrs`` are the resolved peer addresses, in
    the order given (for Membership); a peer equal to the bound address is this
    node and is left out.  ``resolved`` maps each given
    peer to its resolved address.  ``names`` (peer address as given -> node id,
    from ``--peers ID@HOST:PORT``) and ``timeout_s`` (the liveness timeout) bind
    ids to addresses in the core (GossipCore, "Identity").  ``set_peers`` changes the
    peers at runtime; an agent that may gain peers needs this transport from the start,
    even with none (Standalone has no socket, and the datapath exempts the gossip port
    it is told at startup).
    """

    def __init__(self, sock: socket.socket, peers: Sequence[HostPort], *, node_id: str, cluster: str,
                 key: bytes | None, branching: int, incarnation: int, queue_size: int = 1024,
                 rng: random.Random | None = None, names: Mapping[HostPort, str] | None = None,
                 timeout_s: float = math.inf, keys: NodeKeys | None = None) -> None:
        self.sock = sock
        sock.setblocking(False)
        _size_buffer(sock)
        self._kernel_drops = 0
        try:
            family = sock.family
            self.address: HostPort = sock.getsockname()[:2]
            resolved = [_resolve(h, p, family) for h, p in peers]
        except TransportError:
            sock.close()
            raise
        self.resolved: dict[HostPort, HostPort] = dict(zip(peers, resolved))
        self.unresolved: dict[HostPort, str] = {}      # set_peers: a peer whose name failed, and why
        self.peer_addrs = PeerList(a for a in resolved if a != self.address)
        self.queue_size = queue_size
        self.core = GossipCore(node_id, cluster, key, self.peer_addrs, branching, incarnation, rng,
                               Stats(overhead_bytes=48 if family == socket.AF_INET6 else 28),
                               names={self.resolved[a]: n for a, n in (names or {}).items()}, timeout_s=timeout_s,
                               keys=keys)
        self.stats = self.core.stats

    @classmethod
    def bind(cls, listen: HostPort, peers: Sequence[HostPort], mark: int | None = None, **kw) -> "UdpTransport":
        """Listen on ``listen``; ``mark``: SO_MARK of every datagram sent (None: unmarked);
        ``kw`` as for the constructor.  Raises TransportError."""
        return cls(_bind(listen, mark), peers, **kw)

    def set_peers(self, peers: Mapping[HostPort, str | None],
                  timeout_s: float | None = None) -> dict[HostPort, str | None]:
        """The peer set changed at runtime (a registry's watch): ``peers`` maps each peer's
        address as given to its node id (None: learned from its datagrams); ``timeout_s``
        as for GossipCore.set_peers.  Returns the members for Membership.set_peers:
        {address its datagrams come from: id}, this node left out.

        Only new addresses are resolved (no DNS on the tick for the others).  One that does
        not resolve is not gossiped with but stays a member under its address as given:
        never heard, so stale and counted in N, as a peer we cannot reach must be (leaving
        it out would let us take its share).  It is in ``unresolved`` with the reason, and
        is resolved again on the next call.  Never raises."""
        resolved, self.unresolved = {}, {}
        for addr in peers:
            try:
                resolved[addr] = self.resolved.get(addr) or _resolve(*addr, self.sock.family)
            except TransportError as e:
                self.unresolved[addr] = str(e)
        self.resolved = resolved
        self.peer_addrs = PeerList(a for a in resolved.values() if a != self.address)
        self.core.set_peers(self.peer_addrs, {resolved[a]: n for a, n in peers.items() if n and a in resolved},
                            timeout_s)
        return {resolved.get(a, a): n for a, n in peers.items() if resolved.get(a) != self.address}

    def poll(self, now: float) -> list[Received]:
        """Everything that arrived since the last poll, validated, in arrival order; never raises."""
        out, drops = [], self._kernel_drops
        for _ in range(self.queue_size):
            try:
                data, anc, _, src = self.sock.recvmsg(MAX_DATAGRAM + 1, _DROPS_SPACE)   # +1: oversized shows as such
            except BlockingIOError:
                break
            except OSError:          # e.g. an ICMP error queued on the socket: nothing to read
                continue
            if anc:                  # the kernel's drops so far, when there have been any
                drops = int.from_bytes(anc[0][2][:4], sys.byteorder)
            rx = self.core.receive(data, src[:2], now)
            if rx is not None:
                out.append(rx)
        if drops != self._kernel_drops:
            self.core.reject(Reason.QUEUE_FULL, (drops - self._kernel_drops) % (1 << 32))   # a u32 that wraps
            self._kernel_drops = drops
        return out

    @property
    def incarnation(self) -> int:
        """This life of the agent, as its datagrams name it (the registry announces it too)."""
        return self.core.incarnation

    def set_signed(self, signed: Callable[[int], bool]) -> None:
        """Which class keys may carry values below 0 (peers' negative values are refused otherwise)."""
        self.core.signed = signed

    def set_keys(self, keys: NodeKeys) -> None:
        """Per-node keys re-read (GossipCore.set_keys)."""
        self.core.set_keys(keys)

    def set_registry_keys(self, published: Mapping[str, Sequence[str]]) -> None:
        """The registry's members' public keys (GossipCore.set_registry_keys)."""
        self.core.set_registry_keys(published)

    def publish(self, classes: Mapping[int, Outgoing], now: float) -> None:
        """Gossip the classes' values (or a heartbeat) to this interval's targets."""
        for addr, data in self.core.publish(classes, now):
            self._sendto(data, addr)

    def announce(self, note: LimitNote, addr: HostPort | None = None) -> None:
        """A class's limit to ``addr``, or to every peer (GossipCore.announce)."""
        self.core.announce(note, addr)

    def report_clients(self, reports: list[ClassClients], now: float) -> None:
        """The classes' per-client reports to every peer (GossipCore.report_clients)."""
        for addr, data in self.core.report_clients(reports, now):
            self._sendto(data, addr)

    def send(self, env: Envelope, class_id: int, now: float) -> bool:
        """Send one outbox message; False if ``env.dst`` has not been heard from yet."""
        routed = self.core.route(env, class_id, now)
        if routed is not None:
            self._sendto(routed[1], routed[0])
        return routed is not None

    def send_sums(self, node: str, sums: Sums, now: float) -> None:
        """One sum-tree message to ``node`` (GossipCore.sums)."""
        for addr, data in self.core.sums(node, sums, now):
            self._sendto(data, addr)

    def knows(self, node: str) -> bool:
        return self.core.knows(node)

    def overdue(self, now: float, gap_s: float) -> int:
        return self.core.overdue(now, gap_s)

    def _sendto(self, data: bytes, addr: HostPort) -> None:
        try:
            self.sock.sendto(data, addr)
        except OSError:               # full buffer, unreachable net: UDP loss by another name
            self.stats.send_errors += 1

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "UdpTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Standalone:
    """The transport of an agent with no peers: no socket, nothing to send or hear."""
    sock = None
    address = None

    def __init__(self) -> None:
        self.peer_addrs = PeerList(())
        self.resolved: dict[HostPort, HostPort] = {}
        self.stats = Stats()

    def set_peers(self, peers: Mapping[HostPort, str | None],
                  timeout_s: float | None = None) -> dict[HostPort, str | None]:
        """No peers, ever: with a socket bound only now, the datapath (told the gossip port
        at startup) would police our gossip.  An agent that may gain peers starts with a
        UdpTransport, even with none."""
        if peers:
            raise TransportError("this agent started without peers has no gossip socket")
        return {}

    incarnation = 0      # never announced: a standalone agent has no registry

    def set_signed(self, signed: Callable[[int], bool]) -> None:
        pass

    def poll(self, now: float) -> list[Received]:
        return []

    def publish(self, classes: Mapping[int, Outgoing], now: float) -> None:
        pass

    def announce(self, note: LimitNote, addr: HostPort | None = None) -> None:
        pass

    def report_clients(self, reports: list[ClassClients], now: float) -> None:
        pass

    def send(self, env: Envelope, class_id: int, now: float) -> bool:
        return False

    def send_sums(self, node: str, sums: Sums, now: float) -> None:
        pass

    def knows(self, node: str) -> bool:
        return False

    def overdue(self, now: float, gap_s: float) -> int:
        return 0

    def close(self) -> None:
        pass
