"""Names, addresses, routes and the commands that build a network of namespaces (pure).

One :class:`Topology` describes hosts (one namespace each), the veths between
them, bridges and routes; ``build_commands()`` is the one code path that
turns any of them into ``ip``/``tc`` commands, and lab/netns.py's ``Lab``
runs them.  Topologies come from an experiment file (``plan``) or from code
(``pair``, ``star``, as mininet's ``Topo`` subclasses do):

    >>> from drl.lab.reader import load
    >>> from drl.lab.topology import plan, star
    >>> p = plan(load("lab/experiments/baseline.toml"), run="lb00aa")
    >>> p.ns("l1"), p.agent_ifaces()["l1"].name, p.address("sink")
    ('lb00aa-l1', 'lb00aal1-0', '10.1.2.2')
    >>> s = star(3, run="dp0a1b")
    >>> s.ns("h3"), s.address("h3"), s.address6("h3")
    ('dp0a1b-h3', '10.0.0.3', 'fd00::3')

Naming is an API (docs/lab.md; the kernel tests rely on it too):

* run prefix: a short word + 4 hex digits, new for every run (``new_run``):
  ``lb3fa2`` for experiments, e.g. ``dp3fa2`` for a kernel test; every name
  below starts with it, so ``drl-lab clean`` can find a crashed run's leftovers.
* namespace of host ``h``: ``<run>-<h>``.

Experiments (``plan``):

* control network namespace: ``<run>-ctl``.
* data interface: ``<run><h>-<k>`` for host ``h``'s k-th link in file order
  (``lb3fa2l1-0``); veths are created directly inside the namespaces.
* link ``i`` (file order) is ``10.1.i.0/24``: its first end ``.1``, second ``.2``.
* control network (gossip, so the limiters never police it): limiter ``j``
  has ``<run><h>-c`` = ``10.254.0.(j+1)/24``, on bridge ``<run>br`` in
  ``<run>-ctl`` through port ``<run><h>-b``.

The CTB reference (``central=True``) builds the same network but puts ONE
bucket where all flows meet: the egress of the sink's only neighbour toward
the sink ([Raghavan07] §5.1, "a centralized token-bucket limiter
servicing all 10 flows").

Code topologies (``pair``, ``star``; kernel tests and benchmarks):

* host i (1-based) is ``h<i>``, with one interface ``eth0``, addresses
  ``10.0.0.<i>/24`` and ``fd00::<i>/64``.
* ``pair()``: ``h1:eth0 <-> h2:eth0`` is one veth pair.  ``star(n)``: every
  ``h<i>:eth0`` is paired with port ``h<i>`` of bridge ``br0`` in namespace
  ``<run>-sw``.  Interface names live only inside the namespaces, so they
  never clash with the host's.
* they keep the veth's offloads (the datapath benchmarks measure them);
  experiments segment in the stack.
* ``delay``/``jitter``/``loss`` (``"20ms"``, ``"1%"``, as in an experiment
  file) impair every data link: ``pair``'s one, each of ``star``'s.
* ``rto_min`` (e.g. ``WAN_RTO_MIN``), when given, is set on every subnet
  route: TCP's minimum retransmission timeout.  Linux's default, 200 ms, is
  a few RTTs on a WAN but 4,000 of a veth's 50 us, and TCP flows sharing one
  token bucket then take turns by timeouts instead of sharing it (docs/datapath.md
  "TCP on veth"); tests of how agents divide a limit among TCP flows use
  ``WAN_RTO_MIN``.

Delay, jitter and loss (a link's ``delay``/``jitter``/``loss``, per direction):
with ``netem=True`` they are a netem qdisc on both ends; otherwise (this
project's CI kernel has no sch_netem) link ``i`` is built as two veths
through a relay namespace ``<run>-dl-<i>`` whose ports ``<run>dl<i>a`` (toward
the first end) and ``<run>dl<i>b`` carry lab/delay.py's relay process (the Lab
starts it).  The ends keep their names and addresses; their checksum and
segmentation offloads are off, since the relay forwards frames as read.
``netem=None`` (the default) lets the Lab choose: netem where the kernel has it.
"""
from __future__ import annotations

import ipaddress
import re
import secrets
import sys
from dataclasses import dataclass

from .errors import LabError
from .spec import Experiment, Link

