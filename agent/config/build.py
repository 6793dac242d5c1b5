"""``drl-agent up`` options -> a checked :class:`Config`, before anything is touched.

Everything a user can get wrong is found here and reported as one
:class:`ConfigError` line: missing capabilities, unknown interface, malformed peers or
class specs, an unreadable key file, allocator parameters out of range.  What
can only fail when tried (a port in use, the BPF program not loading) fails in
agent/service/daemon.py, which still acquires sockets before it attaches anything.
"""
from __future__ import annotations

import functools
import socket
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from drl.agent import abi
from drl.agent.kernel import caps
from drl.agent.allocators import allocator_class, create
from drl.agent.allocators.common import ParameterError
from drl.agent.classes.spec import ClassRule, ClassSpecError, parse_classes
from drl.agent.kernel.classify import ClassifyError, compile_rules
from drl.agent.clients.rules import ClientRule, ClientRuleError, client_rule
from drl.agent.gossip.membership import liveness_timeout
from drl.agent.model import Allocator
from drl.agent.gossip.peers import AddressError, HostPort, Peer, parse_hostport, parse_peers
from drl.agent.cluster.registry import RegistryConfig, RegistryError, registry_config
from drl.agent.gossip.keys import KeyFileError, load_key
from drl.agent.gossip.signing import NodeKeys, load_node_keys

# The kernel falls back to the safe rate when the agent has not written a
# class for this long: long enough that a slow tick never trips it, short
# enough that a dead agent's host stops using a share it no longer owns.
FAILSAFE_INTERVALS = 20
FAILSAFE_MIN_S = 2.0
# Configs of more classes than this police the classes that do not choose (default_police_reason):
# a shaped class costs ~1 ms of netlink per rate change, and 32 changes fit a 100 ms tick
SHAPE_DEFAULT_MAX = 32


class ConfigError(Exception):
    """One line for the user; nothing has been attached when it is raised."""


def class_key(name: str) -> int:
    """A class's name on the wire: CRC-32 of the name, the same on every agent."""
    return zlib.crc32(name.encode())


@dataclass(frozen=True)
class ClassConf:
    """One class (tenant) as configured: --global/--class or a [[class]] table (docs/config.md)."""
    name: str
    global_Bps: float                 # as configured; agent/cluster/limits.py decides the limit in force
    allocator: Allocator
    rules: tuple[ClassRule, ...]      # () = every IP packet
    burst_bytes: int | None
    safe_Bps: float | None            # None = global/N
    ewma: float
    flow_ewma: float
    shadow: bool = False              # count what the limit would drop, drop nothing (docs/config.md "Shadow mode")
    enforce: str = "police"           # police (drop) or shape (queue in HTB, agent/kernel/shaper.py; docs/config.md "Shaping mode")
    client: ClientRule | None = None  # per-client throttle or ban (docs/clients.md); None = none
    burst_budget: int | None = None   # D, the cluster's depth; None = agent/burst.py's default for the mode
    policed_by_default: str = ""      # why the default policed it rather than shaped (default_police_reason); "" = not so

    @functools.cached_property
    def key(self) -> int:
        return class_key(self.name)

    @property
    def shaped(self) -> bool:
        """Queued in HTB rather than policed, at a bucket's rate; shadow wins (nothing is shaped)."""
        return self.enforce == "shape" and not self.shadow

    @property
    def match_rules(self) -> tuple[ClassRule, ...]:
        """The rules the datapath gets: no spec is one rule that matches every IP packet."""
        return self.rules or (ClassRule(),)


@dataclass(frozen=True)
class Config:
    iface: str
    node_id: str
    listen: HostPort
    peers: tuple[Peer, ...]
    key: bytes | None
    interval_s: float
    branching: int
    peer_timeout_s: float
    classes: tuple[ClassConf, ...]
    socket_path: str
    failsafe_s: float
    sample_probability: float
    max_flows: int
    max_classes: int
    state_dir: str
    max_clients: int = abi.MAX_CLIENTS      # --max-clients: the datapath's per-client windows (docs/clients.md)
    gossip_mark: int = abi.GOSSIP_MARK       # SO_MARK of the gossip socket, exempt from policing (agent/abi.py)
    metrics: HostPort | None = None          # --metrics: serve Prometheus /metrics there (agent/service/metrics.py)
    log_format: str = "logfmt"               # --log-format: logfmt or json lines on stderr (agent/logs.py)
    filter_ahead: str = "reassert"           # --filter-ahead: others' egress filters before ours (agent/kernel/attach.py)
    # re-reads --config, with the registry's {name: table} on top if given; raises ConfigError
    reload: Callable[..., tuple[ClassConf, ...]] | None = None
    registry: RegistryConfig | None = None   # --registry: members and classes from etcd (agent/cluster/registry.py)
    peer_timeout_fixed: bool = False         # --peer-timeout given: it does not follow N as members come and go
    # the classes in force with the registry's {name: table} on top; raises ConfigError
    live_classes: Callable[[dict[str, dict]], tuple[ClassConf, ...]] | None = None
    node_keys: NodeKeys | None = None        # --identity, --peer-keys: per-node signatures (agent/gossip/signing.py)
    identity_file: str | None = None         # ... their files, re-read on a reload
    peer_keys_file: str | None = None

    @property
    def n_nodes(self) -> int:
        return 1 + len(self.peers)

    @property
    def standalone(self) -> bool:
        """No peers and no registry to find any: nothing to gossip with, so no socket and no key."""
        return not self.peers and self.registry is None


