"""Per-packet cost of bpf/limiter.c next to a trivial program; bench/datapath.py runs it.

    sudo .venv/bin/python bench/datapath.py --part packet --seconds 4 --rounds 3
    sudo .venv/bin/python bench/datapath.py --part attribution

packet       live, on the lab's veth pair: for each traffic mix (64-byte UDP
             frames from one iperf3 at full speed, 1 TCP flow, 16 TCP flows,
             senders pinned to CPU 0) and each program (none, trivial, the
             limiter with a 400 Gbit/s bucket, the limiter before the per-packet work
             from git, ``--variants``), alternating, ``--rounds`` times: ns per
             run from kernel.bpf_stats_enabled (run_time_ns / run_cnt, the
             stats probe included), the program's runs a second, and the
             packet rate (UDP datagrams/s, TCP goodput) over no program's,
             and for the limiter's builds the share
             of packets no single CPU sent (TCP also sends from the CPU that took
             the ACK).  Goals: the limiter <= 150 ns at 16
             flows, within 60 ns of trivial on every mix, UDP rate >= 0.96.
attribution  BPF_PROG_TEST_RUN (bench/classify.py) on a 64-byte UDP and a
             1514-byte TCP frame, 1,000,000 runs x rounds, alternating: the
             limiter built without parts (agent/abi.py BENCH_SKIP), with a
             flow table visit on every packet (FLOW_EPOCH_SHIFT=0 with the fine
             clock, FLOW_VISIT_NS=0), with the fine clock (CLOCK_COARSE=0), classifying every
             packet (MEMO_CLASS=0, as off x86), the version before the per-packet work, trivial.

Variants are the same bpf/limiter.c compiled with other -D values from
agent/abi.py (``compiled``), never copies of it; "before" is bpf/ at a git
revision (``--before``, default e4511a2, the tree before the lock-free bucket;
several, comma-separated, run side by side: how scratch builds are compared).
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import ipaddress
import statistics
import struct
import subprocess
import tempfile
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netns import popns, pushns

from drl.agent import abi
from drl.agent.kernel import datapath as dpmod
from drl.agent.kernel.datapath import Datapath
from drl.agent.model import Mode
from drl.lab.errors import LabError
from drl.lab.traffic import iperf3_start

from classify import ns_per_run   # bench/classify.py: BPF_PROG_TEST_RUN through ctypes

REPO = Path(__file__).resolve().parent.parent
BEFORE_REV = "e4511a2"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
UNLIMITED_Bps = 400e9 / 8
MIXES = {"udp64": dict(udp_bps=0, length=22, streams=1),    # 22 B payload: 64-byte frames
         "tcp1": dict(streams=1), "tcp16": dict(streams=16)}
# name -> abi.cflags overrides: the limiter as built for the agent, and without parts
VARIANTS = {"limiter": {}, "no-flow-table": {"BENCH_SKIP": 1},
            # a new epoch every ns (so the fine clock), and m = 1: every tally of 1 packet visits
            "flows-every-packet": {"FLOW_EPOCH_SHIFT": 0, "CLOCK_COARSE": 0, "FLOW_VISIT_NS": 0},
            "fine-clock": {"CLOCK_COARSE": 0}, "no-police": {"BENCH_SKIP": 2},
            "parse-classify-count": {"BENCH_SKIP": 3}, "parse-classify-count-no-clock": {"BENCH_SKIP": 7},
            "no-class-memo": {"MEMO_CLASS": 0}, "no-classify": {"BENCH_SKIP": 8},
            # flow epochs 4 times as long: a quarter of the visits, a flow's bytes up to 67 ms late
            "epoch-67ms": {"FLOW_EPOCH_SHIFT": 26}}


def say(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def compiled(overrides: dict, bpf_dir: Path | None = None):
    """Datapath() inside compiles bpf/limiter.c (or the one in bpf_dir) with abi.cflags()
    plus ``overrides``: the bench-only way to build a variant."""
    plain, old_dir = abi.cflags, dpmod.BPF_DIR
    abi.cflags = lambda **sizes: plain(**{**sizes, **overrides})
    dpmod.BPF_DIR = bpf_dir or old_dir
    try:
        yield
    finally:
        abi.cflags, dpmod.BPF_DIR = plain, old_dir


def load(iface: str, netns: str | None, overrides: dict | None = None, bpf_dir: Path | None = None,
         rate_Bps: float = UNLIMITED_Bps) -> Datapath:
    with compiled(overrides or {}, bpf_dir):
        dp = Datapath(iface, netns=netns)
    dp.set_class(0, Mode.BUCKET, rate_Bps=rate_Bps)
    return dp


def checkout_before(rev: str, into: Path) -> Path:
    """bpf/ as of ``rev`` (limiter.c and its headers), in ``into``."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", rev, "bpf/"],
                            capture_output=True, text=True)
    for name in [Path(path).name for path in listed.stdout.split()] or ["limiter.c"]:
        got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:bpf/{name}"], capture_output=True, text=True)
        if got.returncode:
            raise LabError(f"--before {rev}: {got.stderr.strip().splitlines()[-1]}")
        (into / name).write_text(got.stdout)
    return into


