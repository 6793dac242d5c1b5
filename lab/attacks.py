"""Play an experiment's [[attack]]s during a run: one small function a kind, each on a thread.

    with Attacks(lab, agents, logs, t0) as attacks:   # inside the Lab; stops every attacker on exit
        attacks.start(attack, now)                    # the runner calls it at attack.at_s
    attacks.records                                   # one dict per attack: what was done, its check

An attack runs from ``at_s`` for ``duration_s``; what it must leave true is its record's
``check`` ({"name", "value", "bound", "ok"}), judged by lab/results.py with the envelope.
The attacker holds the cluster key (the run's lab/agents.py key file) and speaks as a
peer from that peer's control address: a raw socket there writes the UDP header itself,
so the datagrams leave the peer's gossip port while the peer's agent keeps it bound.  A
forged datagram names the peer's incarnation + 1, which shouts the real peer down for at
most the liveness timeout (agent/gossip/lives.py): the price of being accepted at all.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import threading
import time
from pathlib import Path

from drl.agent.config.build import class_key
from drl.agent.gossip import drl_pb2
from drl.agent.gossip.core import CLUSTER
from drl.agent.gossip.keys import load_key
from drl.agent.gossip.wire import MAX_SUM_NODES, MAX_VALUE, Batch, Header, LimitNote, Message, SumKind, Sums, encode
from drl.agent.service.control import ControlError, request
from drl.agent.units import to_bps

from .agents import GOSSIP_PORT, Agent, installed
from .netns import Lab
from .spec import Attack

TOP_VERSION = 2**63 - 3      # the incident's version: the wire lets it through, the limit book must not
TBIT_Bps = 1.25e11
PERIOD_S = 0.1               # forged gossip: one datagram (set) an agent interval
CLIENT_NET = "10.128.0.0/14"   # the sprayed clients' addresses, routed out of the victim's data link
FOREIGN_PREF = 10
ROUNDS = 1                   # datagram a sprayed client: over its line (4/1s over 5 hosts); the machine sends ~40k/s

# argv[1]: destination; with argv[2] = period the hex datagrams of stdin, a line a period, else
# (argv[2] = "flood") random 100-byte payloads at up to argv[3] a second for argv[4] seconds,
# printing how many it sent and in how long.  The UDP header is written here (checksum 0: none,
# valid for IPv4), both ports the gossip port.
_RAW = f"""
import os, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
dst, port = sys.argv[1], {GOSSIP_PORT}
head = lambda n: struct.pack("!HHHH", port, port, 8 + n, 0)
if sys.argv[2] != "flood":
    start, period = time.monotonic(), float(sys.argv[2])
    for k, line in enumerate(sys.stdin.read().split()):
        time.sleep(max(0.0, start + k * period - time.monotonic()))
        d = bytes.fromhex(line)
        s.sendto(head(len(d)) + d, (dst, 0))
    sys.exit(0)
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
packets = [head(100) + os.urandom(100) for _ in range(256)]
start, sent = time.monotonic(), 0
while (now := time.monotonic()) - start < seconds:
    if sent > rate * (now - start):
        time.sleep(0.001)
        continue
    for p in packets:
        try:
            s.sendto(p, (dst, 0))
        except OSError:
            pass
    sent += len(packets)
print(sent, time.monotonic() - start)
"""

# argv[3] 36-byte UDP datagrams in a row to each of the first argv[2] addresses of argv[1].  A
# 64-MB send buffer: the class's queue drops what it cannot hold (after the program counted it),
# where the default buffer would hold the spray to the class's rate.
_SPRAY = """
import ipaddress, itertools, socket, sys
net, n, rounds = ipaddress.ip_network(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 1 << 26)   # SO_SNDBUFFORCE (root), not in the socket module
for a in itertools.islice(net.hosts(), n):
    for _ in range(rounds):
        try:
            s.sendto(b"x" * 36, (str(a), 9))
        except OSError:
            pass                 # a full socket buffer drops one: the count still goes on
"""


def signed(body: bytes, key: bytes) -> bytes:
    """A Datagram's bytes as the cluster key authenticates them (agent/gossip/wire.py): what a key
    holder sends when it writes a value past the encoder's clamp."""
    return body + hmac.new(key, body, hashlib.sha256).digest()