def build_config(opts: Mapping[str, Any], classes: Sequence[Mapping[str, Any]] | None = None,
                 check_host: bool = True) -> Config:
    """``drl-agent up``'s agent-wide options and one option dict per class -> Config;
    raises ConfigError.  ``classes=None``: the one class ``default`` from ``opts``
    (--global, --class and the class options).

    ``check_host=False`` skips the checks of this machine (root, the interface), so
    tests can build a Config for an Agent with an in-memory datapath."""
    if not opts["iface"]:
        raise ConfigError("no interface: give --iface IFACE (or iface in the config file's [agent])")
    if check_host:
        _check_host(opts["iface"])
    try:
        listen = parse_hostport(opts["listen"])
        peers = tuple(parse_peers(opts["peers"] or ""))
    except AddressError as e:
        raise ConfigError(str(e)) from None
    node_id = opts["node_id"]
    if not node_id or any(p.node_id == node_id for p in peers):
        raise ConfigError(f"node id {node_id!r} must be non-empty and differ from every peer's")
    registry = _registry(opts, listen)
    node_keys = _node_keys(opts, registry is not None)
    interval_s = opts["interval_s"]
    confs = build_classes(opts, [{**opts, "name": "default"}] if classes is None else classes, peers,
                          opts["max_classes"])
    return Config(
        iface=opts["iface"], node_id=node_id, listen=listen, peers=peers,
        key=_key(opts, gossip=bool(peers or registry) and node_keys is None),
        interval_s=interval_s, branching=opts["branching"],
        peer_timeout_s=opts["peer_timeout_s"] or liveness_timeout(interval_s, len(peers), opts["branching"]),
        classes=confs, socket_path=opts["socket_path"],
        failsafe_s=max(FAILSAFE_MIN_S, FAILSAFE_INTERVALS * interval_s),
        sample_probability=_sample_probability(opts, confs), max_flows=opts["max_flows"],
        max_classes=opts["max_classes"], state_dir=opts["state_dir"], max_clients=opts.get("max_clients") or abi.MAX_CLIENTS,
        gossip_mark=_gossip_mark(opts.get("gossip_mark")), metrics=_metrics(opts.get("metrics")),
        log_format=opts.get("log_format") or "logfmt", filter_ahead=opts.get("filter_ahead") or "reassert",
        registry=registry,
        peer_timeout_fixed=bool(opts["peer_timeout_s"]),
        node_keys=node_keys, identity_file=opts.get("identity_file"), peer_keys_file=opts.get("peer_keys_file"))


def build_classes(opts: Mapping[str, Any], classes: Sequence[Mapping[str, Any]], peers: tuple[Peer, ...],
                  max_classes: int) -> tuple[ClassConf, ...]:
    """Each class's options -> ClassConf, checked; raises ConfigError naming the class."""
    if len(classes) > max_classes:
        raise ConfigError(f"{len(classes)} classes, at most {max_classes} (--max-classes)")
    police_only = default_police_reason(classes)
    confs = tuple(_class(opts["node_id"], c, peers, opts["interval_s"], police_only) for c in classes)
    keys: dict[int, str] = {}
    for c in confs:
        if keys.setdefault(c.key, c.name) != c.name:
            raise ConfigError(f"classes {keys[c.key]!r} and {c.name!r} have the same CRC-32; rename one")
    try:        # the classifier's maps hold the rules (docs/config.md "Limits of the rules"), checked here
        compile_rules((rule, i) for i, c in enumerate(confs) for rule in c.match_rules)
    except ClassifyError as e:      # so that a file (up, reload, drlctl import, etcd) is refused as one
        raise ConfigError(str(e)) from None
    return confs


