"""Network namespaces for kernel tests and benchmarks: hosts on veth, iperf3 inside.

    with Network(run_prefix("dp")) as net:        # two hosts on one veth pair
        h1, h2 = net.hosts
        with h2.iperf3_server() as srv:
            result = h1.iperf3(srv, seconds=5, streams=4)
        print(result.received_bps)

Naming is the API (other tests rely on it):

* run prefix: ``run_prefix("dp")`` -> ``"dp"`` + 3 random hex digits, e.g. ``dpa3f``;
  every test run uses its own, so parallel runs never collide.
* host i (1-based): namespace ``<prefix>-h<i>``, one interface ``eth0`` inside it,
  addresses ``10.0.0.<i>/24`` and ``fd00::<i>/64``.
* 2 hosts: ``h1:eth0 <-> h2:eth0`` is one veth pair.  More hosts: every
  ``h<i>:eth0`` is paired with ``h<i>`` in namespace ``<prefix>-sw``, where a
  bridge ``br0`` joins them.  Interface names live only inside the namespaces,
  so they never clash with the host's and stay far below 15 characters.
* iperf3 servers listen on 5201, 5202, ... per host, in start order.
* ``rto_min`` (e.g. ``WAN_RTO_MIN``), when given, is set on every host's
  subnet routes: TCP's minimum retransmission timeout.  Linux's default,
  200 ms, is a few RTTs on a WAN but 4,000 of a veth's 50 us, and TCP flows
  sharing one token bucket then take turns by timeouts instead of sharing
  it (README "TCP on veth"); tests of how agents divide a limit among TCP
  flows use ``WAN_RTO_MIN``.

The topology is planned as a list of ``ip`` commands first (``Network.plan()``,
testable without root) and then executed.  ``close()`` (the ``with`` exit)
kills only the processes this Network started, by pid, and deletes only its
own namespaces, which removes their veths.  :func:`kernel_skip_reason` says
why kernel tests cannot run here (not root, no bcc, no iperf3).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field


# TCP's minimum RTO for agent tests: 200 veth RTTs, as 200 ms is a few WAN RTTs.
WAN_RTO_MIN = "10ms"


def run_prefix(base: str) -> str:
    """base + 3 random hex digits: the unique name prefix of one run."""
    return base + secrets.token_hex(2)[:3]


def kernel_skip_reason() -> str | None:
    """Why kernel tests cannot run on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, BPF)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "needs bcc (apt install python3-bpfcc)"
    if not shutil.which("iperf3"):
        return "needs iperf3"
    return None


def within(value: float, target: float, rel: float) -> bool:
    """The one tolerance rule of the kernel tests: |value - target| <= rel * target."""
    return abs(value - target) <= rel * target


@dataclass(frozen=True)
class IperfResult:
    seconds: float
    sent_bytes: int
    received_bytes: int
    packets: int = 0           # UDP only: datagrams sent
    lost_packets: int = 0      # UDP only: datagrams the server never saw
    stream_bytes: tuple[int, ...] = ()   # TCP only: bytes each stream delivered

    @property
    def received_bps(self) -> float:
        return self.received_bytes * 8 / self.seconds


@dataclass
class Server:
    host: "Host"
    port: int
    proc: subprocess.Popen

    @property
    def addr(self) -> str:
        return self.host.addr4

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.host.net.stop(self.proc)


class Client:
    """A running iperf3 client; wait() parses its JSON report."""

    def __init__(self, net: "Network", proc: subprocess.Popen, udp: bool):
        self.net, self.proc, self.udp = net, proc, udp

    def wait(self, timeout: float = 120) -> IperfResult:
        out, err = self.proc.communicate(timeout=timeout)
        self.net.forget(self.proc)
        report = json.loads(out or "{}")
        if self.proc.returncode or "error" in report:
            raise RuntimeError(f"iperf3 failed: {report.get('error') or err.strip()}")
        end = report["end"]
        if self.udp:
            s = end["sum"]
            return IperfResult(s["seconds"], s["bytes"], s["bytes"], s["packets"], s["lost_packets"])
        return IperfResult(end["sum_received"]["seconds"], end["sum_sent"]["bytes"],
                           end["sum_received"]["bytes"],
                           stream_bytes=tuple(s["receiver"]["bytes"] for s in end["streams"]))


