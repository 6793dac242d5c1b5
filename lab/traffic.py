"""Traffic: an experiment's groups placed on its plan, and iperf3 between hosts of any Lab.

    groups = place(plan)
    for g in groups:
        g.server_host, g.server_argv(out_dir)   # started before the schedule begins
        g.client_host, g.client_argv(out_dir)   # started at g.traffic.start_s

    with iperf3_server(h2) as srv:               # kernel tests and benchmarks
        result = iperf3(h1, srv, seconds=5, streams=4)
    result.received_bps

TCP and UDP groups are iperf3 (client at the source, server at the sink, one
stream per flow).  The server reports what it *received* every 100 ms
(``-i 0.1 -J``): those per-flow intervals are the lab's flow measurements.
A web group is lab/web.py: the server sits at the source (responses are the
limited direction), the fetching client at the sink.  Servers started with
``iperf3_server`` take the ports 5201, 5202, ... of their host in start order.
"""
from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from drl.agent.units import to_bps

from .errors import LabError
from .netns import Host, poll, stop
from .spec import Traffic
from .topology import Plan

BASE_PORT = 5201
SAMPLE_S = 0.1


@dataclass(frozen=True)
class Group:
    index: int
    traffic: Traffic
    limiter: str
    sink: str
    target: str   # the address the client connects to
    seed: int = 0
    congestion_control: str | None = None   # iperf3 -C for TCP groups; None: the machine's default

    @property
    def port(self) -> int:
        return BASE_PORT + self.index

    @property
    def label(self) -> str:
        return f"{self.traffic.src}:{self.traffic.kind}{self.index}"

    @property
    def seconds(self) -> int:
        # iperf3 counts whole seconds; a scaled schedule rounds to them
        return max(1, round(self.traffic.stop_s - self.traffic.start_s))

    @property
    def server_host(self) -> str:
        return self.traffic.src if self.traffic.kind == "web" else self.sink

    @property
    def client_host(self) -> str:
        return self.sink if self.traffic.kind == "web" else self.traffic.src

    def report(self, out: Path) -> Path:
        """Where the receiving side writes its measurements."""
        return out / f"flow{self.index}.json"

    def server_argv(self, out: Path, python: str = sys.executable) -> list[str]:
        if self.traffic.kind == "web":
            return [python, "-m", "drl.lab.web", "serve", "--port", str(self.port)]
        return ["iperf3", "-s", "-1", "-p", str(self.port), "-J", "-i", str(SAMPLE_S)]

    def client_argv(self, out: Path, python: str = sys.executable) -> list[str]:
        t = self.traffic
        if t.kind == "web":
            return [python, "-m", "drl.lab.web", "fetch", "--server", f"{self.target}:{self.port}",
                    "--arrivals", f"{t.arrivals_per_s:g}", "--mean-size", str(t.mean_size),
                    "--shape", f"{t.shape:g}", "--max-size", str(t.max_size),
                    "--duration", f"{t.stop_s - t.start_s:.3f}", "--seed", str(self.seed),
                    "--out", str(self.report(out))]
        return client_argv(self.target, self.port, self.seconds, t.flows, "-i", "0",
                           udp_bps=to_bps(t.rate_Bps) if t.kind == "udp" else None, cc=self.congestion_control)


def place(plan: Plan, seed: int = 0) -> list[Group]:
    exp = plan.exp
    out = []
    for i, t in enumerate(exp.traffic):
        target = plan.address(t.src) if t.kind == "web" else plan.address(exp.sink)
        out.append(Group(i, t, exp.limiter_of(t.src), exp.sink, target, seed=seed * 1000 + i,
                         congestion_control=t.congestion_control or exp.congestion_control))
    return out


def client_argv(target: str, port: int, seconds: int, streams: int, *opts: str, udp_bps: float | None = None,
                length: int | None = None, cc: str | None = None, bitrate_bps: float | None = None) -> list[str]:
    """``iperf3 -c``: TCP with congestion control ``cc`` (None: the machine's), paced at
    ``bitrate_bps`` per stream if given, or UDP at ``udp_bps``."""
    argv = ["iperf3", "-c", target, "-p", str(port), "-t", str(seconds), "-P", str(streams), *opts]
    if udp_bps is not None:
        argv += ["-u", "-b", f"{udp_bps:.0f}"]
    elif bitrate_bps is not None:
        argv += ["-b", f"{bitrate_bps:.0f}"]
    if length is not None:
        argv += ["-l", str(length)]
    if cc and udp_bps is None:
        argv += ["-C", cc]
    return argv


