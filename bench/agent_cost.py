"""Benchmark of the agent process: CPU, RSS and control bandwidth, per class count.

    sudo .venv/bin/python bench/agent_cost.py                # 1, 100, 1,000 classes; 8 peers; 100 ms
    sudo .venv/bin/python bench/agent_cost.py --classes 1 --intervals 50ms,100ms,500ms --peers 2,8

For each class count, interval and peer count, 1 + peers real agents (FPS,
gossip with the default branching of 3, HMAC) run in namespaces on one
bridge.  The measured agent's config file has the classes: class i limits
traffic to 10.1.x.y/32 (host i), and its host sends one small UDP datagram to
every class's address every 50 ms, so every class has demand, a flow and a
changing published value (an active class).  Each peer's config has the first
class only: the peers hear every class's updates (and drop those of classes
they do not have), and send heartbeats, as peers whose classes are idle do
once they have said so; nine agents with a thousand classes each would not
fit on a two-core machine and would be measuring the machine.  The
measured agent's CPU comes from psutil (user + system over the window, as a
share of one core; also per tick, over ticks x interval, since a loaded
machine delays ticks), RSS at the end, control traffic from its own gossip
counters: wire bytes (UDP payload + 28 bytes of IPv4 and UDP header) per
active class per peer per round, where a round sends to min(branching, peers)
peers.  The paper's figure to compare with: 48-byte updates at br = 3 every
50 ms, 2.88 kbit/s per limiter ([Raghavan07] §5.6).

With ``--flows`` it measures instead ONE agent (no peers,
FPS, 1 class: every IP packet, 1 Gbit/s so nothing drops, ``--max-flows``
32768, ``--sample-probability`` 1) against N active flows:

    sudo .venv/bin/python bench/agent_cost.py --flows 0,2000,20000 --rounds 3 [--ab /tmp/ab2]

Two senders in h1, pinned to CPU 0 and 1, each send to half of N UDP ports
of h2 round-robin, together FLOW_PPS datagrams a second: under the
program's exact-counting threshold (4,000 packets/s per CPU and class,
agent/abi.py FLOW_VISIT_NS), so every flow's tally visits the flow table
(limiter.c tally_flow) and every flow is in it.  The bench reads the agent's
flow table itself (its map fd through pidfd_getfd) to report how many entries
it holds and how many were visited within the last second, and waits until
it holds N.
``--ab PATH`` alternates, round by round, the agent imported from PATH
(PYTHONPATH=PATH: ``PATH/drl`` a checkout of another commit) with this
checkout's.  CPU is user + system of the agent over ``--seconds``, RSS at
the end; medians over rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes as ct
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from drl.agent.units import parse_duration
from drl.lab.agents import Cluster, write_key
from drl.lab.netns import Lab
from drl.lab.topology import new_run, pair, star

BRANCHING = 3          # drl-agent's default
IP_UDP_BYTES = 28

_SWEEP = """
import socket, sys, time
n, period = int(sys.argv[1]), float(sys.argv[2])
dsts = [(f"10.1.{i // 256}.{i % 256}", 9) for i in range(n)]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
while True:
    start = time.monotonic()
    for d in dsts:
        s.sendto(b"x" * 36, d)
    time.sleep(max(0.0, period - (time.monotonic() - start)))
