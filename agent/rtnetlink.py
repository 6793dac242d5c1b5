"""rtnetlink by hand: the message layouts and attribute codec that agent/datapath.py (the
per-tick check of our filter's program id) and agent/shaper.py (bfifo, htb class delete,
a dumped qdisc re-added as it was) need where pyroute2 is too slow or cannot."""
from __future__ import annotations

import struct

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
