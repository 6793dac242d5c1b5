"""Benchmark of the datapath (bpf/limiter.c); results go to bench/RESULTS.md.

    sudo .venv/bin/python bench/datapath.py            # all parts, ~15 minutes (shape and web ~5, highrate ~2)
    sudo .venv/bin/python bench/datapath.py --part goodput --seconds 8

Parts, each measured side by side in one run (never against an old number):
  overhead  veth TCP throughput with the program attached (limit far above
            line rate) over without it, alternating runs; goal >= 0.97.
  cost      mean ns per packet from kernel.bpf_stats_enabled (run_time_ns /
            run_cnt in /proc/self/fdinfo/<prog fd>); goal <= 150 ns.
  goodput   1, 4, 16 TCP flows at 10, 50, 200 Mbit/s: iperf3 goodput through
            our limiter (default depth and drop action) over the kernel's tbf
            qdisc at the same rate; goal >= 0.97 in every cell.
  depth     goodput at 50 Mbit/s, 4 flows, for bucket depths and both drop
            actions (how the defaults were chosen).
  shape     shape mode (agent/kernel/shaper.py: HTB class + bfifo) over tbf of the same
            burst and 50 ms queue, iperf3 goodput, 1/4/16 flows x 10/50/200 Mbit/s;
            goal >= 0.97.
  web       ab -c 20 -n 2000 of a 100 KB file from nginx on h2 through 30 Mbit/s of
            h2's egress: latency p50/p99, limiter drops and TCP retransmissions for
            drl police, drl shape and tbf, one after the other; goal shape p99 <= 1.2x tbf.
  highrate  1 and 5 Gbit/s x 4 TCP flows through drl police, drl shape, tbf and htb:
            goodput over tbf's, retransmissions per second, CPU per delivered Gbit
            (iperf3's own and the machine's); goal shape's sender CPU per Gbit <= 1.5x tbf's.
  packet    ns per run and packet rate of the limiter next to a trivial program and
            no program, 64-byte UDP / 1 TCP / 16 TCP flows (bench/per_packet.py);
            goal <= 150 ns at 16 flows, within 60 ns of trivial, UDP rate >= 0.96.
  attribution  BPF_PROG_TEST_RUN of the limiter built without parts (bench/per_packet.py).
  mix       which enforcement is the default: at 20 Mbit/s of h2's egress, 2 bulk curl downloads
            and 150 fetches of 10 KB (ab -c 1) from nginx on h2, a ping every 50 ms, for drl
            police, drl shape and tbf one after the other: fetch latency p50/p99, TCP
            retransmissions on the sender, bulk goodput, ping loss; goal shape p99 <= tbf's.
  outside   64-byte UDP outside every class, an agent in shape and in police mode over no agent,
            rounds alternating; goal >= 0.95.
  roots     a root qdisc the interface had (mq, tbf, pfifo_fast, ...) on a veth of 2 tx queues:
            what shape mode makes of it and whether it comes back.
The limiter counts L2 frame bytes like tbf (skb wire length); see bpf/limiter.c.
``--cc cubic,bbr`` runs every part once per congestion control of the senders.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from drl.agent.burst import mode_depth
from drl.agent.kernel.datapath import Datapath, DatapathError, default_burst
from drl.agent.model import Mode
from drl.agent.kernel.shaper import Shaper
from drl.lab.agents import Cluster
from drl.lab.errors import LabError
from drl.lab.netns import Lab
from drl.lab.topology import new_run, pair
from drl.lab.traffic import client_argv, iperf3, iperf3_server

import per_packet   # bench/per_packet.py: parts packet and attribution

RATES_MBIT = (10, 50, 200)
FLOWS = (1, 4, 16)


def say(msg: str) -> None:
    print(msg, flush=True)


CC = "cubic"  # the senders' congestion control in the part being run (--cc)


def goodput(h1, srv, seconds: float, streams: int) -> float:
    return iperf3(h1, srv, seconds=seconds, streams=streams, cc=CC).received_bps


def with_limiter(net, srv, rate_bps: float, streams: int, seconds: float,
                 burst: int | None = None, action: str = "stolen") -> float:
    h1 = net.hosts[0]
    with Datapath("eth0", netns=h1.ns, drop_action=action) as dp:
        dp.set_class(0, Mode.BUCKET, rate_Bps=rate_bps / 8, burst_bytes=burst)
        return goodput(h1, srv, seconds, streams)


def with_tbf(net, srv, rate_bps: float, streams: int, seconds: float) -> float:
    """tbf at the same rate and depth as our default, 50 ms of queue."""
    h1 = net.hosts[0]
    tc = ["tc", "qdisc", "%s", "dev", "eth0", "root"]
    h1.run(*[c.replace("%s", "add") for c in tc], "tbf", "rate", f"{int(rate_bps)}bit",
           "burst", str(default_burst(rate_bps / 8)), "latency", "50ms")
    try:
        return goodput(h1, srv, seconds, streams)
    finally:
        h1.run(*[c.replace("%s", "del") for c in tc])


def part_overhead(net, srv, seconds: float, rounds: int = 3) -> dict:
    h1 = net.hosts[0]
    base, prog = [], []
    for i in range(rounds):
        base.append(goodput(h1, srv, seconds, 1))
        prog.append(with_limiter(net, srv, 400e9, 1, seconds))
        say(f"  overhead round {i + 1}/{rounds}: without {base[-1] / 1e9:.2f} Gbit/s, "
            f"with {prog[-1] / 1e9:.2f} Gbit/s")
    ratio = statistics.median(prog) / statistics.median(base)
    say(f"overhead: ratio {ratio:.3f} (goal >= 0.97)")
    return {"without_bps": base, "with_bps": prog, "ratio": ratio}


def part_cost(net, srv, seconds: float) -> dict:
    """ns/packet at line rate and at a 50 Mbit/s limit (policing path with drops)."""
    h1 = net.hosts[0]
    out = {}
    old = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    try:
        for name, rate, streams in (("unlimited", 400e9, 1), ("50mbit", 50e6, 4)):
            with Datapath("eth0", netns=h1.ns) as dp:
                dp.set_class(0, Mode.BUCKET, rate_Bps=rate / 8)
                goodput(h1, srv, seconds, streams)
                stats = prog_stats(dp.prog_fd)
            out[name] = stats["run_time_ns"] / max(1, stats["run_cnt"])
            say(f"cost: {out[name]:.0f} ns/packet ({name}, {stats['run_cnt']} runs; goal <= 150)")
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old)
    return out


def prog_stats(fd: int) -> dict:
    fields = dict(line.split(":\t") for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                  if ":\t" in line)
    return {k: int(fields[k]) for k in ("run_time_ns", "run_cnt")}


def part_goodput(net, srv, seconds: float) -> list[dict]:
    cells = []
    for rate in RATES_MBIT:
        for flows in FLOWS:
            ours = with_limiter(net, srv, rate * 1e6, flows, seconds)
            tbf = with_tbf(net, srv, rate * 1e6, flows, seconds)
            cells.append({"rate_mbit": rate, "flows": flows, "ours_bps": ours, "tbf_bps": tbf,
                          "ratio": ours / tbf})
            say(f"goodput {rate:>3} Mbit/s x {flows:>2} flows: ours {ours / 1e6:6.2f}  "
                f"tbf {tbf / 1e6:6.2f}  ratio {ours / tbf:.3f}")
    return cells


def part_depth(net, srv, seconds: float, rate_mbit: float = 50, flows: int = 4) -> list[dict]:
    rows = []
    for depth in (75_000, 128 * 1024, 256 * 1024, 625_000, 1_000_000):
        for action in ("stolen", "shot"):
            bps = with_limiter(net, srv, rate_mbit * 1e6, flows, seconds, burst=depth, action=action)
            rows.append({"depth": depth, "action": action, "bps": bps})
            say(f"depth {depth:>8} B {action:>6}: {bps / 1e6:6.2f} Mbit/s of {rate_mbit}")
    return rows


# -- shape mode -----------------------------------------------------------------------

WEB_RATE_BPS = 30e6
WEB_FILE_BYTES = 100 * 1024
NGINX_CONF = """daemon off; master_process off; worker_processes 1;
pid {dir}/nginx.pid; error_log {dir}/error.log;
events {{ worker_connections 256; }}
http {{ access_log off; client_body_temp_path {dir}/body;
        server {{ listen {addr}:8080; root {dir}/www; }} }}