PREFIX = "lb"
RUN = re.compile(rf"{PREFIX}[0-9a-f]{{4}}")
ANY_RUN = re.compile(r"[a-z]{2}[0-9a-f]{4}")   # tests' and benches' runs too (new_run's prefix)
CTL_NET = "10.254.0"
MTU_FRAME = 1514
IFNAMSIZ = 15
WAN_RTO_MIN = "10ms"  # TCP's RTO floor for tests of TCP flows sharing a limit: 200 veth RTTs
NO_OFFLOADS = ["tx", "off", "tso", "off", "gso", "off", "gro", "off"]   # ends and ports of a delay line


def new_run(prefix: str = PREFIX) -> str:
    """prefix (two letters) + 4 random hex digits: the unique name prefix of one run."""
    run = prefix + secrets.token_hex(2)
    if not ANY_RUN.fullmatch(run):
        raise ValueError(f"a run prefix is two letters a-z, not {prefix!r}")
    return run


@dataclass(frozen=True)
class Iface:
    host: str
    name: str
    addr: str | None             # IPv4 in a /24, without the length; None on bridge ports
    addr6: str | None = None     # IPv6 in a /64, without the length
    bridge: str | None = None    # on a bridge port: the bridge (in the same namespace) it joins


@dataclass(frozen=True)
class Veth:
    a: Iface
    b: Iface
    link: Link | None = None  # its shaping; None: a plain veth


@dataclass(frozen=True)
class Route:
    host: str
    dst: str   # a /24
    via: str


@dataclass(frozen=True)
class Bridge:
    host: str
    name: str


@dataclass(frozen=True)
class DelayLine:
    """Link ``index``'s delay line: a relay namespace between its two ends (lab/delay.py)."""
    index: int
    veth: Veth
    host: str                   # ``dl-<i>`` (a dash: never an experiment's host name)
    ports: tuple[str, str]      # the relay's interfaces toward veth.a and veth.b

    def argv(self, stats: str, python: str = sys.executable) -> list[str]:
        """The relay's command line; it writes its drops and CPU time to ``stats``."""
        link = self.veth.link
        cmd = [python, "-m", "drl.lab.delay", "--ports", *self.ports, "--names", self.veth.a.host,
               self.veth.b.host, "--stats", stats]
        for flag, value in (("--delay", link.delay_s), ("--jitter", link.jitter_s)):
            if value:
                cmd += [flag, f"{value * 1e3:g}ms"]
        return cmd + (["--loss", f"{link.loss_pct:g}%"] if link.loss_pct else [])


