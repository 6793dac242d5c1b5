"""Capture the gossip an agent receives and send it to it again later: the ``replay`` fault.

    cap = Capture(plan.ns("l3"), "lb3fa2l3-c", "10.254.0.3", t0)   # a thread, from the start of the run
    ...
    packets = cap.before(started)              # (t, src, IPv4 packet) captured before that time
    sent = send(lab.plan, packets, senders)    # each from its sender's namespace, bytes unchanged

The capture is an AF_PACKET socket on the agent's control interface, kept in
the lab's process: it sees every frame the agent's namespace receives there,
and keeps the IPv4 packets of UDP datagrams to the agent's gossip address and
port.  A replay sends those packets again, byte for byte (source address
and port, IP id) but for the UDP checksum, through a raw IP socket
(IPPROTO_RAW: the header is ours) in the namespace that owns the source
address, so they cross the control bridge as the original did and the
receiver cannot tell them from it by anything but what they say.  The
checksum is computed again because the capture sees what the sending veth
left of it: with checksum offload (the control veths keep theirs) only the
pseudo-header's partial sum, which the receiving stack trusted then and
would count as a checksum error now (InCsumErrors, no datagram).

Sockets are made inside a namespace by a thread of their own: ``setns`` moves
only the calling thread, and a socket stays in the namespace it was made in.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time

from .agents import GOSSIP_PORT
from .errors import LabError

CLONE_NEWNET = 0x40000000
ETH_P_IP = 0x0800
PACKET_HOST = 0          # sll_pkttype of a frame addressed to this host (not one it sent)
SNAPLEN = 65535
MAX_KEPT = 20000         # ~40 datagrams/s from two peers: more than an experiment's worth


def socket_in(ns_path: str, family: int, kind: int, proto: int) -> socket.socket:
    """A socket made inside the network namespace at ``ns_path`` (``/run/netns/<ns>``)."""
    made: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(ns_path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            made.append(socket.socket(family, kind, proto))
        except BaseException as e:   # handed to the caller's thread
            made.append(e)

    t = threading.Thread(target=enter, name="netns-socket")
    t.start()
    t.join()
    if isinstance(made[0], BaseException):
        raise LabError(f"cannot make a socket in {ns_path}: {made[0]}")
    return made[0]


def gossip_source(packet: bytes, dst: str, port: int = GOSSIP_PORT) -> str | None:
    """The source address of ``packet`` when it is an IPv4 UDP datagram to ``dst``:``port``
    (a first fragment or whole); None for anything else."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    ihl = (packet[0] & 0x0F) * 4
    frag_offset = struct.unpack_from("!H", packet, 6)[0] & 0x1FFF
    if packet[9] != socket.IPPROTO_UDP or frag_offset or len(packet) < ihl + 8:
        return None
    if socket.inet_ntoa(packet[16:20]) != dst or struct.unpack_from("!H", packet, ihl + 2)[0] != port:
        return None
    return socket.inet_ntoa(packet[12:16])


def _fold(total: int) -> int:
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _sum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    return _fold(sum(struct.unpack(f"!{len(data) // 2}H", data)))


def with_udp_checksum(packet: bytes) -> bytes:
    """``packet`` (IPv4, UDP, unfragmented) with its UDP checksum computed over the pseudo-header
    and the datagram as RFC 768 says (0 is sent as 0xFFFF)."""
    ihl = (packet[0] & 0x0F) * 4
    udp_len = struct.unpack_from("!H", packet, ihl + 4)[0]
    udp = bytearray(packet[ihl:ihl + udp_len])
    udp[6:8] = b"\0\0"
    pseudo = packet[12:20] + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len)
    check = 0xFFFF - _fold(_sum16(pseudo) + _sum16(bytes(udp))) or 0xFFFF
    udp[6:8] = struct.pack("!H", check)
    return packet[:ihl] + bytes(udp) + packet[ihl + udp_len:]


class Capture:
    """Gossip arriving at ``addr`` on ``iface`` in namespace ``ns``, kept with the time it came
    (seconds since ``t0``) until ``close``."""

    def __init__(self, ns: str, iface: str, addr: str, t0: float, netns_dir: str = "/run/netns"):
        self.addr, self.t0 = addr, t0
        self.packets: list[tuple[float, str, bytes]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.sock = socket_in(f"{netns_dir}/{ns}", socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        try:
            self.sock.bind((iface, ETH_P_IP))
        except OSError as e:
            self.sock.close()
            raise LabError(f"cannot capture on {iface} in {ns}: {e.strerror}") from None
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._loop, name=f"capture-{iface}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                data, sll = self.sock.recvfrom(SNAPLEN)
            except socket.timeout:
                continue
            except OSError:
                return
            src = gossip_source(data, self.addr) if sll[2] == PACKET_HOST else None
            if src is not None:
                with self.lock:
                    if len(self.packets) < MAX_KEPT:
                        self.packets.append((time.monotonic() - self.t0, src, data))

    def before(self, t: float, count: int | None = None) -> list[tuple[float, str, bytes]]:
        """What was captured before ``t`` (seconds since t0): the last ``count`` of it."""
        with self.lock:
            kept = [p for p in self.packets if p[0] < t]
        return kept[-count:] if count else kept

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.sock.close()


def send(packets: list[tuple[float, str, bytes]], sender_ns: dict[str, str],
         netns_dir: str = "/run/netns") -> dict[str, int]:
    """Send each captured packet again from the namespace of its source address (``sender_ns``:
    address -> namespace); how many went out per source address.  A source with no namespace
    (not one of the run's agents) is skipped."""
    socks: dict[str, socket.socket] = {}
    sent: dict[str, int] = {}
    try:
        for _, src, data in packets:
            ns = sender_ns.get(src)
            if ns is None:
                continue
            if ns not in socks:
                socks[ns] = socket_in(f"{netns_dir}/{ns}", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
            dst = socket.inet_ntoa(data[16:20])
            try:
                socks[ns].sendto(with_udp_checksum(data), (dst, 0))
            except OSError as e:
                raise LabError(f"cannot send a captured datagram from {src} in {ns}: {e.strerror}") from None
            sent[src] = sent.get(src, 0) + 1
    finally:
        for s in socks.values():
            s.close()
    return sent