class Attacks:
    def __init__(self, lab: Lab, agents: list[Agent], logs: Path, t0: float):
        self.lab, self.plan, self.logs, self.t0 = lab, lab.plan, logs, t0
        self.agents = {a.host: a for a in agents}
        self.key = load_key(lab.state / "cluster.key")
        self.records: list[dict] = []
        self.threads: list[threading.Thread] = []
        self.stopping = threading.Event()

    def __enter__(self) -> "Attacks":
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join()

    def start(self, attack: Attack, now: float) -> dict:
        rec = {"at_s": attack.at_s, "kind": attack.kind, "label": attack.label, "agent": attack.agent,
               "started_at_s": round(now, 3)}
        self.records.append(rec)
        t = threading.Thread(target=self._run, args=(attack, rec), daemon=True)
        self.threads.append(t)
        t.start()
        return rec

    def _run(self, attack: Attack, rec: dict) -> None:
        try:
            KINDS[attack.kind](self, attack, rec)
        except (ControlError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        victim = self.agents[attack.agent]
        rec["agent_alive"] = victim.proc.poll() is None
        rec["stopped_at_s"] = round(self.now(), 3)

    # -- helpers -------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def end(self, attack: Attack) -> float:
        return attack.at_s + attack.duration_s

    def wait_until(self, t: float) -> bool:
        """Sleep until ``t`` (s since t0); False when the run ends first."""
        return not self.stopping.wait(max(0.0, t - self.now()))

    def peer_of(self, attack: Attack, avoid: tuple[str, ...] = ()) -> str:
        """The first limiter that is not the victim (nor in ``avoid``): whose address the attacker uses."""
        return next(h for h in self.plan.exp.limiters if h != attack.agent and h not in avoid)

    def incarnation(self, agent: Agent, node: str) -> int:
        return next(p["incarnation"] for p in agent.status()["peers"] if p["node_id"] == node)

    def header(self, speaker: str, to: str, seq: int, incarnation: int) -> Header:
        return Header(cluster=CLUSTER, node=speaker, dst=to, seq=seq, incarnation=incarnation, sent_at=0.0)

    def periods(self, attack: Attack) -> int:
        """How many PERIOD_S are left of the attack."""
        return max(1, round((self.end(attack) - self.now()) / PERIOD_S))

    def send_raw(self, sends: list[tuple[str, str, list[bytes]]]) -> None:
        """Each (speaker, to, datagrams) from speaker's control address, a datagram each PERIOD_S,
        side by side; returns when all are sent."""
        procs = [(subprocess.Popen(self.lab.host(speaker).argv("python3", "-c", _RAW, self.plan.ctl_address(to),
                                                               str(PERIOD_S)),
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
                  "".join(d.hex() + "\n" for d in datagrams)) for speaker, to, datagrams in sends]
        for proc, text in procs:
            _, err = proc.communicate(text, timeout=len(text) * PERIOD_S + 30)
            if proc.returncode:
                raise OSError(f"the raw sender failed: {err.strip()[-200:]}")

    def rejected(self, agent: Agent) -> dict[str, int]:
        return dict(agent.status()["gossip"]["rejected_by_reason"])


def check(rec: dict, name: str, value, bound, ok: bool) -> None:
    rec["check"] = {"name": name, "value": value, "bound": bound, "ok": bool(ok)}


# -- the kinds ----------------------------------------------------------------------------

def lying_summer(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """The victim's summer, from its address, says the others sum to 0 over 2^20 limiters; the
    victim must pass it over (its status ``passed_over``) within ``within_s``."""
    victim = ctx.agents[attack.agent]
    summer = (victim.status().get("sum_tree") or {}).get("summer")
    if summer in (None, attack.agent):
        raise ValueError(f"{attack.agent} has no summer but itself to lie to it (sum_tree {summer!r})")
    inc = ctx.incarnation(victim, summer) + 1
    lie = Sums(SumKind.TOTAL, MAX_SUM_NODES, ((class_key("default"), 0.0),))
    lies = [encode(Message(ctx.header(summer, attack.agent, k + 1, inc), lie), ctx.key)
            for k in range(ctx.periods(attack))]
    ctx.send_raw([(summer, attack.agent, lies)])
    rec.update(liar=summer, sent=len(lies))
    tree = victim.status().get("sum_tree") or {}
    rec["passed_over"] = tree.get("passed_over", [])
    check(rec, "liar_passed_over", summer in rec["passed_over"], True, summer in rec["passed_over"])


def huge_partial(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """A member that sums nothing sends PARTIALs of 1e300 (past the encoder's clamp, MACed),
    each followed by one of the most a limiter may publish (MAX_VALUE): every 1e300 must be
    refused at decode (``out_of_range``), and the others counted by nobody (its group's first
    member sums): the victim's remote weights stay below 1e6 (``most_remote_weights``)."""
    victim = ctx.agents[attack.agent]
    tree = victim.status().get("sum_tree") or {}
    speaker = ctx.peer_of(attack, avoid=(tree.get("summer"),))
    inc = ctx.incarnation(victim, speaker) + 1
    before = ctx.rejected(victim)

    def forged(k: int) -> bytes:
        msg = Message(ctx.header(speaker, attack.agent, 2 * k + 1, inc),
                      Sums(SumKind.PARTIAL, 1, ((class_key("default"), 1.0),)))
        dg = drl_pb2.Datagram.FromString(encode(msg, None))
        dg.sums.values[0] = 1e300
        return signed(dg.SerializeToString(), ctx.key)

    def most(k: int) -> bytes:
        return encode(Message(ctx.header(speaker, attack.agent, 2 * k + 2, inc),
                              Sums(SumKind.PARTIAL, 1, ((class_key("default"), MAX_VALUE),))), ctx.key)

    n = ctx.periods(attack) // 2
    ctx.send_raw([(speaker, attack.agent, [d for k in range(n) for d in (forged(k), most(k))])])
    weights = victim.status()["allocator_state"]["remote_weights"]   # at once: a sum is fresh for a few ticks
    time.sleep(PERIOD_S * 3)     # every datagram read within a tick
    refused = ctx.rejected(victim).get("out_of_range", 0) - before.get("out_of_range", 0)
    rec.update(speaker=speaker, sent=n, sent_most=n, most_remote_weights=weights)
    check(rec, "refused_out_of_range", refused, n, refused == n and weights < 1e6)


def forged_limit(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """Every agent hears, from a peer's address, a 1-Tbit/s limit at version 2^63 - 3: none may
    adopt it.  At the end the operator's ``drlctl set`` of the same global on the victim must
    reach every agent (one version, the global) within ``within_s``."""
    agents = list(ctx.agents.values())
    limiters = list(ctx.agents)
    note = LimitNote(class_key("default"), TOP_VERSION, TBIT_Bps)

    n, sends = ctx.periods(attack), []
    for i, to in enumerate(limiters):      # each hears it from the next limiter's address, as that limiter
        speaker = limiters[(i + 1) % len(limiters)]
        inc = ctx.incarnation(ctx.agents[to], speaker) + 1
        sends.append((speaker, to, [encode(Message(ctx.header(speaker, to, k + 1, inc), Batch((), (note,))), ctx.key)
                                    for k in range(n)]))
    ctx.send_raw(sends)
    rec["sent_per_agent"] = n
    adopted = [a.host for a in agents if a.status()["limit_version"] >= TOP_VERSION]
    rec["adopted_top_version"] = adopted
    if not ctx.wait_until(ctx.end(attack)):
        return
    glob = f"{to_bps(ctx.plan.exp.global_Bps):.0f}bit"
    victim = ctx.agents[attack.agent]
    t_set = time.monotonic()
    subprocess.run([installed("drlctl"), "--socket", victim.socket, "set", "default", "--global", glob],
                   check=True, capture_output=True, text=True, timeout=10)
    version = victim.status()["limit_version"]
    reached = None
    while not ctx.stopping.is_set() and time.monotonic() - t_set < attack.within_s:
        sts = [a.status() for a in agents]
        if all(s["limit_version"] == version and s["global_limit_bps"] == to_bps(ctx.plan.exp.global_Bps) for s in sts):
            reached = round(time.monotonic() - t_set, 3)
            break
        time.sleep(0.1)
    rec.update(set_version=version, set_reached_all_s=reached)
    check(rec, "set_reached_all_s", reached, attack.within_s, reached is not None and not adopted)


def clients(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """``clients`` addresses, ROUNDS datagrams each, out of the victim's data link (the router drops
    them): more clients than its tables hold, each over the line at once.  The agent must keep
    its filter attached and list clients (the spray reached its tables)."""
    victim = ctx.agents[attack.agent]
    iface = ctx.plan.agent_ifaces()[attack.agent]
    veth = next(v for v in ctx.plan.veths if iface in (v.a, v.b))
    via = veth.b.addr if veth.a is iface else veth.a.addr
    host = ctx.lab.host(attack.agent)
    host.run("ip", "route", "replace", CLIENT_NET, "via", via)
    t0 = time.monotonic()
    spray = host.popen("python3", "-c", _SPRAY, CLIENT_NET, str(attack.clients), str(ROUNDS), log=ctx.logs / "attack-spray.log")
    held, unanswered = 0, 0
    while spray.poll() is None and not ctx.stopping.is_set() and ctx.now() < ctx.end(attack) + attack.within_s:
        try:
            held = max(held, _clients(victim))
        except ControlError:
            unanswered += 1      # a tick busy with the flag table: the answer after the spray counts
        time.sleep(0.5)
    rec.update(spray_s=round(time.monotonic() - t0, 2), spray_done=spray.poll() == 0, most_listed=held,
               polls_unanswered=unanswered)
    ctx.wait_until(ctx.end(attack))
    dp = _answer(ctx, victim, attack.within_s)["datapath"]
    rec["datapath"] = dp["state"]
    errors = "datapath_error" in victim.log.read_text(errors="replace")
    check(rec, "attached_and_listing", dp["state"], "attached",
          dp["state"] == "attached" and held > 0 and rec["spray_done"] and not errors)


def _answer(ctx: Attacks, agent: Agent, within_s: float) -> dict:
    """Its status, once it answers (a tick still busy with the flag table may take seconds)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return agent.status()
        except ControlError:
            if time.monotonic() > deadline or ctx.stopping.is_set():
                raise


def _clients(agent: Agent) -> int:
    reply = request(agent.socket, "clients", limit=50)
    return sum(len(c["clients"]) for c in reply["classes"])


def foreign_filter(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """A u32 filter at pref 10 takes all of the victim's egress; drl's must be ahead of it
    again (status ``pref`` below it, ``ahead`` empty) within ``within_s``; deleted at the end."""
    victim = ctx.agents[attack.agent]
    dev = ctx.plan.agent_ifaces()[attack.agent].name
    host = ctx.lab.host(attack.agent)
    host.run("tc", "filter", "add", "dev", dev, "egress", "prio", str(FOREIGN_PREF), "protocol", "all",
             "u32", "match", "u32", "0", "0", "classid", "1:1")
    added, back = time.monotonic(), None
    while not ctx.stopping.is_set() and time.monotonic() - added < attack.within_s:
        dp = victim.status()["datapath"]
        if dp["pref"] < FOREIGN_PREF and not dp["ahead"] and dp["reasserted"] >= 1:
            back = round(time.monotonic() - added, 3)
            break
        time.sleep(0.1)
    rec["reasserted_s"] = back
    ctx.wait_until(ctx.end(attack))
    rec["foreign_kept"] = f"pref {FOREIGN_PREF} u32" in host.run("tc", "filter", "show", "dev", dev, "egress")
    host.run("tc", "filter", "del", "dev", dev, "egress", "prio", str(FOREIGN_PREF))
    check(rec, "reasserted_s", back, attack.within_s, back is not None and rec["foreign_kept"])


def flood(ctx: Attacks, attack: Attack, rec: dict) -> None:
    """Random datagrams at up to ``rate_pps`` from a peer's address to the victim's gossip
    port: the rate reached and the victim's CPU (its utime + stime) while it lasts; the victim
    must still hear every peer at the end (the flood crowds out no gossip)."""
    victim = ctx.agents[attack.agent]
    speaker = ctx.peer_of(attack)
    before, t = _cpu_s(victim.proc.pid), time.monotonic()
    out = subprocess.run(ctx.lab.host(speaker).argv("python3", "-c", _RAW, ctx.plan.ctl_address(attack.agent), "flood",
                                                    str(attack.rate_pps), str(attack.duration_s)),
                         check=True, capture_output=True, text=True, timeout=attack.duration_s + 10).stdout.split()
    cpu = (_cpu_s(victim.proc.pid) - before) / (time.monotonic() - t)
    sent, took = int(out[0]), float(out[1])
    rec.update(speaker=speaker, sent=sent, rate_pps=round(sent / took), victim_cpu=round(cpu, 3))
    lost = [p["node_id"] for p in victim.status()["peers"] if p["state"] != "alive"]
    rec["peers_not_alive"] = lost
    check(rec, "peers_alive", not lost, True, not lost)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


KINDS = {"lying_summer": lying_summer, "huge_partial": huge_partial, "forged_limit": forged_limit,
         "clients": clients, "foreign_filter": foreign_filter, "flood": flood}