"""


def root_drops(host) -> int:
    """Packets the root qdisc (tbf, or HTB counting its leaves') dropped."""
    found = re.search(r"root .*?\n.*?dropped (\d+)", host.run("tc", "-s", "qdisc", "show", "dev", "eth0"))
    return int(found.group(1)) if found else 0


def retransmitted(host) -> int:
    out = host.run("nstat", "-az", "TcpRetransSegs")
    return int(next(line.split()[1] for line in out.splitlines() if line.startswith("TcpRetransSegs")))


@contextlib.contextmanager
def limited(host, how: str, rate_bps: float):
    """host's eth0 egress held to rate_bps by drl ``police``, drl ``shape``, ``tbf`` (the
    same burst as shape's HTB class and tbf's 50 ms queue, as shape's bfifo) or a plain
    ``htb`` root (one class at the rate with that burst, its default pfifo leaf); yields a
    callable giving the limiter's drops so far."""
    if how in ("tbf", "htb"):
        burst = str(mode_depth(rate_bps / 8, "shape"))
        if how == "tbf":
            host.run("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", f"{int(rate_bps)}bit",
                     "burst", burst, "latency", "50ms")
        else:
            host.run("tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
            host.run("tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb",
                     "rate", f"{int(rate_bps)}bit", "burst", burst, "cburst", burst)
        try:
            yield lambda: root_drops(host)
        finally:
            host.run("tc", "qdisc", "del", "dev", "eth0", "root")
        return
    with Datapath("eth0", netns=host.ns) as dp:
        shaper = Shaper("eth0", netns=host.ns) if how == "shape" else None
        try:
            prio = shaper.set_rate(0, rate_bps / 8) if shaper else 0
            if shaper and not prio:
                raise LabError("shape mode could not install its HTB class (see the log line above)")
            dp.set_class(0, Mode.BUCKET, rate_Bps=rate_bps / 8, shape_prio=prio)
            yield (lambda: root_drops(host)) if shaper else (lambda: dp.read_counters()[0].dropped_packets)
        finally:
            if shaper:
                shaper.close()


def part_shape(net, srv, seconds: float) -> list[dict]:
    """iperf3 goodput through shape mode over tbf, alternating per cell."""
    h1, cells = net.hosts[0], []
    for rate in RATES_MBIT:
        for flows in FLOWS:
            got = {}
            for how in ("shape", "tbf"):
                with limited(h1, how, rate * 1e6):
                    got[how] = goodput(h1, srv, seconds, flows)
            cells.append({"rate_mbit": rate, "flows": flows, **got, "ratio": got["shape"] / got["tbf"]})
            say(f"shape goodput {rate:>3} Mbit/s x {flows:>2} flows: shape {got['shape'] / 1e6:6.2f}  "
                f"tbf {got['tbf'] / 1e6:6.2f}  ratio {got['shape'] / got['tbf']:.3f}")
    return cells


HIGH_RATES_MBIT = (1000, 5000)
HIGH_FLOWS = 4
HIGH_MODES = ("police", "shape", "tbf", "htb")


def busy_cpu_s() -> float:
    """CPU seconds every CPU of the machine has been busy (/proc/stat: all but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def per_gbit(cpu_s: float, got) -> float:
    """CPU seconds per Gbit an iperf3 run delivered."""
    return cpu_s / (got.received_bytes * 8 / 1e9)


def part_highrate(net, srv, seconds: float, rounds: int = 2) -> list[dict]:
    """1 and 5 Gbit/s, 4 TCP flows: goodput, retransmissions and CPU per delivered Gbit
    through drl police, drl shape, tbf and htb, modes alternating round by round (goal: shape's sender CPU per Gbit within 1.5x tbf's).  Two CPU figures: iperf3's
    own (user + system of the sending process; softirq work such as retransmission timers
    is not in it) and the machine's busy time (/proc/stat: sender, receiver, softirqs)."""
    h1, rows = net.hosts[0], []
    for rate in HIGH_RATES_MBIT:
        runs: dict[str, list] = {how: [] for how in HIGH_MODES}
        for r in range(rounds):
            for how in HIGH_MODES if r % 2 == 0 else HIGH_MODES[::-1]:
                with limited(h1, how, rate * 1e6):
                    busy = busy_cpu_s()
                    got = iperf3(h1, srv, seconds=seconds, streams=HIGH_FLOWS, cc=CC)
                    runs[how].append((got, busy_cpu_s() - busy))
        for how, got in runs.items():
            rows.append({"rate_mbit": rate, "mode": how,
                         "goodput_gbit": statistics.median(g.received_bps / 1e9 for g, _ in got),
                         "retrans_per_s": statistics.median(g.retransmits / g.seconds for g, _ in got),
                         "cpu_s_per_gbit": statistics.median(per_gbit(g.sender_cpu_pct / 100 * g.seconds, g)
                                                             for g, _ in got),
                         "machine_s_per_gbit": statistics.median(per_gbit(busy, g) for g, busy in got)})
        tbf = next(r for r in rows if r["rate_mbit"] == rate and r["mode"] == "tbf")
        for row in (r for r in rows if r["rate_mbit"] == rate):
            row["goodput_vs_tbf"] = row["goodput_gbit"] / tbf["goodput_gbit"]
            row["cpu_vs_tbf"] = row["cpu_s_per_gbit"] / tbf["cpu_s_per_gbit"]
            row["machine_vs_tbf"] = row["machine_s_per_gbit"] / tbf["machine_s_per_gbit"]
            say(f"high rate {rate:>4} Mbit/s {row['mode']:>6}: {row['goodput_gbit']:.3f} Gbit/s "
                f"({row['goodput_vs_tbf']:.3f} of tbf)  retrans {row['retrans_per_s']:7.0f}/s  "
                f"sender {row['cpu_s_per_gbit'] * 1e3:5.1f} ms/Gbit ({row['cpu_vs_tbf']:.2f} x tbf's)  "
                f"machine {row['machine_s_per_gbit'] * 1e3:5.1f} ms/Gbit ({row['machine_vs_tbf']:.2f} x tbf's)")
    return rows


def ab_run(client, url: str, concurrency: int, requests: int) -> dict:
    out = client.run("ab", "-q", "-c", str(concurrency), "-n", str(requests), url)
    pct = {int(p): float(ms) for p, ms in re.findall(r"^\s+(\d+)%\s+(\d+)", out, re.M)}
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))
    mean = float(re.search(r"Time per request:\s+([\d.]+) \[ms\] \(mean\)", out).group(1))
    return {"p50_ms": pct[50], "p99_ms": pct[99], "max_ms": pct[100], "mean_ms": mean, "failed": failed}


