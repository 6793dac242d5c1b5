"""Per-client accounting (bpf/limiter.c clients, docs/clients.md): cost per packet, memory, read time.

    sudo .venv/bin/python bench/clients.py                            # ~25 s
    sudo .venv/bin/python bench/clients.py --clients 100000 --rounds 5 --repeat 1000000

Loads bpf/limiter.c once per variant on lo (never attached: BPF_PROG_TEST_RUN
runs it on a crafted frame, bench/classify.py), one class matching every
packet in a bucket far above the rate (the policing path, no drops):

    off          no client rule (as before this change)
    count        a client rule dst/32, bytes, nobody throttled or banned: counting only
    + bans       action ban, one other client banned: a client_bans lookup that misses
    + throttle   the frame's client throttled at 400 Gbit/s: its bucket on every packet
    + exempt     an exempt prefix elsewhere: a client_exempt (LPM) lookup that misses

per packet   a 64-byte UDP and a 1514-byte TCP frame to 10.0.0.2, ``--repeat`` runs
             each, the variants alternating for ``--rounds`` rounds; medians of the
             kernel's mean ns per run.  The frame's client has its entry (a hit).
ingress      drl_ingress on the same frames coming from 10.0.0.2, in + bans.
many         ``--clients`` frames to as many addresses (10.0.0.0 + i), one run each,
             twice: the mean ns of a run that makes the client's entry, then of one
             that finds it among all the others (no longer in the CPU's caches), count
             against off.
memory       memlock of each client map (/proc/self/fdinfo of its fd), empty and
             with ``--clients`` clients counted.
agent tick   the agent's per-client work in one interval (agent/service/client_rules.py
             ClientRules.tick: drain client_heavy, read the windows of the clients
             it follows, ClientTable.tick_counts, write limits and bans) with
             ``--clients`` clients counted, ``--heavy`` of them at the reporting line
             (a packets rule, 6 per hour: the line is 3 packets; the heavy clients
             send 3, the others 1): the first tick, which finds them flagged, and
             the next ``--rounds``, which follow them.
"""
from __future__ import annotations

import argparse
import ctypes as ct
import ipaddress
import statistics
import struct
import time
from types import SimpleNamespace

from drl.agent import abi
from drl.agent.classes.spec import ClassRule
from drl.agent.clients.rules import client_rule, parse_client_key, parse_prefix, parse_threshold
from drl.agent.kernel.datapath import Datapath
from drl.agent.model import Mode
from drl.agent.service.client_rules import ClientRules

from classify import BPF_PROG_TEST_RUN, SYS_BPF, TestRunAttr, ns_per_run

CLIENT = ipaddress.IPv4Address("10.0.0.2")
US = ipaddress.IPv4Address("10.255.0.1")
FAST_Bps = 400e9 / 8
CLIENT_MAPS = ("client_windows", "client_heavy", "client_limits", "client_bans", "client_exempt")
_libc = ct.CDLL(None, use_errno=True)


def frame(proto: str, src: ipaddress.IPv4Address, dst: ipaddress.IPv4Address) -> bytes:
    """64-byte UDP or 1514-byte TCP (ACK) frame, as bench/per_packet.py's; checksums unchecked."""
    if proto == "udp":
        l4, number, payload = struct.pack("!HHHH", 40000, 5201, 8 + 22, 0), 17, 22
    else:
        l4, number, payload = struct.pack("!HHIIBBHHH", 40000, 5201, 1, 1, 5 << 4, 0x10, 65535, 0, 0), 6, 1460
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4) + payload, 0, 0x4000, 64, number, 0, src.packed, dst.packed)
    return b"\x02" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip + l4 + bytes(payload)


def run_once(prog_fd: int, data: bytes) -> int:
    """One BPF_PROG_TEST_RUN of data: the kernel's ns for it."""
    buf = ct.create_string_buffer(data, len(data))
    attr = TestRunAttr(prog_fd=prog_fd, data_size_in=len(data), data_in=ct.addressof(buf), repeat=1)
    if _libc.syscall(SYS_BPF, BPF_PROG_TEST_RUN, ct.byref(attr), ct.sizeof(attr)) != 0:
        raise OSError(ct.get_errno(), "BPF_PROG_TEST_RUN failed")
    return attr.duration


def rule(action: str = "throttle", exempt: tuple[str, ...] = ()):
    return client_rule(parse_client_key("dst/32"), "bytes", parse_threshold("2mbit"), action,
                       exempt=[parse_prefix(e) for e in exempt])


def load(variant: str, max_clients: int) -> Datapath:
    dp = Datapath("lo", [ClassRule()], max_clients=max_clients)
    dp.set_class(0, Mode.BUCKET, rate_Bps=1e12)
    client = CLIENT.packed
    if variant == "count":
        dp.set_client_rule(0, rule())
    elif variant == "+ bans":
        dp.set_client_rule(0, rule("ban"))
        dp.set_client_bans(0, {ipaddress.IPv4Address("192.0.2.1").packed: dp.now_ns() + 3600 * 10**9})
    elif variant == "+ throttle":
        dp.set_client_rule(0, rule())
        dp.set_client_limits(0, {client: (FAST_Bps, FAST_Bps)})
    elif variant == "+ exempt":
        dp.set_client_rule(0, rule(exempt=("192.0.2.0/24",)))
    return dp


