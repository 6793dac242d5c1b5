"""One ``drl-agent`` per limiter, inside its namespace, sharing a generated cluster key.

    argv = agent_argv(plan, "l1", "fps", key_file="/run/drl-lab/lb3fa2/key",
                      socket="/run/drl-lab/lb3fa2/l1.sock")
    agents = start_agents(lab, "fps")      # waits until every agent answers on its socket

The argv is pure (lab/vagrant.py builds the VMs' agents from the same
function, so the lab and the Vagrant twin run identical options).  Agents
gossip over the control network (lab/topology.py) and limit the egress of
their interface toward the sink.  In the CTB reference run one agent with
allocator ``ctb`` limits the link every flow crosses.
"""
from __future__ import annotations

import secrets
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.control import ControlError, request
from agent.units import to_bps

from .errors import LabError
from .netns import Lab
from .spec import REFERENCE
from .topology import Plan

GOSSIP_PORT = 7470
READY_TIMEOUT_S = 90.0   # bcc compiles the BPF program at start: seconds per agent on a busy machine


def drl_agent() -> str:
    """The drl-agent next to this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("drl-agent")
    found = str(beside) if beside.exists() else shutil.which("drl-agent")
    if not found:
        raise LabError("drl-agent is not installed (pip install -e . in the project)")
    return found


def agent_argv(plan: Plan, host: str, allocator: str, key_file: str, socket: str,
               iface: str | None = None, program: str = "drl-agent") -> list[str]:
    """``drl-agent up ...`` for ``host``; ``iface`` overrides the interface name (VMs name NICs their own way)."""
    exp = plan.exp
    argv = [program, "up", "--iface", iface or plan.agent_ifaces()[host].name,
            "--global", f"{to_bps(exp.global_Bps):.0f}bit", "--allocator", allocator,
            "--node-id", host, "--socket", socket]
    if plan.ctl:
        # ID@HOST:PORT: gdrl, fillratio, dqmp and lease need to know every member's id
        peers = [f"{h}@{plan.ctl_address(h)}:{GOSSIP_PORT}" for h in plan.agent_ifaces() if h != host]
        argv += ["--listen", f"{plan.ctl_address(host)}:{GOSSIP_PORT}", "--peers", ",".join(peers),
                 "--key-file", key_file]
    else:  # a single agent has nobody to talk to
        argv += ["--listen", f"127.0.0.1:{GOSSIP_PORT}", "--insecure"]
    for key, value in exp.agent_options(allocator).items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


def write_key(path: Path) -> None:
    """32 random bytes as 64 hex digits, readable by root only."""
    path.touch(mode=0o600)
    path.write_text(secrets.token_hex(32) + "\n")


@dataclass
class Agent:
    host: str
    socket: str
    proc: object
    log: Path
    samples: list[tuple[float, dict]] = field(default_factory=list)

    def status(self) -> dict:
        return request(self.socket, "status", timeout_s=2.0)["status"]


def start_agents(lab: Lab, allocator: str, logs: Path) -> list[Agent]:
    """Start every agent of the run and wait until each answers ``status``."""
    plan = lab.plan
    key = lab.state / "cluster.key"
    write_key(key)
    allocator = REFERENCE if plan.central else allocator
    agents = []
    for host in plan.agent_ifaces():
        sock = str(lab.state / f"{host}.sock")
        argv = agent_argv(plan, host, allocator, str(key), sock, program=drl_agent())
        log = logs / f"agent-{host}.log"
        agents.append(Agent(host, sock, lab.spawn(host, argv, log=log), log))
    deadline = time.monotonic() + READY_TIMEOUT_S
    for a in agents:
        while True:
            if a.proc.poll() is not None:
                tail = " / ".join(a.log.read_text(errors="replace").strip().splitlines()[-2:])
                raise LabError(f"drl-agent on {a.host} exited ({a.proc.returncode}): {tail or 'no output'}")
            try:
                a.status()
                break
            except ControlError:
                if time.monotonic() > deadline:
                    raise LabError(f"drl-agent on {a.host} did not answer on {a.socket} within {READY_TIMEOUT_S:g} s") from None
                time.sleep(0.2)
    return agents


class StatusPoller:
    """Samples every agent's status JSON every ``period_s`` on its own thread (a status reply
    waits for the agent's next tick, so one slow agent must not delay the others)."""

    def __init__(self, agents: list[Agent], t0: float, period_s: float = 0.5):
        self.agents, self.t0, self.period_s = agents, t0, period_s
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(a,), daemon=True) for a in agents]

    def __enter__(self) -> "StatusPoller":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join()

    def _loop(self, agent: Agent) -> None:
        while not self.stopping.wait(self.period_s):
            try:
                agent.samples.append((time.monotonic() - self.t0, agent.status()))
            except ControlError:
                pass  # a missed sample is a gap in the plot, not a failed run