@contextlib.contextmanager
def nginx_on(server, client, files: dict[str, int]):
    """nginx on ``server`` serving ``files`` (name -> size; sparse), answering ``client``;
    yields the base URL.  Its TCP runs CC too (as iperf3's -C): a host route to the client
    with congctl (the sysctl is refused in a netns)."""
    server.run("ip", "route", "replace", f"{client.addr4}/32", "dev", "eth0", "congctl", CC)
    with tempfile.TemporaryDirectory(prefix="drl-web-") as tmp:
        www = Path(tmp, "www")
        www.mkdir()
        for name, size in files.items():
            with open(www / name, "wb") as f:
                f.truncate(size)
        conf = Path(tmp, "nginx.conf")
        conf.write_text(NGINX_CONF.format(dir=tmp, addr=server.addr4))
        nginx = server.popen("nginx", "-c", str(conf), log=Path(tmp, "nginx.out"))
        base = f"http://{server.addr4}:8080"
        for _ in range(50):                        # until nginx answers
            try:
                client.run("ab", "-q", "-n", "1", f"{base}/{next(iter(files))}")
                break
            except LabError:
                time.sleep(0.1)
        try:
            yield base
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)


def part_web(net, srv, seconds: float, concurrency: int = 20, requests: int = 2000) -> list[dict]:
    """ab through 30 Mbit/s of the server's egress: drl police, drl shape, tbf."""
    h1, h2 = net.hosts
    rows = []
    with nginx_on(h2, h1, {"100k.bin": WEB_FILE_BYTES}) as base:
        url = f"{base}/100k.bin"
        for how in ("police", "shape", "tbf"):
            with limited(h2, how, WEB_RATE_BPS) as drops:
                d0, r0 = drops(), retransmitted(h2)
                row = {"mode": how, **ab_run(h1, url, concurrency, requests)}
                row.update(drops=drops() - d0, retransmitted=retransmitted(h2) - r0)
            rows.append(row)
            say(f"web {how:>6}: p50 {row['p50_ms']:6.0f} ms  p99 {row['p99_ms']:6.0f} ms  "
                f"max {row['max_ms']:6.0f} ms  mean {row['mean_ms']:6.0f} ms  failed {row['failed']}  "
                f"drops {row['drops']}  retransmitted {row['retransmitted']}")
    tbf = next(r for r in rows if r["mode"] == "tbf")
    for r in rows:
        say(f"web {r['mode']:>6}: p99 / tbf's {r['p99_ms'] / tbf['p99_ms']:.2f} (goal for shape <= 1.2)")
    return rows