def befores(revs: str, tmp: Path) -> dict[str, Path]:
    """"before (rev)" -> bpf/ as of rev, for each of the comma-separated ``revs``."""
    out = {}
    for rev in filter(None, revs.split(",")):
        (tmp / rev).mkdir()
        out[f"before ({rev})"] = checkout_before(rev, tmp / rev)
    return out


class Trivial:
    """bench/trivial.c at clsact egress of iface in netns (attach/detach like Datapath's)."""

    def __init__(self, iface: str, netns: str | None):
        from bcc import BPF
        self._bpf = BPF(src_file=str(Path(__file__).with_name("trivial.c")).encode())
        self.prog_fd = self._bpf.load_func(b"trivial", BPF.SCHED_CLS).fd
        if netns:
            pushns(netns)
        try:
            self._ipr = IPRoute()
        finally:
            if netns:
                popns()
        self._idx = self._ipr.link_lookup(ifname=iface)[0]

    def attach(self) -> None:
        self._ipr.tc("add", "clsact", self._idx)
        self._ipr.tc("add-filter", "bpf", self._idx, ":1", fd=self.prog_fd, name="trivial",
                     parent="ffff:fff3", direct_action=True)

    def detach(self) -> None:
        self._ipr.tc("del", "clsact", self._idx)

    def close(self) -> None:
        self._ipr.close()
        self._bpf.cleanup()


def prog_stats(fd: int) -> tuple[int, int]:
    fields = dict(line.split(":\t") for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                  if ":\t" in line)
    return int(fields["run_time_ns"]), int(fields["run_cnt"])


def per_cpu(prog) -> list[int]:
    """Class 0's packets so far on each CPU (a build of the limiter; [] for the others)."""
    if not isinstance(prog, Datapath):
        return []
    return [c.passed_packets + c.dropped_packets for c in prog._bpf[b"counters"][ct.c_int(0)]]


def one_run(net, srv, prog, mix: str, seconds: float) -> dict:
    """Traffic of ``mix`` for ``seconds`` with ``prog`` (None = no program) attached.  The
    sender is pinned to CPU 0, but TCP also sends from the CPU that took the ACK: ``split``
    is the share of the limiter's packets that no single CPU sent (None for other programs)."""
    h1 = net.hosts[0]
    if prog is not None:
        prog.attach()
    try:
        before, start = prog_stats(prog.prog_fd) if prog is not None else (0, 0), per_cpu(prog)
        result = iperf3_start(h1, srv, seconds=int(seconds), cpu=0, **MIXES[mix]).wait()
        after = prog_stats(prog.prog_fd) if prog is not None else (0, 0)
        cpus = [b - a for a, b in zip(start, per_cpu(prog))]
    finally:
        if prog is not None:
            prog.detach()
    runs = after[1] - before[1]
    rate = result.packets / result.seconds if mix == "udp64" else result.received_bps
    split = 1 - max(cpus) / sum(cpus) if sum(cpus) else None
    return {"ns": (after[0] - before[0]) / runs if runs else None, "runs_per_s": runs / result.seconds,
            "rate": rate, "split": split}


