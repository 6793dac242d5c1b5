"""One ``drl-agent`` per limiter, inside its namespace, sharing a generated cluster key.

    argv = agent_argv(plan, "l1", "fps", key_file="/run/drl-lab/lb3fa2/key",
                      socket="/run/drl-lab/lb3fa2/l1.sock")
    agents = start_agents(lab, "fps", logs)   # waits until every agent answers on its socket
    agents[0].status()["local_limit_bps"]      # what `drlctl status --json` prints

The argv is pure (lab/vagrant.py builds the VMs' agents from the same
function, so the lab and the Vagrant twin run identical options).  Agents
gossip over the control network (lab/topology.py) and limit the egress of
their interface toward the sink.  In the CTB reference run one agent with
allocator ``ctb`` limits the link every flow crosses.

On a code topology (lab/topology.py's pair, star) kernel tests and
benchmarks start agents one at a time with a :class:`Cluster`: host ``h``'s
agent has node id ``h`` and listens on ``<its address>:7470``.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from drl.agent.config.schema import CLASS_ONLY, FIELDS
from drl.agent.service.control import ControlError, request
from drl.agent.units import to_bps

from .errors import LabError
from .netns import Host, Lab
from .spec import REFERENCE
from .topology import Plan

GOSSIP_PORT = 7470
READY_TIMEOUT_S = 90.0   # bcc compiles the BPF program at start: seconds per agent on a busy machine


def installed(program: str) -> str:
    """``program`` (drl-agent, drlctl) next to this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name(program)
    found = str(beside) if beside.exists() else shutil.which(program)
    if not found:
        raise LabError(f"{program} is not installed (pip install -e . in the project)")
    return found


def drl_agent() -> str:
    return installed("drl-agent")


def up_argv(program: str, *, iface: str, global_: str | None, allocator: str | None, node_id: str, socket: str,
            listen: str, peers: Sequence[str] = (), key_file: str | None = None, options: Sequence[str] = ()) -> list[str]:
    """``drl-agent up ...``, the one command line of every agent (lab, VMs, kernel tests);
    ``global_`` and ``allocator`` None leave them to a ``--config`` file in ``options``."""
    argv = [program, "up", "--iface", iface]
    argv += ["--global", global_] if global_ else []
    argv += ["--allocator", allocator] if allocator else []
    argv += ["--node-id", node_id, "--socket", socket, "--listen", listen]
    if peers:
        argv += ["--peers", ",".join(peers)]
    return argv + (["--key-file", key_file] if key_file else ["--insecure"]) + list(options)


def agent_argv(plan: Plan, host: str, allocator: str, key_file: str, socket: str,
               iface: str | None = None, program: str = "drl-agent", state_dir: str | None = None) -> list[str]:
    """``drl-agent up ...`` for ``host``; ``iface`` overrides the interface name (VMs name NICs their own way);
    ``state_dir`` keeps the agent's limits and allocator state apart from the host's own agent's."""
    exp = plan.exp
    if plan.ctl:
        # ID@HOST:PORT: gdrl, fillratio, dqmp and lease need to know every member's id
        peers = [f"{h}@{plan.ctl_address(h)}:{GOSSIP_PORT}" for h in plan.agent_ifaces() if h != host]
        listen, key = f"{plan.ctl_address(host)}:{GOSSIP_PORT}", key_file
    else:  # a single agent has nobody to talk to
        peers, listen, key = [], f"127.0.0.1:{GOSSIP_PORT}", None
    options = [arg for k, value in exp.agent_options(allocator).items() for arg in (f"--{k.replace('_', '-')}", value)]
    options += ["--state-dir", state_dir] if state_dir else []
    return up_argv(program, iface=iface or plan.agent_ifaces()[host].name, global_=f"{to_bps(exp.global_Bps):.0f}bit",
                   allocator=allocator, node_id=host, socket=socket, listen=listen, peers=peers, key_file=key,
                   options=options)


# what systemd/drl-agent.service passes itself: a file that set them too would say them twice
UNIT_FLAGS = ("--socket", "--state-dir")


def unit_config(argv: Sequence[str]) -> str:
    """``drl-agent up ...`` (``argv``) as the drl.toml of the shipped unit (docs/config.md):
    the class options and agent-wide ones in ``[agent]``, ``--global`` and ``--class`` in the
    one class the flags make, ``default``.  Values stay as written (every parser takes text)."""
    by_flag = {f.flag: f for f in FIELDS}
    agent, klass, args = [], [], list(argv[2:])
    while args:
        flag = args.pop(0)
        f = by_flag.get(flag)
        if f is None:
            raise ValueError(f"{flag!r} is not a drl-agent up option")
        value = "true" if f.is_flag else json.dumps(args.pop(0))
        if flag not in UNIT_FLAGS:
            (klass if f.scope == CLASS_ONLY else agent).append(f"{f.key} = {value}")
    return "\n".join(["[agent]", *agent, "", "[[class]]", 'name = "default"', *klass]) + "\n"


def write_key(path: Path) -> None:
    """32 random bytes as 64 hex digits, readable by root only."""
    path.touch(mode=0o600)
    path.write_text(secrets.token_hex(32) + "\n")