# -- which mode is the default: small fetches next to bulk downloads, the cost to traffic
# outside every class, and what becomes of the interface's root qdisc ----------------------

MIX_RATE_BPS = 20e6
MIX_BULK = 2                     # bulk downloads, each of a file larger than the run can fetch
MIX_FETCHES, MIX_FETCH_BYTES = 150, 10 * 1024
MIX_BULK_S = 24                  # the fetches start MIX_LEAD_S into the bulk downloads
MIX_LEAD_S = 3


def ping_stats(out: str) -> dict:
    loss = float(re.search(r"([\d.]+)% packet loss", out).group(1))
    rtt = re.search(r"= [\d.]+/([\d.]+)/([\d.]+)/", out)
    return {"ping_loss_pct": loss, "ping_avg_ms": float(rtt.group(1)) if rtt else None,
            "ping_max_ms": float(rtt.group(2)) if rtt else None}


def part_mix(net, srv, seconds: float, modes=("police", "shape", "tbf")) -> list[dict]:
    """police, shape and tbf one after the other at 20 Mbit/s of h2's egress: MIX_BULK curl
    downloads from nginx on h2 and, MIX_LEAD_S into them, ``ab -c 1`` of MIX_FETCHES files of
    10 KB from the same nginx and a ping every 50 ms: fetch latency, TCP retransmitted segments
    on the sender (nstat in h2's netns), bulk goodput, ping loss and RTT."""
    h1, h2 = net.hosts
    rows = []
    files = {"10k.bin": MIX_FETCH_BYTES, "bulk.bin": 1 << 30}
    with nginx_on(h2, h1, files) as base:
        for how in modes:
            with limited(h2, how, MIX_RATE_BPS) as drops:
                d0, r0 = drops(), retransmitted(h2)
                bulk = [h1.popen("curl", "-s", "-o", "/dev/null", "--max-time", str(MIX_BULK_S),
                                 "-w", "%{size_download}", f"{base}/bulk.bin", capture=True)
                        for _ in range(MIX_BULK)]
                time.sleep(MIX_LEAD_S)
                ping = h1.popen("ping", "-q", "-i", "0.05", "-w", str(MIX_BULK_S - 2 * MIX_LEAD_S), h2.addr4,
                                capture=True)
                row = {"mode": how, "cc": CC, **ab_run(h1, f"{base}/10k.bin", 1, MIX_FETCHES)}
                row.update(ping_stats(ping.communicate(timeout=60)[0]))
                got = [int(p.communicate(timeout=MIX_BULK_S + 30)[0] or 0) for p in bulk]
                row.update(bulk_mbit=sum(got) * 8 / MIX_BULK_S / 1e6, drops=drops() - d0,
                           retransmitted=retransmitted(h2) - r0)
            rows.append(row)
            say(f"mix {CC} {how:>6}: fetch p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
                f"max {row['max_ms']:7.1f} ms  failed {row['failed']}  retransmitted {row['retransmitted']:6}  "
                f"drops {row['drops']:6}  bulk {row['bulk_mbit']:5.2f} Mbit/s  ping loss {row['ping_loss_pct']:.1f} %  "
                f"avg {row['ping_avg_ms']} ms  max {row['ping_max_ms']} ms")
    got = {r["mode"]: r for r in rows}
    if {"shape", "tbf"} <= set(got):
        say(f"mix {CC}: shape p99 / tbf's {got['shape']['p99_ms'] / max(1.0, got['tbf']['p99_ms']):.2f} (goal <= 1)")
    return rows