def part_packet(net, srv, seconds: float, rounds: int = 3, variants: tuple[str, ...] = (),
                before: str = BEFORE_REV) -> dict:
    """The per-packet table: every program on every mix, alternating, medians of rounds."""
    h1 = net.hosts[0]
    old = STATS.read_text().strip()
    STATS.write_text("1")
    progs: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="drl-before-") as tmp:
        try:
            progs["none"] = None
            progs["trivial"] = Trivial("eth0", h1.ns)
            progs["limiter"] = load("eth0", h1.ns)
            for name, bpf_dir in befores(before, Path(tmp)).items():
                progs[name] = load("eth0", h1.ns, bpf_dir=bpf_dir)
            for name in variants:
                progs[name] = load("eth0", h1.ns, VARIANTS[name])
            got = {(m, p): [] for m in MIXES for p in progs}
            for r in range(rounds):
                for mix in MIXES:
                    for name, prog in progs.items():
                        got[mix, name].append(one_run(net, srv, prog, mix, seconds))
                say(f"  packet round {r + 1}/{rounds} done")
        finally:
            STATS.write_text(old)
            for prog in progs.values():
                if prog is not None:
                    prog.close()
    return table(got, progs, rounds)


def table(got: dict, progs: dict, rounds: int) -> dict:
    out = {}
    say(f"| mix | program | ns per run (median of {rounds}) | rounds (split) | - trivial | runs/s | "
        "rate / no program | rate rounds |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mix in MIXES:
        base = statistics.median(r["rate"] for r in got[mix, "none"])
        triv = statistics.median(r["ns"] for r in got[mix, "trivial"])
        for name in progs:
            runs = got[mix, name]
            ns = None if name == "none" else statistics.median(r["ns"] for r in runs)
            ratio = statistics.median(r["rate"] for r in runs) / base
            out[mix, name] = {"ns": ns, "rate_ratio": ratio}
            ns_txt = "-" if ns is None else f"{ns:.0f}"
            rounds_txt = "-" if ns is None else ", ".join(
                f"{r['ns']:.0f}" + ("" if r["split"] is None else f" ({r['split']:.2f})") for r in runs)
            delta = "-" if ns is None else f"{ns - triv:+.0f}"
            per_s = "-" if ns is None else f"{statistics.median(r['runs_per_s'] for r in runs):,.0f}"
            rates = ", ".join(f"{r['rate'] / base:.3f}" for r in runs)
            say(f"| {mix} | {name} | {ns_txt} | {rounds_txt} | {delta} | {per_s} | {ratio:.3f} | {rates} |")
    return out


def frame(proto: str) -> bytes:
    """64-byte UDP or 1514-byte TCP (ACK) frame, 10.255.0.1 -> 10.0.0.2; checksums unchecked at egress."""
    src, dst = ipaddress.IPv4Address("10.255.0.1").packed, ipaddress.IPv4Address("10.0.0.2").packed
    if proto == "udp":
        l4, number, payload = struct.pack("!HHHH", 40000, 5201, 8 + 22, 0), 17, 22
    else:
        l4, number, payload = struct.pack("!HHIIBBHHH", 40000, 5201, 1, 1, 5 << 4, 0x10, 65535, 0, 0), 6, 1460
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4) + payload, 0, 0x4000, 64, number, 0, src, dst)
    return b"\x02" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip + l4 + bytes(payload)


def part_attribution(net, srv, seconds: float, rounds: int = 5, repeat: int = 1_000_000,
                     before: str = BEFORE_REV) -> dict:
    """BPF_PROG_TEST_RUN of every variant, never attached (loaded on lo of the root netns)."""
    progs: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="drl-before-") as tmp:
        try:
            for name, overrides in VARIANTS.items():
                progs[name] = load("lo", None, overrides, rate_Bps=1e12)
            for name, bpf_dir in befores(before, Path(tmp)).items():
                progs[name] = load("lo", None, bpf_dir=bpf_dir, rate_Bps=1e12)
            progs["trivial"] = Trivial("lo", None)
            got = {(p, k): [] for p in progs for k in ("udp", "tcp")}
            for _ in range(rounds):
                for kind in ("udp", "tcp"):
                    for name, prog in progs.items():
                        got[name, kind].append(ns_per_run(prog.prog_fd, frame(kind), repeat))
        finally:
            for prog in progs.values():
                prog.close()
    out = {}
    say(f"| program | 64-byte UDP: ns per run (median of {rounds} x {repeat:,}) | - limiter | "
        "1514-byte TCP: ns | - limiter |")
    say("| --- | --- | --- | --- | --- |")
    full = {k: statistics.median(got["limiter", k]) for k in ("udp", "tcp")}
    for name in progs:
        med = {k: statistics.median(got[name, k]) for k in ("udp", "tcp")}
        out[name] = med
        say(f"| {name} | {med['udp']:.0f} | {med['udp'] - full['udp']:+.0f} | {med['tcp']:.0f} | "
            f"{med['tcp'] - full['tcp']:+.0f} |")
    return out
