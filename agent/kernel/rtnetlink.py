"""rtnetlink by hand: the message layouts, attribute codec and request/reply loop that agent/kernel/attach.py (the
per-tick check of our filter's program id) and agent/kernel/shaper.py (bfifo, htb class delete,
a dumped qdisc re-added as it was, the root qdisc and its children) need where pyroute2 is too
slow or cannot, and the link events the agent's loop follows its interface by."""
from __future__ import annotations

import errno
import os
import socket
import struct
import time

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLM_F_REPLACE, NLM_F_CREATE = 0x100, 0x400
TCA_KIND, TCA_OPTIONS, TCA_BPF_ID = 1, 2, 11
NLMSG = struct.Struct("=IHHII")              # nlmsghdr
TCMSG = struct.Struct("=BxxxiIII")           # tcmsg: family, ifindex, handle, parent, info
NLA = struct.Struct("=HH")


def attr(kind: int, value: bytes) -> bytes:
    """One attribute, padded to 4 bytes."""
    raw = NLA.pack(NLA.size + len(value), kind) + value
    return raw + bytes(-len(raw) % 4)


def attrs(buf: bytes, start: int, end: int) -> dict[int, bytes]:
    """The attributes in buf[start:end] by kind (nested and byte-order flags masked off)."""
    out = {}
    while start + 4 <= end:
        length, kind = NLA.unpack_from(buf, start)
        if length < 4:
            break
        out[kind & 0x3FFF] = buf[start + 4:start + length]
        start += (length + 3) & ~3
    return out


def send(sock: socket.socket, kind: int, flags: int, body: bytes) -> int:
    """One request (``flags`` without NLM_F_REQUEST); its sequence number, for :func:`replies`."""
    seq = int(time.monotonic_ns() & 0xFFFFFFFF)
    sock.send(NLMSG.pack(NLMSG.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body)
    return seq


def replies(sock: socket.socket, seq: int):
    """(type, body) of every reply to seq until DONE or the ACK; OSError on an error reply."""
    while True:
        buf = sock.recv(65536)
        pos = 0
        while pos + NLMSG.size <= len(buf):
            length, kind, _, got, _ = NLMSG.unpack_from(buf, pos)
            if length < NLMSG.size:
                return
            body = buf[pos + NLMSG.size:pos + length]
            pos += (length + 3) & ~3
            if got != seq:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", body)[0]
                if code:
                    raise OSError(code, f"netlink: {os.strerror(code)}")
                return
            yield kind, body


# tc requests for what pyroute2 cannot do (agent/kernel/shaper.py): bfifo (no plugin), deleting
# an htb class (its plugin needs a rate to encode the request), and re-adding a qdisc from the
# options the kernel dumped (pyroute2 re-encodes parsed options, losing some)
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC, RTM_DELTCLASS = 36, 37, 38, 41
TC_H_ROOT = 0xFFFFFFFF


def tc_request(sock: socket.socket, kind: int, flags: int, ifindex: int, handle_: int, parent: int,
               options: list[tuple[int, bytes]], dump: bool = False) -> list[tuple[int, bytes]]:
    """Send one tc request (``options``: its attributes, kind and value) and wait for its ACK
    (or, ``dump``, the whole dump)."""
    body = TCMSG.pack(socket.AF_UNSPEC, ifindex, handle_, parent, 0) + b"".join(attr(k, v) for k, v in options)
    flags |= NLM_F_DUMP if dump else NLM_F_ACK          # (DUMP's bits overlap EXCL's: never both)
    return list(replies(sock, send(sock, kind, flags, body)))


def qdiscs(sock: socket.socket, ifindex: int) -> list[dict]:
    out = []
    for kind, body in tc_request(sock, RTM_GETQDISC, 0, ifindex, 0, 0, [], dump=True):
        if kind != RTM_NEWQDISC:
            continue
        _, index, handle_, parent, _ = TCMSG.unpack_from(body)
        if index != ifindex:
            continue
        found = attrs(body, TCMSG.size, len(body))
        out.append({"kind": found.get(TCA_KIND, b"").rstrip(b"\0").decode(), "handle": handle_,
                    "parent": parent, "options": found.get(TCA_OPTIONS, b"").hex()})
    return out


def root_qdisc(sock: socket.socket, ifindex: int) -> dict | None:
    """The root qdisc: kind, handle, parent and options (hex) as the kernel dumps them.  A dump
    (a get of the root is only ACKed on this kernel, no reply): ~25 us in a namespace."""
    return next((q for q in qdiscs(sock, ifindex) if q["parent"] == TC_H_ROOT), None)


def has_children(sock: socket.socket, ifindex: int) -> bool:
    """Qdiscs under the root that someone added (the kernel's own default children of a
    classful root, e.g. tbf's bfifo or mq's per-queue qdiscs, have handle 0 or are hidden)."""
    return any(q["parent"] not in (TC_H_ROOT, 0xFFFFFFF1) and q["handle"] != 0 and q["kind"] != "clsact"
               and q["parent"] >> 16 != 0xFFFF for q in qdiscs(sock, ifindex))


RTMGRP_LINK = 0x1     # rtnetlink's multicast group of link events (RTM_NEWLINK, RTM_DELLINK)
RTMGRP_TC = 0x8       # and of tc events (qdiscs, classes, filters added, changed or deleted)


def link_events() -> socket.socket:
    """A non-blocking socket of this namespace's link and tc events: readable when an interface
    is made, changed or deleted, or a qdisc, class or filter changes (the agent's loop then
    checks its filter at once, not at the next tick: an interface made again passes
    everything until our filter is on it, and so does one where another filter was put ahead
    of ours, for as long as a TCP window takes to drain at line rate)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, RTMGRP_LINK | RTMGRP_TC))
    except OSError:
        sock.close()
        raise
    return sock


def drain(sock: socket.socket) -> int:
    """Read every pending event; how many reads returned one.  An overrun (ENOBUFS: events were
    lost) counts as one: something changed."""
    n = 0
    while True:
        try:
            sock.recv(65536)
        except BlockingIOError:
            return n
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
        n += 1


# The interface's tx byte counter for agent/kernel/unseen.py: RTM_GETSTATS of the 64-bit link
# stats alone (~100 bytes back; a RTM_GETLINK answers with every attribute of the link)
RTM_NEWSTATS, RTM_GETSTATS = 92, 94
IFLA_STATS_LINK_64 = 1
IF_STATS_MSG = struct.Struct("=BBHII")       # if_stats_msg: family, pad, pad, ifindex, filter_mask
_TX_BYTES = struct.Struct("=Q")             # rtnl_link_stats64: rx_packets, tx_packets, rx_bytes, tx_bytes, ...


def tx_bytes(sock: socket.socket, ifindex: int) -> int:
    """Bytes the interface has sent (rtnl_link_stats64.tx_bytes); OSError if it is gone."""
    body = IF_STATS_MSG.pack(socket.AF_UNSPEC, 0, 0, ifindex, 1 << (IFLA_STATS_LINK_64 - 1))
    for kind, reply in list(replies(sock, send(sock, RTM_GETSTATS, NLM_F_ACK, body))):    # the reply, then the ACK
        stats = attrs(reply, IF_STATS_MSG.size, len(reply)).get(IFLA_STATS_LINK_64, b"")
        if kind == RTM_NEWSTATS and len(stats) >= 32:
            return _TX_BYTES.unpack_from(stats, 24)[0]
    raise OSError(0, "netlink: no link stats in the reply")