@dataclass(frozen=True)
class IperfResult:
    seconds: float
    sent_bytes: int
    received_bytes: int
    packets: int = 0           # UDP only: datagrams sent
    lost_packets: int = 0      # UDP only: datagrams the server never saw
    stream_bytes: tuple[int, ...] = ()   # TCP only: bytes each stream delivered
    retransmits: int = 0       # TCP only: segments the sender retransmitted
    sender_cpu_pct: float = 0.0  # the client process's CPU (user + system) over the run, % of one CPU

    @property
    def received_bps(self) -> float:
        return self.received_bytes * 8 / self.seconds


@dataclass(frozen=True)
class Server:
    host: Host
    port: int
    proc: subprocess.Popen

    @property
    def addr(self) -> str:
        return self.host.addr4

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        stop(self.proc)


@dataclass(frozen=True)
class Client:
    """A running iperf3 client; wait() parses its JSON report."""
    proc: subprocess.Popen
    udp: bool

    def wait(self, timeout: float = 120) -> IperfResult:
        out, err = self.proc.communicate(timeout=timeout)
        report = json.loads(out or "{}")
        if self.proc.returncode or "error" in report:
            raise LabError(f"iperf3 failed: {report.get('error') or err.strip()}")
        end = report["end"]
        if self.udp:
            s = end["sum"]
            return IperfResult(s["seconds"], s["bytes"], s["bytes"], s["packets"], s["lost_packets"])
        return IperfResult(end["sum_received"]["seconds"], end["sum_sent"]["bytes"], end["sum_received"]["bytes"],
                           stream_bytes=tuple(s["receiver"]["bytes"] for s in end["streams"]),
                           retransmits=end["sum_sent"].get("retransmits", 0),
                           sender_cpu_pct=end.get("cpu_utilization_percent", {}).get("host_total", 0.0))

    def stop(self, timeout: float = 10) -> None:
        """End a client whose traffic the caller no longer needs (SIGINT, as iperf3's Ctrl-C),
        instead of waiting out its -t; fails as wait() does if iperf3 had failed before.  One
        that already ended by itself is wait()ed for."""
        if self.proc.poll() is not None:
            self.wait(timeout)
            return
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=timeout)
        error = json.loads(out or "{}").get("error")
        if error is None and self.proc.returncode == 0:
            return                          # it ended by itself just before the signal
        if not (error or "").startswith("interrupt"):
            raise LabError(f"iperf3 failed: {error or err.strip()}")


def iperf3_server(host: Host, port: int | None = None) -> Server:
    """An iperf3 server on ``port`` (default: the first free of 5201, 5202, ...), listening on return."""
    if port is None:
        port = next(p for p in itertools.count(BASE_PORT) if not host.listening(p))
    proc = host.popen("iperf3", "-s", "-p", str(port))
    if not poll(lambda: proc.poll() is not None or host.listening(port), 5.0) or proc.poll() is not None:
        raise LabError(f"iperf3 server on {host.ns}:{port} did not start")
    return Server(host, port, proc)


def iperf3_start(host: Host, server: Server, *, seconds: int, streams: int = 1, udp_bps: float | None = None,
                 length: int | None = None, cpu: int | None = None, ipv6: bool = False,
                 cc: str | None = "cubic", bitrate_bps: float | None = None, dst: str | None = None) -> Client:
    """Start a client on ``host`` towards ``server`` (TCP, or UDP at udp_bps bits/s); .wait() for the result.

    cc: TCP congestion control; cubic unless told, whatever the host's default is.
    dst: another of the server host's addresses to connect to (default: its first).
    """
    if int(seconds) != seconds or seconds < 1:
        raise ValueError(f"iperf3 runs whole seconds >= 1, not {seconds}")   # -t 0 runs forever
    dst = dst or (server.host.addr6 if ipv6 else server.addr)
    argv = client_argv(dst, server.port, int(seconds), streams, "-J", udp_bps=udp_bps, length=length, cc=cc,
                       bitrate_bps=bitrate_bps)
    return Client(host.popen(*argv, cpu=cpu, capture=True), udp_bps is not None)


def iperf3(host: Host, server: Server, **kw) -> IperfResult:
    return iperf3_start(host, server, **kw).wait()


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


def udp_blast(host: Host, dst: str, rate_bps: float, seconds: float) -> subprocess.Popen:
    """Open-loop UDP (1200-byte payloads) from host to dst:9 at rate_bps; no receiver needed
    (the sink's interface counts it), so nothing handshakes through the limiter.  .wait() it."""
    return host.popen("python3", "-c", _BLAST, dst, str(rate_bps), str(seconds))