OUTSIDE_CLASS = "dport=8080,proto=tcp"      # the agent's one class: the UDP below is outside it


OUTSIDE_MODES = ("none", "pfifo_fast", "htb", "police", "shape")


@contextlib.contextmanager
def outside_mode(net, tmp: str, how: str):
    """h1's eth0 as ``how``: no agent (noqueue, a veth's root), no agent over a pfifo_fast root
    (what a NIC's queues have), our HTB tree alone (a Shaper with one class, no program), or an
    agent in police or shape mode whose one class the UDP is outside of."""
    h1 = net.hosts[0]
    if how == "none":
        yield
    elif how == "pfifo_fast":
        h1.run("tc", "qdisc", "add", "dev", "eth0", "root", "pfifo_fast")
        try:
            yield
        finally:
            h1.run("tc", "qdisc", "del", "dev", "eth0", "root")
    elif how == "htb":
        shaper = Shaper("eth0", netns=h1.ns)
        try:
            if not shaper.set_rate(0, MIX_RATE_BPS / 8):
                raise LabError("could not install the HTB tree (see the log line above)")
            yield
        finally:
            shaper.close()
    else:
        agent = Cluster(net, Path(tmp)).start(h1, [], "static", "20mbit", "--class", OUTSIDE_CLASS, "--enforce", how)
        try:
            agent.wait_for(lambda s: s["ticks"] >= 2, 10)
            root = h1.run("tc", "qdisc", "show", "dev", "eth0").splitlines()[0]
            if ("htb d1d1:" in root) != (how == "shape"):
                raise LabError(f"{how}: unexpected root qdisc {root!r}")
            yield
        finally:
            agent.kill(signal.SIGTERM)


