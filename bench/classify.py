"""Cost of classification against the number of classes; results go to bench/RESULTS.md.

    sudo .venv/bin/python bench/classify.py                 # ~1 minute
    sudo .venv/bin/python bench/classify.py --repeat 1000000 --rounds 7

Loads bpf/limiter.c nine times (never attached: BPF_PROG_TEST_RUN runs the
program on a crafted packet in the kernel) with 1, 100 and 4,096 classes,
each a destination /32, or a /24, or mixed: classes cycle through /32, /24
and /16, the last one (the packet's) a /16, and two more rules (a /32 and a
/24 elsewhere) keep all three lengths in use even with 1 class, so that
every mixed packet probes /32 and /24 in vain before its /16 hits.  Same
map sizes throughout.  The packet is Ethernet/IPv4/TCP to the
LAST-inserted class, in a token bucket far above anything the runs reach.
The kernel reports the mean ns per run over `repeat` runs; the loads
alternate for `rounds` rounds and the table shows medians and the ratio to
1 class of the same kind.  Goal: 4,096 within 10 % of 1.
"""
from __future__ import annotations

import argparse
import ctypes as ct
import ipaddress
import statistics
import struct

from drl.agent.classes.spec import ClassRule
from drl.agent.kernel.datapath import Datapath
from drl.agent.model import Mode

SYS_BPF = 321              # x86_64
BPF_PROG_TEST_RUN = 10
CLASS_COUNTS = (1, 100, 4096)
KINDS = ("/32", "/24", "mixed")
MIXED = (32, 24, 16)       # class i of a mixed load: MIXED[i % 3], the last one /16


class TestRunAttr(ct.Structure):
    """union bpf_attr's `test` member (include/uapi/linux/bpf.h)."""
    _fields_ = [("prog_fd", ct.c_uint32), ("retval", ct.c_uint32), ("data_size_in", ct.c_uint32),
                ("data_size_out", ct.c_uint32), ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
                ("repeat", ct.c_uint32), ("duration", ct.c_uint32), ("ctx_size_in", ct.c_uint32),
                ("ctx_size_out", ct.c_uint32), ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32), ("pad", ct.c_uint32)]


def network(i: int, prefixlen: int) -> ipaddress.IPv4Network:
    """Class i's destination: the i-th /prefixlen from 10.0.0.0."""
    return ipaddress.ip_network((int(ipaddress.IPv4Address("10.0.0.0")) + (i << (32 - prefixlen)), prefixlen))


def destinations(n: int, kind: str) -> list[ipaddress.IPv4Network]:
    """The n classes' destinations; mixed ones each in a /16 of its own (none covers another)."""
    if kind != "mixed":
        return [network(i, int(kind[1:])) for i in range(n)]
    lengths = [MIXED[i % 3] for i in range(n - 1)] + [16]
    return [next(network(i, 16).subnets(new_prefix=p)) for i, p in enumerate(lengths)]


def packet(dst: ipaddress.IPv4Address, payload: int = 1000) -> bytes:
    """Ethernet + IPv4 + TCP (ACK, 10.255.0.1:40000 -> dst:80); checksums are not checked at egress."""
    tcp = struct.pack("!HHIIBBHHH", 40000, 80, 1, 1, 5 << 4, 0x10, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + payload, 0, 0x4000, 64, 6, 0,
                     ipaddress.IPv4Address("10.255.0.1").packed, dst.packed)
    eth = b"\x02" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    return eth + ip + tcp + bytes(payload)


def ns_per_run(prog_fd: int, data: bytes, repeat: int) -> float:
    buf = ct.create_string_buffer(data, len(data))
    attr = TestRunAttr(prog_fd=prog_fd, data_size_in=len(data), data_in=ct.addressof(buf), repeat=repeat)
    libc = ct.CDLL(None, use_errno=True)
    if libc.syscall(SYS_BPF, BPF_PROG_TEST_RUN, ct.byref(attr), ct.sizeof(attr)) != 0:
        raise OSError(ct.get_errno(), "BPF_PROG_TEST_RUN failed")
    return attr.duration


def load(n_classes: int, kind: str) -> Datapath:
    rules = [ClassRule(dst=d) for d in destinations(n_classes, kind)]
    ids = list(range(n_classes))
    if kind == "mixed":       # all three lengths in use whatever n: a /32 and a /24 in 172.16/12
        rules += [ClassRule(dst=ipaddress.ip_network("172.16.0.1/32")),
                  ClassRule(dst=ipaddress.ip_network("172.16.1.0/24"))]
        ids += [0, 0]
    dp = Datapath("lo", rules, class_ids=ids, max_classes=max(CLASS_COUNTS))
    dp.set_class(n_classes - 1, Mode.BUCKET, rate_Bps=1e12)
    return dp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    kinds = [(n, kind) for kind in KINDS for n in CLASS_COUNTS]
    loaded = {kind: load(*kind) for kind in kinds}
    runs: dict[tuple[int, str], list[float]] = {kind: [] for kind in kinds}
    try:
        for _ in range(args.rounds):
            for (n, kind), dp in loaded.items():
                runs[n, kind].append(ns_per_run(dp.prog_fd, packet(destinations(n, kind)[-1][-1]), args.repeat))
        for (n, kind), dp in loaded.items():
            counted = dp.read_counters([n - 1])[n - 1].passed_packets
            assert counted == args.repeat * args.rounds, f"{n} {kind}: the packet was not in the last class"
    finally:
        for dp in loaded.values():
            dp.close()
    print(f"| classes | ns per packet (median of {args.rounds} x {args.repeat:,} runs) | rounds | ratio to 1 |")
    print("| --- | --- | --- | --- |")
    for n, kind in kinds:
        med, base = statistics.median(runs[n, kind]), statistics.median(runs[1, kind])
        print(f"| {n:,} dst {kind} | {med:.0f} | {', '.join(f'{r:.0f}' for r in runs[n, kind])} | {med / base:.3f} |")


if __name__ == "__main__":
    main()