"""


def config(n: int, interval: str) -> str:
    text = f'[agent]\nallocator = "fps"\ninterval = "{interval}"\n'
    return text + "".join(f'\n[[class]]\nname = "c{i}"\nglobal = "10mbit"\nmatch = ["dst=10.1.{i // 256}.{i % 256}/32"]\n'
                          for i in range(n))


def measure(classes: int, interval: str, peers: int, seconds: float) -> dict:
    with Lab(star(peers + 2, new_run("ba"))) as net, tempfile.TemporaryDirectory() as tmp:
        limiters, sink = net.hosts[:-1], net.hosts[-1]
        key, conf, peer_conf = Path(tmp) / "key", Path(tmp) / "drl.toml", Path(tmp) / "peer.toml"
        write_key(key)
        conf.write_text(config(classes, interval))
        peer_conf.write_text(config(1, interval))
        agents = Cluster(net, Path(tmp), str(key))
        me, here = agents.start(limiters[0], limiters[1:], None, None, "--config", str(conf)), limiters[0]
        for h in limiters[1:]:
            agents.start(h, [p for p in limiters if p is not h], None, None, "--config", str(peer_conf))
        here.run("ip", "route", "add", "10.1.0.0/16", "via", sink.addr4)
        here.popen(sys.executable, "-c", _SWEEP, str(classes), "0.05")
        proc = _agent_process(me.proc.pid)
        time.sleep(3)
        before, cpu0, t0 = me.status(), sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu, wall, after = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - t0, me.status()
        ticks = after["ticks"] - before["ticks"]
        g0, g1 = before["gossip"], after["gossip"]
        wire = g1["bytes_sent"] - g0["bytes_sent"] + IP_UDP_BYTES * (g1["sent"] - g0["sent"])
        active = sum(c["demand_bps"] > 0 for c in after["classes"])
        return {"classes": classes, "active": active, "interval": interval, "peers": peers,
                "cpu_pct": 100 * cpu / wall, "cpu_tick_pct": 100 * cpu / (ticks * parse_duration(interval)),
                "rss_mib": proc.memory_info().rss / 2**20, "ticks_late": 1 - ticks * parse_duration(interval) / wall,
                "per_class": wire / (ticks * min(BRANCHING, peers) * max(1, active)),
                "datagram": (g1["bytes_sent"] - g0["bytes_sent"]) / max(1, g1["sent"] - g0["sent"]),
                "load": psutil.getloadavg()[0]}


def _agent_process(pid: int) -> psutil.Process:
    """`ip netns exec` execs the agent, so the session leader is the agent's Python."""
    proc = psutil.Process(pid)
    return next((c for c in proc.children(recursive=True) if "drl-agent" in " ".join(c.cmdline())), proc)


# --flows: one agent, N flows ------------------------------------------------------------

FLOW_PPS = 7000        # both senders together: 3,500 a CPU, under the exact-counting 4,000
FLOW_PORT = 20000      # h2's UDP ports FLOW_PORT .. FLOW_PORT + N - 1
MAX_FLOWS = 32768

_FLOWS = """
import socket, sys, time
dst, first, n, pps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ports = list(range(first, first + n))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
batch, sent, t0 = max(1, int(pps / 100)), 0, time.monotonic()
while True:
    for _ in range(batch):
        try:
            s.sendto(b"x" * 36, (dst, ports[sent % n]))
        except OSError:
            pass
        sent += 1
    time.sleep(max(0.0, t0 + sent / pps - time.monotonic()))
"""


def flow_config(interval: str) -> list[str]:
    return ["--interval", interval, "--max-flows", str(MAX_FLOWS), "--sample-probability", "1"]


def measure_flows(flows: int, interval: str, seconds: float, pythonpath: str | None) -> dict:
    with Lab(pair(new_run("bf"))) as net, tempfile.TemporaryDirectory() as tmp:
        h1, h2 = net.hosts
        with _environ("PYTHONPATH", pythonpath):
            me = Cluster(net, Path(tmp)).start(h1, [], "fps", "1gbit", *flow_config(interval))
        proc = _agent_process(me.proc.pid)
        for cpu, (first, n) in enumerate(_halves(flows)):
            if n:
                h1.popen(sys.executable, "-c", _FLOWS, h2.addr4, str(FLOW_PORT + first), str(n),
                         str(FLOW_PPS * n / flows), cpu=cpu)
        table = _FlowTable(proc.pid)
        deadline = time.monotonic() + 60
        while flows and table.read()[0] < 0.99 * flows and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)
        before, cpu0, t0 = me.status(), sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu, wall, after = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - t0, me.status()
        entries, visited = table.read()
        table.close()
        ticks = after["ticks"] - before["ticks"]
        return {"flows": flows, "entries": entries, "visited": visited, "interval": interval,
                "estimated": after["classes"][0]["flows"],
                "cpu_pct": 100 * cpu / wall, "ticks_late": 1 - ticks * parse_duration(interval) / wall,
                "rss_mib": proc.memory_info().rss / 2**20, "load": psutil.getloadavg()[0]}