def default_police_reason(classes: Sequence[Mapping[str, Any]]) -> str:
    """Why the classes that do not choose are policed rather than shaped ("" = they are shaped).

    Shaping puts HTB at the interface's root, and every packet goes through it: traffic outside
    every class paid ~20 % of its 64-byte packet rate for that (bench/RESULTS.md "Police or
    shape"), so the default shapes only where there is no such traffic, when a class matches
    all IP (no ``match``, or ``all``).  And a shaped class costs ~1 ms of netlink per rate
    change (agent/kernel/shaper.py): past SHAPE_DEFAULT_MAX classes a tick would not keep up."""
    if len(classes) > SHAPE_DEFAULT_MAX:
        return f"more than {SHAPE_DEFAULT_MAX} classes"
    if not any(_matches_all(c.get("class_specs") or ()) for c in classes):
        return "traffic outside every class"
    return ""


def _matches_all(specs) -> bool:
    try:
        return not specs or ClassRule() in parse_classes(specs)
    except ClassSpecError:          # refused with its class's name by _class
        return False


def default_enforce(allocator: Allocator, quota) -> str:
    """A class's enforcement when none is given (and default_police_reason has none): shape (a
    queue at the local limit: no retransmissions, no loss, BBR's flows share it; docs/datapath.md
    "Police or shape"), except where only dropping can enforce: grd's random drop and a quota."""
    return "police" if allocator.name == "grd" or quota else "shape"


def _class(node_id: str, c: Mapping[str, Any], peers: tuple[Peer, ...], interval_s: float,
           police_only: str = "") -> ClassConf:
    where = "" if c["name"] == "default" else f"class {c['name']!r}: "
    if c.get("global_Bps") is None:
        raise ConfigError(f"{where}missing global limit (--global RATE)")
    try:
        rules = tuple(parse_classes(c["class_specs"]))
    except ClassSpecError as e:
        raise ConfigError(f"{where}{e}") from None
    try:
        allocator = _allocator(node_id, c, peers)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None
    enforce = c.get("enforce") or ("police" if police_only else default_enforce(allocator, c.get("quota")))
    if enforce == "shape" and (allocator.name == "grd" or c.get("quota")):
        what = "random drop (allocator grd)" if allocator.name == "grd" else "a volume quota"
        raise ConfigError(f"{where}enforce = shape cannot enforce {what}: it queues at a rate; use enforce = police")
    try:
        client = _client_rule(c, interval_s)
    except ClientRuleError as e:
        raise ConfigError(f"{where}{e}") from None
    return ClassConf(name=c["name"], global_Bps=c["global_Bps"], allocator=allocator, rules=rules,
                     burst_bytes=c["burst_bytes"], safe_Bps=c["safe_Bps"], ewma=c["ewma"], flow_ewma=c["flow_ewma"],
                     shadow=bool(c.get("shadow")), enforce=enforce, client=client, burst_budget=c["burst_budget"],
                     policed_by_default=police_only if not c.get("enforce") and police_only else "")


def _client_rule(c: Mapping[str, Any], interval_s: float) -> ClientRule | None:
    """The class's per-client rule (--client-* / client, measure, threshold, ...), checked."""
    rule = client_rule(c.get("client_key"), c.get("client_measure"), c.get("client_threshold"),
                       c.get("client_action"), c.get("ban_duration_s"), c.get("client_exempt") or ())
    if rule is not None:
        rule.check_interval(interval_s)
        if rule.window_s * 1e9 > abi.MAX_CLIENT_WINDOW_NS:
            raise ClientRuleError(f"threshold {rule.threshold.text!r}: the window is at most "
                                  f"{abi.MAX_CLIENT_WINDOW_NS / 3.6e12:.0f} h (the kernel's sliding window)")
    return rule


def _sample_probability(opts: Mapping[str, Any], classes: tuple[ClassConf, ...]) -> float:
    """FPS samples flows (its resampleprob); the others see every flow unless told.  The
    flow table is shared by all classes, so the smallest any allocator asks for."""
    if opts["sample_probability"] is not None:
        return opts["sample_probability"]
    return min((getattr(c.allocator, "sample_probability", 1.0) for c in classes), default=1.0)


def _gossip_mark(mark: int | None) -> int:
    if mark is None:
        return abi.GOSSIP_MARK
    if not 0 < mark < 2**32:
        raise ConfigError(f"--gossip-mark {mark:#x}: give a mark in 0x1-0xffffffff (0 would exempt unmarked traffic)")
    return mark


