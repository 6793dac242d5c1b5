"""Traffic groups placed on a plan: which program runs where, on which port, when.

    groups = place(plan)
    for g in groups:
        g.server_host, g.server_argv(out_dir)   # started before the schedule begins
        g.client_host, g.client_argv(out_dir)   # started at g.traffic.start_s

TCP and UDP groups are iperf3 (client at the source, server at the sink, one
stream per flow).  The server reports what it *received* every 100 ms
(``-i 0.1 -J``): those per-flow intervals are the lab's flow measurements.
A web group is lab/web.py: the server sits at the source (responses are the
limited direction), the fetching client at the sink.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from agent.units import to_bps

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
            return [python, "-m", "lab.web", "serve", "--port", str(self.port)]
        return ["iperf3", "-s", "-1", "-p", str(self.port), "-J", "-i", str(SAMPLE_S)]

    def client_argv(self, out: Path, python: str = sys.executable) -> list[str]:
        t = self.traffic
        if t.kind == "web":
            return [python, "-m", "lab.web", "fetch", "--server", f"{self.target}:{self.port}",
                    "--arrivals", f"{t.arrivals_per_s:g}", "--mean-size", str(t.mean_size),
                    "--shape", f"{t.shape:g}", "--max-size", str(t.max_size),
                    "--duration", f"{t.stop_s - t.start_s:.3f}", "--seed", str(self.seed),
                    "--out", str(self.report(out))]
        argv = ["iperf3", "-c", self.target, "-p", str(self.port), "-t", str(self.seconds),
                "-P", str(t.flows), "-i", "0"]
        if t.kind == "udp":
            argv += ["-u", "-b", f"{to_bps(t.rate_Bps):.0f}"]
        elif self.congestion_control:
            argv += ["-C", self.congestion_control]
        return argv


def place(plan: Plan, seed: int = 0) -> list[Group]:
    exp = plan.exp
    out = []
    for i, t in enumerate(exp.traffic):
        target = plan.address(t.src) if t.kind == "web" else plan.address(exp.sink)
        out.append(Group(i, t, exp.limiter_of(t.src), exp.sink, target, seed=seed * 1000 + i,
                         congestion_control=exp.congestion_control))
    return out