def _halves(n: int) -> list[tuple[int, int]]:
    """(first port offset, ports) for the sender on CPU 0 and on CPU 1."""
    return [(0, n // 2), (n // 2, n - n // 2)]


@contextlib.contextmanager
def _environ(name: str, value: str | None):
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class _FlowTable:
    """The agent's flow table (its only LRU hash of MAX_FLOWS entries), read from outside:
    the map fd copied out of the agent with pidfd_getfd, read with one batch lookup."""
    KEY = VALUE = 40               # bpf/limiter.h flow_key, flow_stats
    LAST_NS = 24                   # flow_stats.last_ns

    def __init__(self, pid: int):
        from bcc.libbcc import lib
        self._lib = lib
        target = next(int(fd) for fd in os.listdir(f"/proc/{pid}/fdinfo") if _is_flow_table(pid, fd))
        pidfd = os.pidfd_open(pid)
        libc = ct.CDLL(None, use_errno=True)
        self.fd = libc.syscall(438, pidfd, target, 0)      # SYS_pidfd_getfd (x86_64)
        os.close(pidfd)
        if self.fd < 0:
            raise OSError(ct.get_errno(), "pidfd_getfd")
        self._keys = ct.create_string_buffer(self.KEY * MAX_FLOWS)
        self._values = ct.create_string_buffer(self.VALUE * MAX_FLOWS)

    def read(self) -> tuple[int, int]:
        """(entries, entries visited within the last second)."""
        total, token = 0, ct.c_uint32(0)
        while total < MAX_FLOWS:
            count = ct.c_uint32(MAX_FLOWS - total)
            res = self._lib.bpf_lookup_batch(self.fd, ct.byref(token) if total else None, ct.byref(token),
                                             ct.byref(self._keys, self.KEY * total),
                                             ct.byref(self._values, self.VALUE * total), ct.byref(count))
            total += count.value
            if res or not count.value:
                break
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        last = memoryview(self._values.raw).cast("Q")[self.LAST_NS // 8::self.VALUE // 8][:total]
        return total, sum(now - t <= 1_000_000_000 for t in last)

    def close(self) -> None:
        os.close(self.fd)


def _is_flow_table(pid: int, fd: str) -> bool:
    try:
        info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
    except OSError:
        return False
    return "map_type:\t9\n" in info and f"max_entries:\t{MAX_FLOWS}\n" in info


def flows_main(args) -> None:
    variants = [("this checkout", None)] + ([(f"PYTHONPATH={args.ab}", args.ab)] if args.ab else [])
    runs: dict = {}
    for r in range(args.rounds):
        for flows in (int(f) for f in args.flows.split(",")):
            for name, path in variants if r % 2 == 0 else variants[::-1]:
                print(f"round {r + 1}: {flows} flows, {name} ...", file=sys.stderr, flush=True)
                row = measure_flows(flows, args.intervals.split(",")[0], args.seconds, path)
                print("   ", row, file=sys.stderr, flush=True)
                runs.setdefault((flows, name), []).append(row)
    idle = {name: statistics.median(r["rss_mib"] for r in runs[(0, name)]) for name, _ in variants if (0, name) in runs}
    print("| agent | flows | table entries (visited in 1 s) | FPS flows | agent CPU (% of a core) | rounds | "
          "RSS (MiB) | over idle (MiB) | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (flows, name), rows in runs.items():
        med = lambda k: statistics.median(r[k] for r in rows)
        rounds = ", ".join(f"{r['cpu_pct']:.1f}" for r in rows)
        over = f"{med('rss_mib') - idle[name]:+.0f}" if name in idle else "-"
        print(f"| {name} | {flows:,} | {med('entries'):,.0f} ({med('visited'):,.0f}) | {med('estimated'):,.0f} | "
              f"{med('cpu_pct'):.1f} | {rounds} | {med('rss_mib'):.0f} | {over} | {med('load'):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="1,100,1000")
    ap.add_argument("--intervals", default="100ms")
    ap.add_argument("--peers", default="8")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--flows", help="one agent against these numbers of flows (0 = idle), e.g. 0,2000,20000")
    ap.add_argument("--rounds", type=int, default=1, help="--flows: rounds, medians reported")
    ap.add_argument("--ab", metavar="PATH", help="--flows: alternate with the agent from PYTHONPATH=PATH")
    args = ap.parse_args()
    if args.flows:
        return flows_main(args)
    rows = []
    for classes in (int(c) for c in args.classes.split(",")):
        for peers in (int(p) for p in args.peers.split(",")):
            for interval in args.intervals.split(","):
                parse_duration(interval)
                print(f"measuring {classes} classes, interval {interval}, {peers} peers ...", file=sys.stderr, flush=True)
                rows.append(measure(classes, interval, peers, args.seconds))
    print("| classes (active) | interval | peers | agent CPU (% of a core) | per tick (% of the interval) | "
          "RSS (MiB) | control per class, peer, round (B) | datagram payload (B) | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['classes']} ({r['active']}) | {r['interval']} | {r['peers']} | {r['cpu_pct']:.1f} | "
              f"{r['cpu_tick_pct']:.1f} | {r['rss_mib']:.0f} | {r['per_class']:.1f} | {r['datagram']:.0f} | "
              f"{r['load']:.1f} |")


if __name__ == "__main__":
    main()
