"""Real `drl-agent up` processes in test namespaces, and what the tests read from them.

    agents = Agents(net, tmp_path, key_file)
    a1 = agents.start(net.hosts[0], peers=[net.hosts[1]], allocator="fps", global_="10mbit")
    agents.status(a1)["peers"][0]["state"]     # drlctl status --json
    sink_rate_bps(net.hosts[2], seconds=10)     # L2 bits/s arriving at the sink

Agent i listens on ``10.0.0.<i>:7470`` with node id ``n<i>``; its control
socket and log live in the test's tmp_path.  The processes belong to the
Network, which kills them (and removes the namespaces) even when a test fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
PORT = 7470


@dataclass
class Agent:
    host: object
    proc: subprocess.Popen
    socket: str
    log: Path

    @property
    def node_id(self) -> str:
        return f"n{self.host.index}"


class Agents:
    def __init__(self, net, tmp_path: Path, key_file: str | None = None):
        self.net, self.dir, self.key_file = net, tmp_path, key_file

    def argv(self, host, peers=(), allocator="fps", global_="10mbit", *extra: str) -> list[str]:
        auth = ["--key-file", self.key_file] if self.key_file else ["--insecure"]
        return [str(BIN / "drl-agent"), "up", "--iface", "eth0", "--global", global_, "--allocator", allocator,
                "--node-id", f"n{host.index}", "--listen", f"{host.addr4}:{PORT}",
                "--peers", ",".join(f"n{p.index}@{p.addr4}:{PORT}" for p in peers),
                "--socket", str(self.dir / f"n{host.index}.sock"), "--state-dir", str(self.dir), *auth, *extra]

    def start(self, host, peers=(), allocator="fps", global_="10mbit", *extra: str, wait: bool = True) -> Agent:
        log = self.dir / f"n{host.index}.log"
        with open(log, "a") as out:
            proc = self.net.start(host.argv(*self.argv(host, peers, allocator, global_, *extra)), log=out)
        agent = Agent(host, proc, str(self.dir / f"n{host.index}.sock"), log)
        if wait:
            self.wait_ready(agent)
        return agent

    def wait_ready(self, agent: Agent, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if agent.proc.poll() is not None:
                raise RuntimeError(f"agent {agent.node_id} exited {agent.proc.returncode}: {agent.log.read_text()}")
            if os.path.exists(agent.socket) and self.try_status(agent) is not None:
                return
            time.sleep(0.2)
        raise RuntimeError(f"agent {agent.node_id} not ready in {timeout_s} s: {agent.log.read_text()}")

    def try_status(self, agent: Agent) -> dict | None:
        out = subprocess.run([str(BIN / "drlctl"), "--socket", agent.socket, "status", "--json"],
                             capture_output=True, text=True)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def status(self, agent: Agent) -> dict:
        st = self.try_status(agent)
        assert st is not None, f"no status from {agent.node_id}: {agent.log.read_text()}"
        return st

    def wait_for(self, agent: Agent, predicate, timeout_s: float) -> dict:
        """Poll status until predicate(status) holds; the last status either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(agent)
            if predicate(st) or time.monotonic() > deadline:
                return st
            time.sleep(0.2)

    def stop(self, agent: Agent, sig: int) -> int:
        os.killpg(agent.proc.pid, sig)
        rc = agent.proc.wait(timeout=10)
        self.net.forget(agent.proc)
        return rc


_BLAST = """
import socket, sys, time
dst, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload, start, sent = bytes(1200), time.monotonic(), 0
while (now := time.monotonic()) - start < seconds:
    if sent * 8 * len(payload) < rate * (now - start):
        s.sendto(payload, (dst, 9))
        sent += 1
    else:
        time.sleep(0.0005)
"""


def udp_blast(host, dst: str, rate_bps: float, seconds: float):
    """Open-loop UDP (1200-byte payloads) from host to dst:9 at rate_bps; no receiver needed
    (the sink's interface counts it), so nothing handshakes through the limiter.  .wait() it."""
    return host.popen("python3", "-c", _BLAST, dst, str(rate_bps), str(seconds), quiet=True)


def rx_bytes(host) -> int:
    return int(host.run("cat", "/sys/class/net/eth0/statistics/rx_bytes"))


def sink_rate_bps(host, seconds: float) -> float:
    """L2 bits/s arriving on host's eth0 over the next ``seconds`` (what the limiter counts)."""
    before = rx_bytes(host)
    time.sleep(seconds)
    return (rx_bytes(host) - before) * 8 / seconds


def jain(xs) -> float:
    xs = list(xs)
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else 0.0


@dataclass
class SplitRun:
    """One run of FPS's 3:7 setting (three_to_seven)."""
    share: float                 # the 3-flow limiter's mean limit over the sum of both means
    sink_bps: float              # L2 bits/s at the sink over the measured 30 s
    stream_bytes: tuple          # every flow's bytes (3 then 7), for Jain's index
    statuses: list               # both agents' status at the end


def three_to_seven(agents: Agents, a1: Agent, a2: Agent, sink, poll_s: float) -> SplitRun:
    """000 §5.1: 3 cubic flows leave a1's host, 7 leave a2's, for 38 s towards
    ``sink``; after 6 s of warm-up the local limits are read every ``poll_s``
    for 30 s (the kernel test and bench/split.py)."""
    limits = []
    with sink.iperf3_server() as s1, sink.iperf3_server() as s2:
        c1 = a1.host.iperf3_start(s1, seconds=38, streams=3)
        c2 = a2.host.iperf3_start(s2, seconds=38, streams=7)
        time.sleep(6)
        before = rx_bytes(sink)
        started = time.monotonic()
        while time.monotonic() - started < 30:
            limits.append([agents.status(a)["local_limit_bps"] for a in (a1, a2)])
            time.sleep(poll_s)
        rate = (rx_bytes(sink) - before) * 8 / (time.monotonic() - started)
        statuses = [agents.status(a) for a in (a1, a2)]
        r1, r2 = c1.wait(), c2.wait()
    l1, l2 = (sum(col) / len(col) for col in zip(*limits))
    return SplitRun(l1 / (l1 + l2), rate, r1.stream_bytes + r2.stream_bytes, statuses)


def tc_filters(host) -> str:
    return host.run("tc", "filter", "show", "dev", "eth0", "egress")


def has_clsact(host) -> bool:
    return "clsact" in host.run("tc", "qdisc", "show", "dev", "eth0")