@dataclass
class Host:
    net: "Network"
    index: int
    ns: str
    iface: str = "eth0"
    _next_port: int = 5201

    @property
    def addr4(self) -> str:
        return f"10.0.0.{self.index}"

    @property
    def addr6(self) -> str:
        return f"fd00::{self.index}"

    def argv(self, *cmd: str, cpu: int | None = None) -> list[str]:
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        return ["ip", "netns", "exec", self.ns, *pin, *cmd]

    def run(self, *cmd: str) -> str:
        """Run to completion inside the namespace; stdout, or CalledProcessError."""
        return subprocess.run(self.argv(*cmd), check=True, capture_output=True, text=True).stdout

    def popen(self, *cmd: str, cpu: int | None = None, quiet: bool = False) -> subprocess.Popen:
        return self.net.start(self.argv(*cmd, cpu=cpu), quiet)

    def iperf3_server(self, port: int | None = None) -> Server:
        """An iperf3 server on port (default: the next of 5201, 5202, ...), listening on return."""
        if port is None:
            port, self._next_port = self._next_port, self._next_port + 1
        proc = self.popen("iperf3", "-s", "-p", str(port), quiet=True)
        deadline = time.monotonic() + 5
        while f":{port} " not in self.run("ss", "-Hltn"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"iperf3 server on {self.ns}:{port} did not start")
            time.sleep(0.05)
        return Server(self, port, proc)

    def iperf3_start(self, server: Server, *, seconds: int, streams: int = 1, udp_bps: float | None = None,
                     length: int | None = None, cpu: int | None = None, ipv6: bool = False,
                     cc: str | None = "cubic") -> Client:
        """Start a client towards server (TCP, or UDP at udp_bps bits/s); .wait() for the result.

        cc: TCP congestion control; cubic unless told, whatever the host's default is.
        """
        if int(seconds) != seconds or seconds < 1:
            raise ValueError(f"iperf3 runs whole seconds >= 1, not {seconds}")   # -t 0 runs forever
        dst = server.host.addr6 if ipv6 else server.addr
        cmd = ["iperf3", "-c", dst, "-p", str(server.port), "-t", str(int(seconds)), "-P", str(streams), "-J"]
        if udp_bps is not None:
            cmd += ["-u", "-b", str(int(udp_bps))]
        if length is not None:
            cmd += ["-l", str(length)]
        if cc and udp_bps is None:
            cmd += ["-C", cc]
        return Client(self.net, self.popen(*cmd, cpu=cpu), udp_bps is not None)

    def iperf3(self, server: Server, **kw) -> IperfResult:
        return self.iperf3_start(server, **kw).wait()


@dataclass
class Network:
    """n_hosts namespaces named from prefix (see the module docstring)."""
    prefix: str
    n_hosts: int = 2
    rto_min: str | None = None
    hosts: list[Host] = field(default_factory=list)
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def namespaces(self) -> list[str]:
        hosts = [f"{self.prefix}-h{i}" for i in range(1, self.n_hosts + 1)]
        return hosts if self.n_hosts == 2 else hosts + [self.switch]

    def plan(self) -> list[list[str]]:
        """The ip commands that build the topology, in order (pure)."""
        hosts = self.namespaces()[:self.n_hosts]
        cmds = [["ip", "netns", "add", ns] for ns in self.namespaces()]
        if self.n_hosts == 2:
            cmds.append(["ip", "-n", hosts[0], "link", "add", "eth0", "type", "veth",
                         "peer", "name", "eth0", "netns", hosts[1]])
        else:
            cmds += [["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"],
                     ["ip", "-n", self.switch, "link", "set", "br0", "up"]]
            for i, ns in enumerate(hosts, 1):
                cmds += [["ip", "-n", ns, "link", "add", "eth0", "type", "veth",
                          "peer", "name", f"h{i}", "netns", self.switch],
                         ["ip", "-n", self.switch, "link", "set", f"h{i}", "master", "br0", "up"]]
        for i, ns in enumerate(hosts, 1):
            cmds += [["ip", "-n", ns, "addr", "add", f"10.0.0.{i}/24", "dev", "eth0"],
                     ["ip", "-n", ns, "addr", "add", f"fd00::{i}/64", "dev", "eth0", "nodad"],
                     ["ip", "-n", ns, "link", "set", "eth0", "up"],
                     ["ip", "-n", ns, "link", "set", "lo", "up"]]
            if self.rto_min:
                cmds += [["ip", "-n", ns, "route", "replace", "10.0.0.0/24", "dev", "eth0", "rto_min", self.rto_min],
                         ["ip", "-n", ns, "-6", "route", "replace", "fd00::/64", "dev", "eth0", "metric", "256",
                          "rto_min", self.rto_min]]
        return cmds

    def build(self) -> "Network":
        try:
            for cmd in self.plan():
                if cmd[:3] == ["ip", "netns", "add"]:
                    self._made.append(cmd[3])
                subprocess.run(cmd, check=True, capture_output=True, text=True)
        except BaseException:
            self.close()
            raise
        self.hosts = [Host(self, i, ns) for i, ns in enumerate(self.namespaces()[:self.n_hosts], 1)]
        return self

    def start(self, argv: list[str], quiet: bool = False, log=None) -> subprocess.Popen:
        """Run argv in its own session; quiet = discard its output (long-lived servers),
        log = an open file that gets stdout and stderr (long-lived and chatty: agents)."""
        out = log or (subprocess.DEVNULL if quiet else subprocess.PIPE)
        proc = subprocess.Popen(argv, stdout=out, stderr=out, text=True, start_new_session=True)
        self._procs.append(proc)
        return proc

    def forget(self, proc: subprocess.Popen) -> None:
        if proc in self._procs:
            self._procs.remove(proc)

    def stop(self, proc: subprocess.Popen) -> None:
        """End one process this Network started (its own session only)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        self.forget(proc)

    def close(self) -> None:
        for proc in list(self._procs):
            self.stop(proc)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> "Network":
        return self.build()

    def __exit__(self, *exc) -> None:
        self.close()
