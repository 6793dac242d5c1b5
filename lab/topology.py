"""Names, addresses, routes and the commands that build an experiment's network (pure).

    >>> from lab.reader import load
    >>> from lab.topology import plan
    >>> p = plan(load("lab/experiments/baseline.toml"), run="lb00aa")
    >>> p.ns("l1"), p.agent_ifaces()["l1"].name, p.address("sink")
    ('lb00aa-l1', 'lb00aal1-0', '10.1.2.2')

Naming is an API (docs/lab.md):

* run prefix: ``lb`` + 4 hex digits, new for every run (``lb3fa2``); every name
  below starts with it, so ``drl-lab clean`` can find a crashed run's leftovers.
* namespace of host ``h``: ``<run>-<h>``; the control network: ``<run>-ctl``.
* data interface: ``<run><h>-<k>`` for host ``h``'s k-th link in file order
  (``lb3fa2l1-0``); veths are created directly inside the namespaces.
* link ``i`` (file order) is ``10.1.i.0/24``: its first end ``.1``, second ``.2``.
* control network (gossip, so the limiters never police it): limiter ``j``
  has ``<run><h>-c`` = ``10.254.0.(j+1)/24``, on bridge ``<run>br`` in
  ``<run>-ctl`` through port ``<run><h>-b``.

The CTB reference (``central=True``) builds the same network but puts ONE
bucket where all flows meet: the egress of the sink's only neighbour toward
the sink (000_efbf5459a9d12355.txt §5.1, "a centralized token-bucket limiter
servicing all 10 flows").
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from .errors import LabError
from .spec import Experiment, Link

PREFIX = "lb"
RUN = re.compile(rf"{PREFIX}[0-9a-f]{{4}}")
CTL_NET = "10.254.0"
MTU_FRAME = 1514
IFNAMSIZ = 15


def new_run() -> str:
    return PREFIX + secrets.token_hex(2)


@dataclass(frozen=True)
class Iface:
    host: str
    name: str
    addr: str | None  # without the /24; None on bridge ports


@dataclass(frozen=True)
class Veth:
    a: Iface
    b: Iface
    link: Link | None = None  # None on the control network


@dataclass(frozen=True)
class Route:
    host: str
    dst: str   # a /24
    via: str


@dataclass(frozen=True)
class Plan:
    run: str
    exp: Experiment
    central: bool
    veths: tuple[Veth, ...]
    ctl: tuple[Veth, ...]
    routes: tuple[Route, ...]

    def ns(self, host: str) -> str:
        return f"{self.run}-{host}"

    @property
    def ctl_ns(self) -> str:
        return f"{self.run}-ctl"

    @property
    def bridge(self) -> str:
        return f"{self.run}br"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(h) for h in self.exp.hosts] + ([self.ctl_ns] if self.ctl else [])

    def iface(self, host: str, peer: str) -> Iface:
        """``host``'s interface on its link to ``peer``."""
        for v in self.veths:
            if (v.a.host, v.b.host) == (host, peer):
                return v.a
            if (v.b.host, v.a.host) == (host, peer):
                return v.b
        raise KeyError(f"no link {host}-{peer}")

    def address(self, host: str) -> str:
        """The address traffic is sent to: the host's first interface."""
        return next(i.addr for v in self.veths for i in (v.a, v.b) if i.host == host)

    def agent_ifaces(self) -> dict[str, Iface]:
        """Where agents run: host -> the interface whose egress they limit (toward the sink)."""
        exp = self.exp
        if self.central:
            hub = exp.neighbours(exp.sink)[0]
            return {hub: self.iface(hub, exp.sink)}
        return {h: self.iface(h, exp.route(h, exp.sink)[1]) for h in exp.limiters}

    def ctl_address(self, host: str) -> str:
        return next(v.a.addr for v in self.ctl if v.a.host == host)

    # -- commands ------------------------------------------------------------------
    def build_commands(self) -> list[list[str]]:
        """Every command that builds the network, in order (lab/netns.py runs them)."""
        cmds = [["ip", "netns", "add", ns] for ns in self.namespaces]
        cmds += [["ip", "-n", ns, "link", "set", "lo", "up"] for ns in self.namespaces]
        if self.ctl:
            cmds += [["ip", "-n", self.ctl_ns, "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "-n", self.ctl_ns, "link", "set", self.bridge, "up"]]
        for v in self.veths + self.ctl:
            b_ns = self.ctl_ns if v.b.addr is None else self.ns(v.b.host)
            cmds.append(["ip", "link", "add", v.a.name, "netns", self.ns(v.a.host),
                         "type", "veth", "peer", "name", v.b.name, "netns", b_ns])
            for end, ns in ((v.a, self.ns(v.a.host)), (v.b, b_ns)):
                if end.addr:
                    cmds.append(["ip", "-n", ns, "addr", "add", f"{end.addr}/24", "dev", end.name])
                else:
                    cmds.append(["ip", "-n", ns, "link", "set", end.name, "master", self.bridge])
                # Segment in the stack, not in the veth: the limiter then polices MTU-sized
                # packets as the paper's limiters did, not 64 KB GSO bursts.
                cmds.append(["ip", "netns", "exec", ns, "ethtool", "-K", end.name, "tso", "off", "gso", "off", "gro", "off"])
                cmds.append(["ip", "-n", ns, "link", "set", end.name, "up"])
        for host in self.exp.hosts:
            if len(self.exp.neighbours(host)) > 1:
                cmds.append(["ip", "netns", "exec", self.ns(host), "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        cmds += [["ip", "-n", self.ns(r.host), "route", "add", r.dst, "via", r.via, *self.route_options()]
                 for r in self.routes]
        if self.exp.rto_min_s:   # the connected subnets' routes too
            cmds += [["ip", "-n", self.ns(end.host), "route", "replace", f"10.1.{i}.0/24", "dev", end.name,
                      *self.route_options()] for i, v in enumerate(self.veths) for end in (v.a, v.b)]
        for v in self.veths:
            if v.link.rate_Bps or v.link.delay_s or v.link.loss_pct:
                cmds += self.shaping_commands(v.link, v.link.rate_Bps)
        return cmds

    @property
    def rto_min(self) -> str | None:
        """The experiment's TCP RTO floor in ip-route's syntax; None keeps the kernel's."""
        return f"{self.exp.rto_min_s * 1e3:g}ms" if self.exp.rto_min_s else None

    def route_options(self) -> list[str]:
        """Per-route options every data route gets."""
        return ["rto_min", self.rto_min] if self.rto_min else []

    def shaping_commands(self, link: Link, rate_Bps: float | None) -> list[list[str]]:
        """Shape both directions of ``link``: TBF for a rate, netem when it has delay or loss."""
        if link.delay_s or link.loss_pct:
            qdisc = ["netem"] + (["delay", f"{link.delay_s * 1e3:g}ms"] if link.delay_s else []) \
                + (["loss", f"{link.loss_pct:g}%"] if link.loss_pct else []) \
                + (["rate", f"{int(rate_Bps * 8)}bit"] if rate_Bps else [])
        else:
            # burst: 10 ms of traffic, at least 4 frames (TBF needs >= rate/HZ and >= one MTU)
            burst = max(4 * MTU_FRAME, int(rate_Bps / 100))
            qdisc = ["tbf", "rate", f"{int(rate_Bps * 8)}bit", "burst", str(burst), "latency", "50ms"]
        return [["tc", "-n", self.ns(end), "qdisc", "replace", "dev", self.iface(end, peer).name, "root", *qdisc]
                for end, peer in (link.ends, link.ends[::-1])]


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
        Veth(Iface(h, f"{run}{h}-c", f"{CTL_NET}.{j + 1}"), Iface(h, f"{run}{h}-b", None))
        for j, h in enumerate(exp.limiters))
    return Plan(run, exp, central, veths, ctl, _routes(exp, veths))


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