def part_outside(net, srv, seconds: float, rounds: int = 4) -> dict:
    """64-byte UDP from h1 (iperf3, pinned to CPU 0) outside every class for each of
    OUTSIDE_MODES, rounds alternating the order; ratios of the median packet rates over no
    agent's (goal >= 0.95 for the default mode).  In shape mode the UDP goes through HTB's
    default class and its root lock; pfifo_fast and htb alone say how much of that is a
    qdisc at all and how much the program."""
    h1 = net.hosts[0]
    rates: dict[str, list[float]] = {how: [] for how in OUTSIDE_MODES}
    cpu_ns: dict[str, list[float]] = {how: [] for how in OUTSIDE_MODES}
    with tempfile.TemporaryDirectory(prefix="drl-outside-") as tmp:
        for r in range(rounds):
            for how in OUTSIDE_MODES if r % 2 == 0 else OUTSIDE_MODES[::-1]:
                with outside_mode(net, tmp, how):
                    packets, run_s, cpu_s = udp64(h1, srv, int(seconds))
                rates[how].append(packets / run_s)
                cpu_ns[how].append(cpu_s / packets * 1e9)
                say(f"outside round {r + 1}/{rounds} {how:>10}: {rates[how][-1] / 1e3:7.1f} k packets/s  "
                    f"{cpu_ns[how][-1]:6.0f} ns of sender CPU a packet")
    med = {how: statistics.median(v) for how, v in rates.items()}
    ns = {how: statistics.median(v) for how, v in cpu_ns.items()}
    # the sender's CPU per packet is the robust figure on a shared machine: its rate moves with
    # what else runs, its CPU time per packet much less; rate ratio = none's ns / the mode's
    out = {"rates": rates, "cpu_ns": cpu_ns, "rate_ratios": {how: med[how] / med["none"] for how in OUTSIDE_MODES},
           "cpu_ratios": {how: ns["none"] / ns[how] for how in OUTSIDE_MODES}}
    for what in ("rate_ratios", "cpu_ratios"):
        say(f"outside {what} (over no agent's; goal >= 0.95): " +
            "  ".join(f"{how} {ratio:.3f}" for how, ratio in out[what].items()))
    say("outside: sender ns a packet, medians: " + "  ".join(f"{how} {v:.0f}" for how, v in ns.items()))
    return out