def _metrics(text: str | None) -> HostPort | None:
    if not text:
        return None
    try:
        return parse_hostport(text)
    except AddressError as e:
        raise ConfigError(f"--metrics: {e}") from None


def _registry(opts: Mapping[str, Any], listen: HostPort) -> RegistryConfig | None:
    """--registry and its companions -> RegistryConfig; None without --registry."""
    companions = [f"--{k.replace('_', '-')}" for k in ("cluster", "registry_ca", "registry_cert", "registry_key")
                  if opts.get(k)]
    if not opts.get("registry"):
        if companions:
            raise ConfigError(f"{companions[0]} needs --registry etcd://HOST:PORT")
        return None
    try:
        registry = registry_config(opts["registry"], opts.get("cluster"), opts.get("registry_ca"),
                                   opts.get("registry_cert"), opts.get("registry_key"),
                                   start_timeout_s=opts.get("registry_timeout_s") or 30.0)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    if "/" in opts["node_id"]:
        raise ConfigError(f"node id {opts['node_id']!r}: with --registry it names a key in etcd, so no '/'")
    if listen[0] in ("0.0.0.0", "::"):
        # the address written to etcd is the one the other agents send to
        raise ConfigError("with --registry, --listen must be the address the other agents reach "
                          f"(e.g. 10.0.0.1:7470), not {listen[0]}")
    return registry


def _check_host(iface: str) -> None:
    lacking = caps.missing()      # not "root?": a unit grants a dedicated user just these (docs/service.md)
    if lacking:
        raise ConfigError(f"missing capabilities {', '.join(lacking)} "
                          "(run as root or grant them: see docs/service.md)")
    try:
        socket.if_nametoindex(iface)
    except OSError:
        raise ConfigError(f"no interface named {iface!r} (see `ip link`)") from None


def _key(opts: Mapping[str, Any], gossip: bool) -> bytes | None:
    """``gossip``: there are peers, or a registry that will name them, and no per-node keys
    (--identity) to authenticate them instead."""
    if opts["key_file"] and opts["insecure"]:
        raise ConfigError("give either --key-file or --insecure, not both")
    if opts["insecure"] or (not gossip and not opts["key_file"]):
        return None                      # a lone limiter has nothing to authenticate
    if not opts["key_file"]:
        raise ConfigError("gossip needs a cluster key: --key-file PATH, per-node keys (--identity, --peer-keys), "
                          "or --insecure to run unauthenticated")
    try:
        return load_key(opts["key_file"])
    except KeyFileError as e:
        raise ConfigError(str(e)) from None


def _node_keys(opts: Mapping[str, Any], registry: bool) -> NodeKeys | None:
    """--identity and --peer-keys, loaded; None without --identity.  The cluster key may go
    with them (an outer MAC: outsiders' datagrams then cost one HMAC, never a verification)."""
    identity, peer_keys = opts.get("identity_file"), opts.get("peer_keys_file")
    if not identity:
        if peer_keys:
            raise ConfigError("--peer-keys needs --identity FILE: this agent's own key to sign with")
        return None
    if opts["insecure"]:
        raise ConfigError("give either --identity or --insecure, not both")
    if not peer_keys and not registry:
        raise ConfigError("--identity needs --peer-keys FILE (or --registry, where members publish theirs): "
                          "the peers' public keys")
    try:
        return load_node_keys(identity, peer_keys)
    except KeyFileError as e:
        raise ConfigError(str(e)) from None


def _allocator(node_id: str, opts: Mapping[str, Any], peers: tuple[Peer, ...]) -> Allocator:
    name = opts["allocator"]
    if getattr(allocator_class(name), "needs_member_ids", False):
        unnamed = [p for p in peers if not p.node_id]
        if unnamed:
            raise ConfigError(f"--allocator {name} needs every peer's node id: write --peers ID@HOST:PORT,...")
    quota_bytes, period_s = opts["quota"] or (None, None)
    params = {k: v for k, v in opts.items() if k != "name"}     # the class's name is not the allocator's
    params.update(quota_bytes=quota_bytes, period_s=period_s, servers=opts["lease_servers"] or None)
    try:
        allocator = create(name, **params)
        members = tuple(sorted([node_id, *(p.node_id or f"?{i}" for i, p in enumerate(peers))]))
        allocator.initial_state(node_id, members)   # graphs, lease servers: fail now, not mid-run
    except ParameterError as e:
        raise ConfigError(f"--allocator {name}: {e}") from None
    return allocator