def memlock(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("memlock:"))


def per_packet(loaded: dict[str, Datapath], rounds: int, repeat: int) -> None:
    """Egress of every variant, ingress of off and + bans, alternating; medians."""
    progs = {**{("egress", name): (dp.prog_fd, US, CLIENT) for name, dp in loaded.items()},
             **{("ingress", name): (loaded[name].ingress_prog_fd, CLIENT, US) for name in ("off", "+ bans")}}
    runs = {(prog, kind): [] for prog in progs for kind in ("udp", "tcp")}
    for _ in range(rounds):
        for kind in ("udp", "tcp"):
            for prog, (fd, src, dst) in progs.items():
                runs[prog, kind].append(ns_per_run(fd, frame(kind, src, dst), repeat))
    med = {key: statistics.median(values) for key, values in runs.items()}
    print(f"| program | 64-byte UDP: ns per run (median of {rounds} x {repeat:,}) | - off | 1514-byte TCP: ns "
          "| - off |")
    print("| --- | --- | --- | --- | --- |")
    for where, name in progs:
        udp, tcp = med[(where, name), "udp"], med[(where, name), "tcp"]
        off = med[(where, "off"), "udp"], med[(where, "off"), "tcp"]
        print(f"| {where}, {name} | {udp:.0f} | {udp - off[0]:+.0f} | {tcp:.0f} | {tcp - off[1]:+.0f} |")


def fill(dp: Datapath, frames: list[bytes]) -> float:
    """Run every frame once; the mean ns per run."""
    return sum(run_once(dp.prog_fd, f) for f in frames) / len(frames)


def many_clients(off: Datapath, count: Datapath, n: int, rounds: int) -> None:
    base = ipaddress.IPv4Address("10.0.0.0")
    frames = [frame("udp", US, base + i) for i in range(n)]
    fds = {name: count._bpf[name.encode()].map_fd for name in CLIENT_MAPS}     # bench only: the maps' fds
    empty = {name: memlock(fd) for name, fd in fds.items()}
    runs = {(name, visit): [] for name in ("off", "count") for visit in ("new", "known")}
    for _ in range(rounds):
        count.forget_clients(0, [(base + i).packed for i in range(n)])      # each round makes them anew
        for visit in ("new", "known"):
            for name, dp in (("off", off), ("count", count)):
                runs[name, visit].append(fill(dp, frames))
    full = {name: memlock(fd) for name, fd in fds.items()}
    med = {key: statistics.median(values) for key, values in runs.items()}
    print(f"\n{n:,} clients, one run each, median of {rounds} rounds: ns per run")
    for visit in ("new", "known"):
        print(f"  {visit} client: count {med['count', visit]:.0f}, off {med['off', visit]:.0f} "
              f"({med['count', visit] - med['off', visit]:+.0f})")
    print("\n| map | max entries | kernel memory, empty | with the clients counted |")
    print("| --- | --- | --- | --- |")
    for name, fd in fds.items():
        size = count._bpf[name.encode()].max_entries
        print(f"| {name} | {size:,} | {empty[name] / 2**20:.2f} MiB | {full[name] / 2**20:.2f} MiB |")


def agent_tick(max_clients: int, n: int, heavy: int, rounds: int) -> None:
    """ClientRules.tick over a map of n clients, ``heavy`` of them at the line."""
    dp = load("off", max_clients)
    try:
        rule = client_rule(parse_client_key("dst/32"), "packets", parse_threshold("6/1h"), "throttle")
        clients = ClientRules(dp, node_id="a")
        clients.apply([SimpleNamespace(name="c", class_id=0, conf=SimpleNamespace(client=rule, key=1))],
                      time.monotonic(), 1.0, n_hosts=1)
        base = ipaddress.IPv4Address("10.0.0.0")
        fill(dp, [frame("udp", US, base + i) for i in range(n)] + [frame("udp", US, base + i) for i in range(heavy)] * 2)
        ticks = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            clients.tick(time.monotonic(), 1, 1.0)
            ticks.append(time.perf_counter() - start)
        followed = len(clients.get("c").table.wanted())
    finally:
        dp.close()
    print(f"| {n:,} | {heavy:,} | {followed:,} | {ticks[0] * 1e3:.1f} | {statistics.median(ticks[1:]) * 1e3:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--heavy", type=lambda text: [int(x) for x in text.split(",")], default=[0, 100, 1000, 10000],
                    help="clients at the reporting line, comma-separated (agent tick)")
    ap.add_argument("--max-clients", type=int, default=abi.MAX_CLIENTS, help="entries of client_windows")
    args = ap.parse_args()
    loaded = {name: load(name, args.max_clients) for name in ("off", "count", "+ bans", "+ throttle", "+ exempt")}
    try:
        per_packet(loaded, args.rounds, args.repeat)
        many_clients(loaded["off"], loaded["count"], args.clients, args.rounds)
    finally:
        for dp in loaded.values():
            dp.close()
    print("\n| clients counted | at the line | followed | first tick (ms) | next ticks, median (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for heavy in args.heavy:
        agent_tick(args.max_clients, args.clients, heavy, args.rounds)


if __name__ == "__main__":
    main()
