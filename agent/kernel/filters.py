"""The tc filters on one clsact hook as the kernel runs them, and where ours must go to run first.

The kernel keeps one classifier (a ``tcf_proto``: one kind, one protocol) per pref and
runs them by pref, lowest first; inside cls_bpf, programs run newest first (it adds each
new one at the head of its list), and a dump lists them in the order they run.  A packet
another filter classifies before ours never reaches ours.  So ours runs first when it
sits at a pref below every other filter's, or, at pref 1 (0 is not a pref: it asks the
kernel to pick one), inside a cls_bpf classifier of our protocol, added after its other
programs.  Before a pref-1 classifier of another kind (u32, flower, ...) nothing can run.
"""
from __future__ import annotations

import socket
import sys
from itertools import takewhile
from typing import NamedTuple

from drl.agent.kernel import rtnetlink
from drl.agent.kernel.rtnetlink import NLM_F_DUMP, TCA_BPF_ID, TCA_KIND, TCA_OPTIONS, TCMSG, attrs

TCA_BPF_NAME = 7
_RTM_NEWTFILTER, _RTM_GETTFILTER = 44, 46


class Filter(NamedTuple):
    """One dumped entry: the kernel lists each classifier as a handle-0 entry, then its filters."""
    prio: int
    handle: int
    protocol: int          # tcm_info's low 16 bits, network byte order as the kernel keeps it
    kind: str
    prog: int | None       # a bpf filter's program id
    name: str


def dump(sock: socket.socket, ifindex: int, parent: int) -> list[Filter]:
    """Every filter on the hook ``parent`` (e.g. 0xfffffff3, clsact egress), in the order
    they run; OSError on an error reply (a missing clsact or interface dumps nothing)."""
    seq = rtnetlink.send(sock, _RTM_GETTFILTER, NLM_F_DUMP, TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, parent, 0))
    out = []
    for kind, body in rtnetlink.replies(sock, seq):
        if kind != _RTM_NEWTFILTER:
            continue
        _, _, handle, _, info = TCMSG.unpack_from(body)
        found = attrs(body, TCMSG.size, len(body))
        options = found.get(TCA_OPTIONS, b"")
        kind_ = found.get(TCA_KIND, b"").rstrip(b"\0").decode(errors="replace")
        bpf = attrs(options, 0, len(options)) if kind_ == "bpf" else {}     # other kinds' attributes differ
        prog = bpf.get(TCA_BPF_ID, b"")
        out.append(Filter(info >> 16, handle, info & 0xFFFF, kind_,
                          int.from_bytes(prog, sys.byteorder) if len(prog) == 4 else None,
                          bpf.get(TCA_BPF_NAME, b"").rstrip(b"\0").decode(errors="replace")))
    return out


def find(filters: list[Filter], prio: int, handle: int) -> Filter | None:
    return next((f for f in filters if f.prio == prio and f.handle == handle), None)


def ahead(filters: list[Filter], prio: int, handle: int) -> tuple[int, ...]:
    """The prefs of the filters that run before ours (at ``prio``/``handle``)."""
    before = takewhile(lambda f: (f.prio, f.handle) != (prio, handle), filters)
    return tuple(sorted({f.prio for f in before if f.prio < prio or f.handle}))


def place(filters: list[Filter], prio: int, handle: int) -> int | None:
    """The pref at which ours, added again, runs before every other filter; None when no
    pref does (a pref-1 classifier that is not cls_bpf of our protocol)."""
    first = min(ahead(filters, prio, handle), default=None)
    if first is None:
        return prio
    if first > 1:
        return first - 1         # free: anything below it would itself be ahead
    ours = find(filters, prio, handle)
    joinable = all(f.kind == "bpf" and ours is not None and f.protocol == ours.protocol
                   for f in filters if f.prio == 1)
    return 1 if joinable else None