def udp64(host, srv, seconds: int) -> tuple[int, float, float]:
    """iperf3's 64-byte UDP at full speed from ``host``, pinned to CPU 0: datagrams sent, the
    run's seconds and the CPU seconds the sending process used (user + system)."""
    proc = host.popen(*client_argv(srv.addr, srv.port, seconds, 1, "-J", udp_bps=0, length=22), cpu=0,
                      capture=True)
    out, err = proc.communicate(timeout=seconds + 60)
    report = json.loads(out or "{}")
    if proc.returncode or "error" in report:
        raise LabError(f"iperf3 failed: {report.get('error') or err.strip()}")
    end = report["end"]
    return end["sum"]["packets"], end["sum"]["seconds"], end["cpu_utilization_percent"]["host_total"] / 100 * \
        end["sum"]["seconds"]


# root qdiscs a user may have, as `tc qdisc add dev IF root ...` (this kernel has no fq_codel/fq)
ROOTS = {"noqueue (veth default)": None, "mq": ["mq"], "mq handle 1:": ["handle", "1:", "mq"],
         "tbf": ["handle", "5:", "tbf", "rate", "200mbit", "burst", "200kb", "latency", "20ms"],
         "pfifo_fast": ["pfifo_fast"], "htb (a user's, no classes)": ["handle", "7:", "htb", "default", "1"]}


def qdisc_lines(host, dev: str) -> list[str]:
    return sorted(re.sub(r" refcnt \d+", "", line).strip()
                  for line in host.run("tc", "qdisc", "show", "dev", dev).splitlines() if line.strip())