@dataclass
class Agent:
    host: str
    socket: str
    proc: subprocess.Popen
    log: Path
    samples: list[tuple[float, dict]] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)   # how it was started (a restart runs it again)

    def status(self) -> dict:
        """What ``drlctl status --json`` prints; ControlError when the agent does not answer."""
        return request(self.socket, "status", timeout_s=2.0)["status"]

    def wait_ready(self, deadline: float) -> None:
        """Until it answers ``status``; a LabError with its log's tail if it exits or ``deadline`` passes."""
        while True:
            if self.proc.poll() is not None:
                raise LabError(self._exited())
            try:
                self.status()
                return
            except ControlError:
                if time.monotonic() > deadline:
                    raise LabError(f"drl-agent on {self.host} did not answer on {self.socket} within {READY_TIMEOUT_S:g} s") from None
                time.sleep(0.2)

    def wait_for(self, predicate: Callable[[dict], bool], timeout_s: float) -> dict:
        """Poll status until predicate(status) holds or ``timeout_s`` passes; the last status either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if predicate(st) or time.monotonic() > deadline:
                return st
            time.sleep(0.2)

    def exit_note(self) -> str | None:
        """Why the agent exited on its own (a crash, a datapath error), with its log's tail;
        None while it runs, or once a signal ended it (a fault's kill)."""
        code = self.proc.poll()
        return None if code is None or code < 0 else self._exited()

    def _exited(self) -> str:
        try:
            tail = " / ".join(self.log.read_text(errors="replace").strip().splitlines()[-2:])
        except OSError:
            tail = ""
        return f"drl-agent on {self.host} exited ({self.proc.returncode}): {tail or 'no output'}"

    def kill(self, sig: int) -> int:
        """Send ``sig`` to the agent's session and wait for it to exit; its exit status."""
        os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout=10)


def start_agents(lab: Lab, allocator: str, logs: Path) -> list[Agent]:
    """Start every agent of the run and wait until each answers ``status``."""
    plan = lab.plan
    key = lab.state / "cluster.key"
    write_key(key)
    allocator = REFERENCE if plan.central else allocator
    agents = []
    for host in plan.agent_ifaces():
        sock = str(lab.state / f"{host}.sock")
        argv = agent_argv(plan, host, allocator, str(key), sock, program=drl_agent(),
                          state_dir=str(lab.state / f"{host}.state"))
        log = logs / f"agent-{host}.log"
        agents.append(Agent(host, sock, lab.spawn(host, argv, log=log), log, argv=argv))
    return ready(agents)


class Cluster:
    """Agents started on a code topology's hosts (kernel tests, benchmarks);
    sockets, logs and state files go to ``dir``, and the Lab stops the agents."""

    def __init__(self, lab: Lab, dir: Path, key_file: str | None = None):
        self.lab, self.dir, self.key_file = lab, dir, key_file

    def argv(self, host: Host, peers: Sequence[Host] = (), allocator: str | None = "fps",
             global_: str | None = "10mbit", *extra: str) -> list[str]:
        return up_argv(drl_agent(), iface="eth0", global_=global_, allocator=allocator, node_id=host.name,
                       socket=str(self.dir / f"{host.name}.sock"), listen=f"{host.addr4}:{GOSSIP_PORT}",
                       peers=[f"{p.name}@{p.addr4}:{GOSSIP_PORT}" for p in peers], key_file=self.key_file,
                       options=["--state-dir", str(self.dir), *extra])

    def spawn(self, host: Host, peers: Sequence[Host] = (), allocator: str | None = "fps",
              global_: str | None = "10mbit", *extra: str) -> Agent:
        """Start host's agent; it answers once bcc has compiled (``Agent.wait_ready``)."""
        log, argv = self.dir / f"{host.name}.log", self.argv(host, peers, allocator, global_, *extra)
        return Agent(host.name, str(self.dir / f"{host.name}.sock"), host.popen(*argv, log=log), log, argv=argv)

    def start(self, host: Host, peers: Sequence[Host] = (), allocator: str | None = "fps",
              global_: str | None = "10mbit", *extra: str) -> Agent:
        """Start host's agent and wait until it answers."""
        agent = self.spawn(host, peers, allocator, global_, *extra)
        agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
        return agent

    def start_mesh(self, hosts: Sequence[Host], allocator: str | None = "fps", global_: str | None = "10mbit",
                   *extra: str) -> list[Agent]:
        """An agent on each of ``hosts``, every other one its peer, started together."""
        return ready([self.spawn(h, [p for p in hosts if p is not h], allocator, global_, *extra) for h in hosts])

    def start_together(self, hosts: Sequence[Host], allocator: str | None = "fps", global_: str | None = "10mbit",
                       *extra: str) -> list[Agent]:
        """An agent on each of ``hosts`` with no peers given (they find each other by ``extra``'s
        --registry), started together."""
        return ready([self.spawn(h, (), allocator, global_, *extra) for h in hosts])


def ready(agents: list[Agent]) -> list[Agent]:
    """``agents`` once every one answers: all were started before any is waited for, so their BPF
    compiles overlap and each takes about as long as all of them (one deadline for all)."""
    deadline = time.monotonic() + READY_TIMEOUT_S * max(1.0, len(agents) / 8)
    for agent in agents:
        agent.wait_ready(deadline)
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