@dataclass(frozen=True, kw_only=True)
class Topology:
    """What a Lab builds.  ``veths`` carry the data (they get the RTO floor and shaping);
    ``ctl`` veths are a control network (the agents' gossip), built alike but left alone."""
    run: str
    hosts: tuple[str, ...]              # every namespace, by host name
    veths: tuple[Veth, ...]
    ctl: tuple[Veth, ...] = ()
    bridges: tuple[Bridge, ...] = ()
    routes: tuple[Route, ...] = ()
    forwarding: tuple[str, ...] = ()    # hosts that route between their links
    rto_min: str | None = None          # TCP's RTO floor on every data route, ip-route's syntax
    offload: bool = True                # False: segment in the stack (ethtool -K ... off)
    netem: bool | None = None           # delay/loss by netem (True) or the delay line; None: the Lab asks the kernel

    def ns(self, host: str) -> str:
        return f"{self.run}-{host}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(h) for h in self.hosts] + [self.ns(d.host) for d in self.delay_lines()]

    def delay_lines(self) -> list[DelayLine]:
        """The links that get the project's delay line (none when netem impairs them)."""
        if self.netem:
            return []
        return [DelayLine(i, v, f"dl-{i}", (f"{self.run}dl{i}a", f"{self.run}dl{i}b"))
                for i, v in enumerate(self.veths) if v.link and v.link.impaired]

    def iface(self, host: str, peer: str) -> Iface:
        """``host``'s interface on its link to ``peer``."""
        for v in self.veths:
            if (v.a.host, v.b.host) == (host, peer):
                return v.a
            if (v.b.host, v.a.host) == (host, peer):
                return v.b
        raise KeyError(f"no link {host}-{peer}")

    def address(self, host: str) -> str | None:
        """The address traffic is sent to: the host's first data interface's (None: it has none)."""
        return next((i.addr for v in self.veths for i in (v.a, v.b) if i.host == host and i.addr), None)

    def address6(self, host: str) -> str | None:
        return next((i.addr6 for v in self.veths for i in (v.a, v.b) if i.host == host and i.addr6), None)

    # -- commands ------------------------------------------------------------------
    def build_commands(self) -> list[list[str]]:
        """Every command that builds the network, in order (lab/netns.py runs them)."""
        cmds = [["ip", "netns", "add", ns] for ns in self.namespaces]
        cmds += [["ip", "-n", ns, "link", "set", "lo", "up"] for ns in self.namespaces]
        for br in self.bridges:
            cmds += [["ip", "-n", self.ns(br.host), "link", "add", br.name, "type", "bridge"],
                     ["ip", "-n", self.ns(br.host), "link", "set", br.name, "up"]]
        lines = {d.veth: d for d in self.delay_lines()}
        for d in lines.values():   # the relay's namespace sends nothing of its own (no IPv6 ND/MLD)
            cmds.append(["ip", "netns", "exec", self.ns(d.host), "sysctl", "-qw",
                         "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        for v in self.veths + self.ctl:
            if v in lines:
                cmds += self._delay_line_commands(lines[v])
                continue
            cmds += self._pair_commands(v)
        cmds += [["ip", "netns", "exec", self.ns(h), "sysctl", "-qw", "net.ipv4.ip_forward=1"] for h in self.forwarding]
        cmds += [["ip", "-n", self.ns(r.host), "route", "add", r.dst, "via", r.via, *self.route_options()]
                 for r in self.routes]
        if self.rto_min:   # the connected subnets' routes too
            cmds += [cmd for v in self.veths for end in (v.a, v.b) for cmd in self._subnet_routes(end)]
        for v in self.veths:
            if v.link and (v.link.rate_Bps or v.link.impaired):
                cmds += self.shaping_commands(v.link, v.link.rate_Bps)
        return cmds

    def _pair_commands(self, v: Veth) -> list[list[str]]:
        return [["ip", "link", "add", v.a.name, "netns", self.ns(v.a.host),
                 "type", "veth", "peer", "name", v.b.name, "netns", self.ns(v.b.host)],
                *self._end_commands(v.a), *self._end_commands(v.b)]

    def recreate_commands(self, v: Veth) -> list[list[str]]:
        """Delete data link ``v`` (both ends go with either) and make it again as build_commands
        did: the pair, both ends' addresses and settings, the routes through it, its RTO floor
        and its file's shaping (a link event's rate is not kept).  A delay-lined link is refused:
        its relay would need starting again too."""
        if v not in self.veths:
            raise LabError(f"{v.a.name} is not a data link")
        if any(d.veth == v for d in self.delay_lines()):
            raise LabError(f"link {v.a.host}-{v.b.host} has a delay line: it cannot be made again")
        ends = {v.a.host: v.b.addr, v.b.host: v.a.addr}
        cmds = [["ip", "-n", self.ns(v.a.host), "link", "del", v.a.name], *self._pair_commands(v)]
        cmds += [["ip", "-n", self.ns(r.host), "route", "add", r.dst, "via", r.via, *self.route_options()]
                 for r in self.routes if ends.get(r.host) == r.via]
        if self.rto_min:
            cmds += self._subnet_routes(v.a) + self._subnet_routes(v.b)
        if v.link and (v.link.rate_Bps or v.link.impaired):
            cmds += self.shaping_commands(v.link, v.link.rate_Bps)
        return cmds

    def _delay_line_commands(self, d: DelayLine) -> list[list[str]]:
        """``a <-> port a | relay | port b <-> b``: each end is paired with a port of the relay's namespace."""
        relay, cmds = self.ns(d.host), []
        for end, port in zip((d.veth.a, d.veth.b), d.ports):
            cmds.append(["ip", "link", "add", end.name, "netns", self.ns(end.host),
                         "type", "veth", "peer", "name", port, "netns", relay])
            cmds += self._end_commands(end, relayed=True)
        for port in d.ports:
            cmds += [["ip", "netns", "exec", relay, "ethtool", "-K", port, *NO_OFFLOADS],
                     ["ip", "-n", relay, "link", "set", port, "up"]]
        return cmds

    def _end_commands(self, end: Iface, relayed: bool = False) -> list[list[str]]:
        ns = self.ns(end.host)
        cmds = []
        if end.addr:
            cmds.append(["ip", "-n", ns, "addr", "add", f"{end.addr}/24", "dev", end.name])
        if end.addr6:
            cmds.append(["ip", "-n", ns, "addr", "add", f"{end.addr6}/64", "dev", end.name, "nodad"])
        if end.bridge:
            cmds.append(["ip", "-n", ns, "link", "set", end.name, "master", end.bridge])
        if relayed:
            # The relay reads frames as the veth hands them: no partial checksums, no 64 KB GSO skbs.
            cmds.append(["ip", "netns", "exec", ns, "ethtool", "-K", end.name, *NO_OFFLOADS])
        elif not self.offload:
            # Segment in the stack, not in the veth: the limiter then polices MTU-sized
            # packets as the paper's limiters did, not 64 KB GSO bursts.
            cmds.append(["ip", "netns", "exec", ns, "ethtool", "-K", end.name, "tso", "off", "gso", "off", "gro", "off"])
        return cmds + [["ip", "-n", ns, "link", "set", end.name, "up"]]

    def _subnet_routes(self, end: Iface) -> list[list[str]]:
        """The kernel's routes to ``end``'s own subnets, replaced with the route options."""
        ns, cmds = self.ns(end.host), []
        if end.addr:
            net = ipaddress.ip_interface(f"{end.addr}/24").network
            cmds.append(["ip", "-n", ns, "route", "replace", str(net), "dev", end.name, *self.route_options()])
        if end.addr6:   # metric 256: the kernel's own route for the prefix, which replace must hit
            net6 = ipaddress.ip_interface(f"{end.addr6}/64").network
            cmds.append(["ip", "-n", ns, "-6", "route", "replace", str(net6), "dev", end.name, "metric", "256",
                         *self.route_options()])
        return cmds

    def route_options(self) -> list[str]:
        """Per-route options every data route gets."""
        return ["rto_min", self.rto_min] if self.rto_min else []

    def shaping_commands(self, link: Link, rate_Bps: float | None) -> list[list[str]]:
        """Shape both directions of ``link``: TBF for a rate, netem when it has delay or loss and
        the topology uses netem (else the delay line impairs it, and only a rate is a qdisc)."""
        if link.impaired and self.netem:
            delay = [f"{(link.delay_s or 0) * 1e3:g}ms"] + ([f"{link.jitter_s * 1e3:g}ms"] if link.jitter_s else [])
            qdisc = ["netem"] + (["delay", *delay] if link.delay_s or link.jitter_s else []) \
                + (["loss", f"{link.loss_pct:g}%"] if link.loss_pct else []) \
                + (["rate", f"{int(rate_Bps * 8)}bit"] if rate_Bps else [])
        elif not rate_Bps:
            return []
        else:
            # burst: 10 ms of traffic, at least 4 frames (TBF needs >= rate/HZ and >= one MTU)
            burst = max(4 * MTU_FRAME, int(rate_Bps / 100))
            qdisc = ["tbf", "rate", f"{int(rate_Bps * 8)}bit", "burst", str(burst), "latency", "50ms"]
        return [["tc", "-n", self.ns(end), "qdisc", "replace", "dev", self.iface(end, peer).name, "root", *qdisc]
                for end, peer in (link.ends, link.ends[::-1])]


# -- topologies from code -----------------------------------------------------------

def pair(run: str, rto_min: str | None = None, delay: str | None = None, jitter: str | None = None,
         loss: str | None = None, netem: bool | None = None) -> Topology:
    """``h1:eth0 <-> h2:eth0``, one veth pair (``delay="20ms"``: 40 ms more RTT)."""
    return Topology(run=run, hosts=("h1", "h2"),
                    veths=(Veth(_station(1), _station(2), impairment("h1", "h2", delay, jitter, loss)),),
                    rto_min=rto_min, netem=netem)


def star(n: int, run: str, rto_min: str | None = None, delay: str | None = None, jitter: str | None = None,
         loss: str | None = None, netem: bool | None = None) -> Topology:
    """``h1`` .. ``h<n>``, each ``eth0`` on port ``h<i>`` of bridge ``br0`` in namespace ``sw``
    (``delay`` on each host's link: two of them between two hosts)."""
    ports = tuple(Veth(_station(i), Iface("sw", f"h{i}", None, bridge="br0"),
                       impairment(f"h{i}", "sw", delay, jitter, loss)) for i in range(1, n + 1))
    return Topology(run=run, hosts=tuple(f"h{i}" for i in range(1, n + 1)) + ("sw",), veths=ports,
                    bridges=(Bridge("sw", "br0"),), rto_min=rto_min, netem=netem)


def impairment(a: str, b: str, delay: str | None, jitter: str | None, loss: str | None) -> Link | None:
    """A code topology's link ``a - b`` with the experiment file's ``delay``/``jitter``/``loss`` words
    (None when it asks for none of them)."""
    if not (delay or jitter or loss):
        return None
    from .reader import link_impairment   # the file's rules and messages, once
    return Link(a, b, **link_impairment(delay, jitter, loss, lambda key, msg: LabError(f"{key}: {msg}")))


def _station(i: int) -> Iface:
    return Iface(f"h{i}", "eth0", f"10.0.0.{i}", f"fd00::{i}")


# -- topologies from experiment files ------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Plan(Topology):
    """An experiment's network: its hosts and links, and a control network for the agents."""
    exp: Experiment
    central: bool

    @property
    def bridge(self) -> str:
        return f"{self.run}br"

    def agent_ifaces(self) -> dict[str, Iface]:
        """Where agents run: host -> the interface whose egress they limit (toward the sink)."""
        exp = self.exp
        if self.central:
            hub = exp.neighbours(exp.sink)[0]
            return {hub: self.iface(hub, exp.sink)}
        return {h: self.iface(h, exp.route(h, exp.sink)[1]) for h in exp.limiters}

    def ctl_address(self, host: str) -> str:
        return next(v.a.addr for v in self.ctl if v.a.host == host)


def plan(exp: Experiment, run: str | None = None, central: bool = False) -> Plan:
    run = run or new_run()
    counters: dict[str, int] = {}

    def iface(host: str, addr: str) -> Iface:
        k = counters.get(host, 0)
        counters[host] = k + 1
        name = f"{run}{host}-{k}"
        if len(name) > IFNAMSIZ:
            raise LabError(f"interface name {name!r} is longer than {IFNAMSIZ}: give {host!r} a shorter name or fewer links")
        return Iface(host, name, addr)

    veths = tuple(Veth(iface(l.a, f"10.1.{i}.1"), iface(l.b, f"10.1.{i}.2"), l) for i, l in enumerate(exp.links))
    agents = 1 if central else len(exp.limiters)
    ctl = () if agents < 2 else tuple(
        Veth(Iface(h, f"{run}{h}-c", f"{CTL_NET}.{j + 1}"), Iface("ctl", f"{run}{h}-b", None, bridge=f"{run}br"))
        for j, h in enumerate(exp.limiters))
    return Plan(run=run, exp=exp, central=central, hosts=tuple(exp.hosts) + (("ctl",) if ctl else ()),
                veths=veths, ctl=ctl, bridges=(Bridge("ctl", f"{run}br"),) if ctl else (),
                routes=_routes(exp, veths), forwarding=tuple(h for h in exp.hosts if len(exp.neighbours(h)) > 1),
                rto_min=f"{exp.rto_min_s * 1e3:g}ms" if exp.rto_min_s else None, offload=False)


def _routes(exp: Experiment, veths: tuple[Veth, ...]) -> tuple[Route, ...]:
    """Static routes along shortest paths: to every link subnet a host is not on."""
    def addr_on(host: str, peer: str) -> str:
        v = next(v for v in veths if {v.a.host, v.b.host} == {host, peer})
        return v.a.addr if v.a.host == host else v.b.addr

    routes = []
    for host in exp.hosts:
        for i, link in enumerate(exp.links):
            if host in link.ends:
                continue
            paths = [p for p in (exp.route(host, end) for end in link.ends) if p]
            if paths:
                nxt = min(paths, key=len)[1]
                routes.append(Route(host, f"10.1.{i}.0/24", addr_on(nxt, host)))
    return tuple(routes)