def part_roots(net, srv, seconds: float) -> list[dict]:
    """What shape mode does to a root qdisc the interface had, and what it puts back, on a veth
    of 2 tx and 2 rx queues in h1's netns: for each of ROOTS, the qdiscs before, while a
    Shaper shapes one class, and after it closes."""
    h1, rows = net.hosts[0], []
    h1.run("ip", "link", "add", "mqa", "numtxqueues", "2", "numrxqueues", "2", "type", "veth", "peer", "name",
           "mqb", "numtxqueues", "2", "numrxqueues", "2")
    try:
        h1.run("ip", "link", "set", "mqa", "up")
        h1.run("ip", "link", "set", "mqb", "up")
        for name, args in ROOTS.items():
            if args:
                h1.run("tc", "qdisc", "add", "dev", "mqa", "root", *args)
            before = qdisc_lines(h1, "mqa")
            shaper = Shaper("mqa", netns=h1.ns)
            try:
                prio = shaper.set_rate(0, MIX_RATE_BPS / 8)
                during = qdisc_lines(h1, "mqa")
            finally:
                shaper.close()
            after = qdisc_lines(h1, "mqa")
            row = {"root": name, "before": before, "shaped": bool(prio), "during": during, "after": after,
                   "restored": after == before}
            rows.append(row)
            say(f"roots {name}: before {before}")
            say(f"      shaped {row['shaped']}, during {[l for l in during if ' root ' in l]}; "
                f"restored {row['restored']}" + ("" if row["restored"] else f": after {after}"))
            with contextlib.suppress(LabError):          # noqueue cannot be deleted
                h1.run("tc", "qdisc", "del", "dev", "mqa", "root")
    finally:
        h1.run("ip", "link", "del", "mqa")
    return rows


PARTS = {"overhead": part_overhead, "cost": part_cost, "goodput": part_goodput, "depth": part_depth}
PARTS.update(shape=part_shape, web=part_web, highrate=part_highrate, mix=part_mix, outside=part_outside,
             roots=part_roots)
PARTS.update(packet=lambda net, srv, seconds: per_packet.part_packet(net, srv, seconds, **PACKET_OPTIONS),
             attribution=lambda net, srv, seconds: per_packet.part_attribution(
                 net, srv, seconds, rounds=PACKET_OPTIONS["rounds"] + 2, before=PACKET_OPTIONS["before"]))
PACKET_OPTIONS = {"rounds": 3, "variants": (), "before": per_packet.BEFORE_REV}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=list(PARTS), action="append", help="run only these parts")
    ap.add_argument("--seconds", type=float, default=6, help="iperf3 duration per measurement")
    ap.add_argument("--cc", default=CC, help="TCP congestion control of the senders, comma-separated: "
                    "every part runs once per entry (default cubic)")
    ap.add_argument("--rounds", type=int, default=3, help="packet: rounds per program and mix (attribution: +2)")
    ap.add_argument("--variants", default="", help=f"packet: also these builds, comma-separated "
                    f"({', '.join(v for v in per_packet.VARIANTS if v != 'limiter')})")
    ap.add_argument("--before", default=per_packet.BEFORE_REV,
                    help="git revision of the 'before' limiter; several, comma-separated ('' = none)")
    args = ap.parse_args()
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = [v for v in variants if v not in per_packet.VARIANTS]
    if unknown:
        ap.error(f"unknown variant {', '.join(unknown)} (variants of an older revision are run from "
                 f"its own checkout)")
    PACKET_OPTIONS.update(rounds=args.rounds, before=args.before, variants=variants)
    started = time.monotonic()
    with Lab(pair(new_run("dp"))) as net:
        with iperf3_server(net.hosts[1]) as srv:
            for cc in args.cc.split(","):
                globals()["CC"] = cc
                for name in args.part or list(PARTS):
                    say(f"== {name} ({cc})")
                    PARTS[name](net, srv, args.seconds)
    say(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except (LabError, DatapathError) as e:     # a --before revision that does not compile, say
        sys.exit(f"error: {e}")
