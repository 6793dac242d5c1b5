"""Apply an experiment's [[fault]]s during a run: signals to agents, nftables loss and partitions.

    with Faults(lab, agents, logs) as faults:     # inside the Lab; heals and resumes on exit
        faults.apply(fault, now)                  # the runner calls it at fault.at_s
    faults.records                                # one dict per fault: when, what, pids, skipped

Agents (lab/agents.py) run as ``ip netns exec <ns> drl-agent up ...``, which
execs, in a session of their own: ``kill``/``stop``/``cont`` send
SIGKILL/SIGSTOP/SIGCONT to that session, ``restart`` starts the same argv
again (without waiting: bcc compiles for seconds; the record gets the time it
answered ``status``).  ``kill-loop`` does kill and restart every ``every``
seconds for ``for`` seconds on a thread of its own (the record lists every pid).

``recreate`` deletes the agent's data interface toward the sink and makes it
again with lab/topology.py's commands for that link (both ends, addresses,
routes, RTO floor, shaping); the record has the new index and the time the
agent reported its filter on it.  ``replay`` needs a capture: every agent a
``replay`` names has its arriving gossip captured from the start of the run
(lab/replay.py); at the fault, once the agent answers, the datagrams captured
before its current life began (the last ``count``; all of the run so far when
it never restarted) are sent to it again from their senders' namespaces, and
the record has how many went out and how its ``rejected_by_reason`` counters
moved (``rejected``) in the second after.

Loss and partitions are nftables rules in tables named ``drl_<run>``, never
in the machine's own namespace:

* the control network (gossip) is the bridge ``<run>br`` in ``<run>-ctl``
  (lab/topology.py); a ``bridge drl_<run>`` table there drops in the
  bridge's forward hook, where every datagram between two agents passes, so
  loss is network loss (a sender never sees an error).  ``gossip`` loss
  matches UDP to or from port 7470 entering or leaving the ports of
  ``hosts`` (default: every agent), each packet tested once; a one-way loss
  (``direction``) only what leaves the bridge toward ``agent``'s port ("in")
  or enters it from there ("out"); a partition drops everything between the
  ports of different groups.  The bridge, not the agent's own namespace, so
  that a sender whose datagrams are lost sees no error from its send.
* ``data`` loss is an ``inet drl_<run>`` table in the namespaces at both
  ends of every data link of ``hosts`` (default: the limiters), dropping in
  prerouting what arrives on that link: each direction of each such link
  loses ``percent`` %.

Random loss is ``numgen random mod 100 < N drop``.  A later loss on the same
network replaces the earlier one; ``heal`` deletes the tables, and so does the
end of the run (the namespaces go anyway, with anything left in them).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from drl.agent.service.control import ControlError

from .agents import GOSSIP_PORT, READY_TIMEOUT_S, Agent
from .errors import LabError
from .netns import Lab
from .replay import Capture, send
from .spec import AGENT_ACTIONS, Fault

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}
REJECTS_SETTLE_S = 1.0   # a replay's datagrams are read within a tick or two (50 ms each in the lab)


def table_name(run: str) -> str:
    return f"drl_{run}"


def nft_argv(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, "nft", *args]


def _set(names: list[str]) -> str:
    return "{ " + ", ".join(f'"{n}"' for n in names) + " }"


def _drop(percent: int) -> str:
    return "counter drop" if percent >= 100 else f"numgen random mod 100 < {percent} counter drop"


def gossip_loss_rules(ports: list[str], percent: int, every_port: list[str]) -> list[str]:
    """Bridge rules: UDP to/from the gossip port entering or leaving ``ports``; disjoint, so
    each datagram is tested (and dropped with ``percent`` %) at most once."""
    gossip = [f"udp dport {GOSSIP_PORT}", f"udp sport {GOSSIP_PORT} udp dport != {GOSSIP_PORT}"]
    rules = [f"iifname {_set(ports)} {g} {_drop(percent)}" for g in gossip]
    if set(ports) != set(every_port):
        rules += [f"iifname != {_set(ports)} oifname {_set(ports)} {g} {_drop(percent)}" for g in gossip]
    return rules


def one_way_rules(port: str, direction: str, percent: int) -> list[str]:
    """Bridge rules: the gossip datagrams leaving the bridge through ``port`` (``in``: what the
    agent behind it receives) or entering from it (``out``: what it sends)."""
    where = f'oifname "{port}"' if direction == "in" else f'iifname "{port}"'
    return [f"{where} udp dport {GOSSIP_PORT} {_drop(percent)}",
            f"{where} udp sport {GOSSIP_PORT} udp dport != {GOSSIP_PORT} {_drop(percent)}"]


def partition_rules(groups: list[list[str]]) -> list[str]:
    """Bridge rules: nothing passes between the ports of two different groups."""
    return [f"iifname {_set(a)} oifname {_set(b)} counter drop"
            for i, a in enumerate(groups) for j, b in enumerate(groups) if i != j]


class Faults:
    def __init__(self, lab: Lab, agents: list[Agent], logs: Path, t0: float | None = None):
        self.lab, self.plan, self.logs = lab, lab.plan, logs
        self.agents = {a.host: a for a in agents}
        self.t0 = time.monotonic() if t0 is None else t0
        self.table = table_name(self.plan.run)
        self.tables: set[tuple[str, str]] = set()   # (namespace, family) holding our table
        self.stopped: set[str] = set()
        self.records: list[dict] = []
        self.restarts: dict[str, int] = {}
        self.active: dict[tuple[str, str, str], dict] = {}   # (ns, family, chain) -> the fault's record
        self.log = logs / "faults.log"
        self.born: dict[str, float] = {}           # host -> when (s since t0) its agent's current life began
        self.captures: dict[str, Capture] = {}
        self.threads: list[threading.Thread] = []
        self.stopping = threading.Event()

    def __enter__(self) -> "Faults":
        for host in sorted({f.agent for f in self.plan.exp.faults if f.action == "replay"}):
            ctl = next((v.a for v in self.plan.ctl if v.a.host == host), None)
            if host in self.agents and ctl is not None:
                self.captures[host] = Capture(self.plan.ns(host), ctl.name, ctl.addr, self.t0)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the actions -------------------------------------------------------------------
    def apply(self, fault: Fault, now: float) -> dict:
        """Apply one fault; its record (also in ``records``).  A fault that cannot apply to this
        run (an agent or control network the CTB reference does not have) is recorded as skipped."""
        rec = {"at_s": fault.at_s, "action": fault.action, "label": fault.label, "applied_at_s": round(now, 3)}
        if fault.action in AGENT_ACTIONS:
            agent = self._agent_of(fault, rec)
            if agent is None:
                pass
            elif fault.action == "recreate":
                self._recreate(agent, rec)
            elif fault.action == "replay":
                self._start(self._replay, agent, fault, rec)
            elif fault.action == "kill-loop":
                self._start(self._kill_loop, agent, fault, rec, now)
            else:
                self._agent(fault, agent, rec)
        elif fault.action == "loss" and fault.on == "data":
            self._data_loss(fault, rec)
        elif fault.action in ("loss", "partition"):
            self._control(fault, rec)
        else:
            self.heal()
        self.records.append(rec)
        self._note(f"t={now:.2f}s {fault.label}: " + (f"skipped ({rec['skipped']})" if "skipped" in rec else "applied"))
        if self.tables:
            self._note(self.ruleset())
        return rec

    def _agent_of(self, fault: Fault, rec: dict) -> Agent | None:
        agent = self.agents.get(fault.agent)
        rec["agent"] = fault.agent
        if agent is None:
            rec["skipped"] = f"no agent on {fault.agent} in this run"
            return None
        if fault.action == "replay" and fault.agent not in self.captures:
            rec["skipped"] = "this run has no control network to capture on"
            return None
        rec["pid"] = agent.proc.pid
        return agent

    def _start(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(t)
        t.start()

    def _respawn(self, agent: Agent) -> subprocess.Popen:
        """The same argv again, logging to a file of its own."""
        n = self.restarts[agent.host] = self.restarts.get(agent.host, 0) + 1
        agent.log = self.logs / f"agent-{agent.host}.restart{n}.log"
        self.born[agent.host] = time.monotonic() - self.t0
        agent.proc = self.lab.spawn(agent.host, agent.argv, log=agent.log)
        return agent.proc

    def _agent(self, fault: Fault, agent: Agent, rec: dict) -> None:
        if fault.action == "restart":
            rec["pid"] = self._respawn(agent).pid
            threading.Thread(target=self._when_ready, args=(agent, agent.proc, rec), daemon=True).start()
            return
        if agent.proc.poll() is not None:
            rec["skipped"] = f"the agent on {fault.agent} had already exited ({agent.proc.returncode})"
            return
        try:
            os.killpg(agent.proc.pid, SIGNALS[fault.action])
        except ProcessLookupError:
            rec["skipped"] = f"the agent on {fault.agent} is gone"
            return
        if fault.action == "kill":
            self.stopped.discard(agent.host)
            try:
                rec["exit_status"] = agent.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                raise LabError(f"the agent on {agent.host} (pid {agent.proc.pid}) survived SIGKILL") from None
        elif fault.action == "stop":
            self.stopped.add(agent.host)
        else:
            self.stopped.discard(agent.host)

    def _when_ready(self, agent: Agent, proc: subprocess.Popen, rec: dict) -> None:
        try:
            agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
            if agent.proc is proc:
                rec["ready_at_s"] = round(time.monotonic() - self.t0, 3)
        except LabError as e:
            rec["error"] = str(e)

    def _recreate(self, agent: Agent, rec: dict) -> None:
        """Delete the agent's data interface and make it again; a thread notes when the agent
        reports its filter on the new one (``reattached_at_s``)."""
        iface = self.plan.agent_ifaces()[agent.host]
        veth = next(v for v in self.plan.veths if iface in (v.a, v.b))
        started = time.monotonic()
        self.lab.apply(self.plan.recreate_commands(veth))
        rec.update(iface=iface.name, took_s=round(time.monotonic() - started, 3))
        res = subprocess.run(["ip", "-n", self.plan.ns(agent.host), "-j", "link", "show", "dev", iface.name],
                             capture_output=True, text=True)
        try:
            rec["ifindex"] = json.loads(res.stdout)[0]["ifindex"]
        except (ValueError, LookupError):
            raise LabError(f"{iface.name} did not come back in {self.plan.ns(agent.host)}") from None
        self._start(self._when_attached, agent, rec)

    def _when_attached(self, agent: Agent, rec: dict) -> None:
        deadline = time.monotonic() + 10.0
        while not self.stopping.wait(0.05) and time.monotonic() < deadline:
            try:
                dp = agent.status()["datapath"]
            except ControlError:
                continue
            if dp.get("ifindex") == rec["ifindex"] and dp.get("state") == "attached":
                rec["reattached_at_s"] = round(time.monotonic() - self.t0, 3)
                return
        rec["error"] = f"the agent did not report its filter on {rec['iface']} (index {rec['ifindex']})"

    def _until_ready(self, agent: Agent) -> bool:
        """Wait until the agent answers ``status`` (True), or the run ends (False): the threads
        that wait are joined at the end of the run, which must not wait for a slow start."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.stopping.is_set():
            if agent.proc.poll() is not None:
                raise LabError(agent.exit_note() or f"the agent on {agent.host} was killed")
            try:
                agent.status()
                return True
            except ControlError:
                if time.monotonic() > deadline:
                    raise LabError(f"the agent on {agent.host} did not answer within {READY_TIMEOUT_S:g} s") from None
                self.stopping.wait(0.2)
        return False

    def _rejected(self, agent: Agent) -> dict[str, int]:
        return dict(agent.status()["gossip"]["rejected_by_reason"])

    def _replay(self, agent: Agent, fault: Fault, rec: dict) -> None:
        """Once the agent answers: send what was captured before its life began, then count what
        it rejected."""
        try:
            if not self._until_ready(agent):
                rec["error"] = "the run ended before the agent answered"
                return
            born = self.born.get(agent.host)
            now = time.monotonic() - self.t0
            packets = self.captures[agent.host].before(now if born is None else born, fault.count)
            rec.update(sent_at_s=round(now, 3), captured=len(packets),
                       captured_from_life="earlier" if born is not None else "current")
            before = self._rejected(agent)
            senders = {v.a.addr: self.plan.ns(v.a.host) for v in self.plan.ctl}
            by_source = send(packets, senders)
            rec.update(sent=sum(by_source.values()), sent_by_source=by_source)
            self.stopping.wait(REJECTS_SETTLE_S)
            after = self._rejected(agent)
            rec["rejected"] = {r: n - before.get(r, 0) for r, n in after.items() if n != before.get(r, 0)}
        except (LabError, ControlError) as e:
            rec["error"] = str(e)

    def _kill_loop(self, agent: Agent, fault: Fault, rec: dict, now: float) -> None:
        """SIGKILL and start again at now, now + every, ... while within ``for``; the last one is
        left running (``ready_at_s``: when it answered)."""
        rec.update(kills=0, pids=[])
        k = 0
        while k * fault.every_s < fault.for_s - 1e-9:
            if self.stopping.wait(max(0.0, self.t0 + now + k * fault.every_s - time.monotonic())):
                return
            proc = agent.proc
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rec["error"] = f"the agent on {agent.host} (pid {proc.pid}) survived SIGKILL"
                return
            rec["kills"] += 1
            rec["pids"].append(self._respawn(agent).pid)
            k += 1
        try:
            if self._until_ready(agent):
                rec["ready_at_s"] = round(time.monotonic() - self.t0, 3)
        except LabError as e:
            rec["error"] = str(e)

    def _control(self, fault: Fault, rec: dict) -> None:
        if not self.plan.ctl:
            rec["skipped"] = "this run has no control network"
            return
        ns = self.plan.ns("ctl")
        ports = {v.a.host: v.b.name for v in self.plan.ctl}
        self._ensure(ns, "bridge", {"gossip_loss": "forward", "partition": "forward"})
        if fault.action == "loss" and fault.direction:
            rules = one_way_rules(ports[fault.agent], fault.direction, fault.percent)
            self._replace(ns, "bridge", "gossip_loss", rules, rec)
        elif fault.action == "loss":
            hosts = list(fault.hosts) or list(ports)
            rules = gossip_loss_rules([ports[h] for h in hosts], fault.percent, list(ports.values()))
            self._replace(ns, "bridge", "gossip_loss", rules, rec)
        else:
            rules = partition_rules([[ports[h] for h in g] for g in fault.groups])
            self._replace(ns, "bridge", "partition", rules, rec)
        rec["rules"] = rules

    def _data_loss(self, fault: Fault, rec: dict) -> None:
        hosts = list(fault.hosts) or self.plan.exp.limiters
        ingress: dict[str, list[str]] = {}
        for v in self.plan.veths:
            if v.a.host in hosts or v.b.host in hosts:
                for end in (v.a, v.b):
                    ingress.setdefault(end.host, []).append(end.name)
        rec["rules"] = {}
        # a new data loss replaces the old: every namespace that had one is emptied
        for ns, family in sorted(self.tables):
            if family == "inet":
                self._replace(ns, "inet", "data_loss", [], rec)
        for host, names in ingress.items():
            ns = self.plan.ns(host)
            self._ensure(ns, "inet", {"data_loss": "prerouting"})
            rule = f"iifname {_set(sorted(set(names)))} {_drop(fault.percent)}"
            self._replace(ns, "inet", "data_loss", [rule], rec)
            rec["rules"][host] = [rule]

    # -- nftables ------------------------------------------------------------------------
    def _ensure(self, ns: str, family: str, chains: dict[str, str]) -> None:
        if (ns, family) in self.tables:
            return
        body = "".join(f"  chain {c} {{ type filter hook {hook} priority 0; policy accept; }}\n"
                       for c, hook in chains.items())
        script = f"table {family} {self.table} {{\n{body}}}\n"
        res = subprocess.run(nft_argv(ns, "-f", "-"), input=script, capture_output=True, text=True)
        if res.returncode:
            raise LabError(f"nft in {ns} refused the table {family} {self.table}: {res.stderr.strip()}")
        self.tables.add((ns, family))

    def _replace(self, ns: str, family: str, chain: str, rules: list[str], rec: dict) -> None:
        self._count(ns, family, chain)
        self.active[(ns, family, chain)] = rec
        script = f"flush chain {family} {self.table} {chain}\n" + "".join(
            f"add rule {family} {self.table} {chain} {r}\n" for r in rules)
        res = subprocess.run(nft_argv(ns, "-f", "-"), input=script, capture_output=True, text=True)
        if res.returncode:
            raise LabError(f"nft in {ns} refused a rule: {res.stderr.strip()}")

    def ruleset(self) -> str:
        """Our tables as nft lists them, namespace by namespace (for the faults log)."""
        out = []
        for ns, family in sorted(self.tables):
            res = subprocess.run(nft_argv(ns, "list", "table", family, self.table), capture_output=True, text=True)
            out.append(f"# {ns}\n{res.stdout.strip() or res.stderr.strip()}")
        return "\n".join(out)

    def _count(self, ns: str, family: str, chain: str) -> None:
        """Add what ``chain``'s rules dropped so far to the record of the fault that put them there
        (``dropped_packets``: the evidence that a loss or partition took effect)."""
        rec = self.active.pop((ns, family, chain), None)
        if rec is None:
            return
        res = subprocess.run(nft_argv(ns, "-j", "list", "chain", family, self.table, chain), capture_output=True, text=True)
        try:
            items = json.loads(res.stdout)["nftables"]
        except (ValueError, KeyError):
            return
        packets = sum(e["counter"]["packets"] for item in items for e in item.get("rule", {}).get("expr", [])
                      if isinstance(e, dict) and "counter" in e)
        rec["dropped_packets"] = rec.get("dropped_packets", 0) + packets

    def heal(self) -> None:
        """Delete every table this run added (loss and partitions end)."""
        for key in list(self.active):
            self._count(*key)
        for ns, family in sorted(self.tables):
            subprocess.run(nft_argv(ns, "delete", "table", family, self.table), capture_output=True)
        self.tables.clear()

    def close(self) -> None:
        """End of the run: loops and replays end, captures close, stopped agents resume (so
        SIGTERM can detach them), tables go."""
        self.stopping.set()
        for t in self.threads:
            t.join()
        for cap in self.captures.values():
            cap.close()
        for host in sorted(self.stopped):
            proc = self.agents[host].proc
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.stopped.clear()
        self.heal()

    def _note(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(line.rstrip() + "\n")
