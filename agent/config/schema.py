"""The agent's options, declared once: every flag of ``drl-agent up``, key of drl.toml and
option of an etcd class table is a :class:`Field` of :data:`FIELDS`.

    >>> field("interval_s").flag, field("interval_s").key, field("interval_s").parse("100ms")
    ('--interval', 'interval', 0.1)
    >>> field("class_specs").key, field("class_specs").scope
    ('match', 'class only')

A field carries its flag, its TOML key, its help, its default (written as a
user would write it, and parsed like one), its parser and its scope:

* ``AGENT``: agent-wide, a flag or a key of ``[agent]``;
* ``CLASS``: a class option, in a ``[[class]]`` table or an etcd class, with
  ``[agent]`` (and the flag) as the default of every class;
* ``CLASS_ONLY``: a class option no default makes sense for (``global``, ``match``).

The views: cli/agent.py makes ``up``'s click options from the fields,
agent/config/toml.py reads a file's and etcd's tables by their keys, and
:func:`defaults` gives the options of an agent started with no flag at all.
The option dict they all produce (``field.name`` -> value) is what
agent/config/build.py turns into a Config.  A new option is one more Field
here (and what build.py does with it).

Parsers take text (a flag, an environment variable, a TOML string) or, for the
numeric ones, a TOML number, and raise :class:`OptionError`, one line that does
not name the option (the caller says where the value came from).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

from drl.agent import abi, logs, units
from drl.agent.abi import GOSSIP_MARK, MAX_CLIENTS
from drl.agent.allocators import names as allocator_names
from drl.agent.clients import rules as clients

DEFAULT_PORT = 7470
DEFAULT_SOCKET = "/run/drl/agent.sock"     # drl-agent's and drlctl's --socket
MAX_CLASS_TABLES = 65536     # --max-classes' ceiling: a file with more [[class]] tables is refused unread

AGENT, CLASS, CLASS_ONLY = "agent", "class", "class only"


class OptionError(ValueError):
    """A value an option refuses, in one line."""


class Parser:
    """Text -> the value the agent uses.  ``name`` is the metavar (``--global RATE``);
    ``numeric`` parsers also take a TOML number as it is, the others take text only, so a
    bare ``global = 50`` is not silently 50 bytes/s."""
    name = "text"
    numeric = False

    def __call__(self, value: Any) -> Any:
        try:
            return self.parse(value)
        except OptionError:
            raise
        except (ValueError, TypeError) as e:        # units.UnitError, the clients' and float()'s
            raise OptionError(str(e)) from None

    def parse(self, value: Any) -> Any:
        return value


class Text(Parser):
    pass


class Unit(Parser):
    """One of the converters of agent/units.py (or its kin): a rate, a size, a duration ..."""

    def __init__(self, name: str, parse: Callable[[Any], Any], numeric: bool = False):
        self.name, self._parse, self.numeric = name, parse, numeric

    def parse(self, value: Any) -> Any:
        return self._parse(value)


class Flag(Parser):
    """An on/off option: a flag without a value; ``true``/``false`` in a file."""
    name = "boolean"

    def parse(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise OptionError(f"expected true or false, got {value!r}")
        return value


class File(Parser):
    """A path to a file; one that names a directory is refused at once."""
    name = "file"

    def parse(self, value: Any) -> str:
        if os.path.isdir(value):
            raise OptionError(f"File {value!r} is a directory.")
        return value


class Choice(Parser):
    name = "choice"

    def __init__(self, choices):
        self.choices = tuple(choices)

    def parse(self, value: Any) -> str:
        if value not in self.choices:
            raise OptionError(f"{value!r} is not one of {', '.join(map(repr, self.choices))}.")
        return value


class Float(Parser):
    name = "float"
    numeric = True

    def parse(self, value: Any) -> float:
        if isinstance(value, bool):
            raise OptionError(f"{value!r} is not a valid float.")
        try:
            return float(value)
        except ValueError:
            raise OptionError(f"{value!r} is not a valid float.") from None


class _Range(Parser):
    numeric = True
    number: type = float

    def __init__(self, lo: float | None = None, hi: float | None = None, hi_open: bool = False):
        self.lo, self.hi, self.hi_open = lo, hi, hi_open

    def parse(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise OptionError(f"{value!r} is not a valid {self.number.__name__}.")
        try:
            n = self.number(value)
        except ValueError:
            kind = "integer" if self.number is int else "float"
            raise OptionError(f"{value!r} is not a valid {kind}.") from None
        if (self.lo is not None and n < self.lo) or (self.hi is not None and (n >= self.hi if self.hi_open
                                                                              else n > self.hi)):
            raise OptionError(f"{n} is not in the range {self.describe()}.")
        return n

    def describe(self) -> str:
        """As click says it: ``x>=1``, ``1<=x<=65536``, ``0<=x<1``."""
        hi = "<" if self.hi_open else "<="
        if self.lo is None:
            return f"x{hi}{self.hi}"
        if self.hi is None:
            return f"x>={self.lo}"
        return f"{self.lo}<=x{hi}{self.hi}"


class IntRange(_Range):
    name = "integer range"
    number = int


class FloatRange(_Range):
    name = "float range"


def _duration(text: str, positive: bool) -> float:
    seconds = units.parse_duration(text)
    if seconds < 0 or (positive and seconds == 0):
        raise OptionError(f"duration must be {'positive' if positive else '0 or more'}: {text!r}")
    return seconds


def _mark(value: Any) -> int:
    if isinstance(value, bool):
        raise OptionError(f"{value!r} is not a number (decimal or 0x hex)")
    try:
        mark = value if isinstance(value, int) else int(str(value), 0)
    except ValueError:
        raise OptionError(f"{value!r} is not a number (decimal or 0x hex)") from None
    if not 0 < mark < 2**32:
        raise OptionError(f"{value!r} is not in 0x1-0xffffffff")
    return mark


RATE = Unit("rate", units.parse_rate)                           # '50mbit' -> bytes/s
SIZE = Unit("size", units.parse_size)                           # '75KB' -> bytes
DURATION = Unit("duration", lambda text: _duration(text, positive=True))    # '100ms' -> seconds, > 0
INTERVAL = Unit("duration", units.parse_interval)               # the estimate interval: 10ms .. 10s
SPAN = Unit("duration", lambda text: _duration(text, positive=False))       # '0s' too: a ban's extra time
QUOTA = Unit("quota", units.parse_quota)                        # '10TB/30d' -> (bytes, seconds)
PROBABILITY = Unit("probability", units.parse_probability)
CLIENT_KEY = Unit("client-key", clients.parse_client_key)       # 'dst/32', 'src/24/56'
THRESHOLD = Unit("threshold", clients.parse_threshold)          # '2mbit' or '2000/1200s'
PREFIX = Unit("prefix", clients.parse_prefix)                   # an address or CIDR prefix, either family
MARK = Unit("mark", _mark, numeric=True)                       # a 32-bit packet mark, decimal or 0x hex, not 0
TEXT, FLAG, FILE, FLOAT = Text(), Flag(), File(), Float()


@dataclass(frozen=True)
class Field:
    name: str                     # the option's name in the dict build.py reads ("global_Bps")
    flag: str                     # "--global"
    parse: Parser
    help: str
    scope: str = AGENT
    default: Any = None           # as written by a user, parsed like a value given; a callable is called
    show_default: bool | str = False
    key: str = ""                 # in drl.toml and etcd; "" = the flag's name with "_" for "-"
    metavar: str | None = None
    multiple: bool = False        # repeatable flag; a list in a file
    joined: bool = False          # a list in a file is the flag's comma-separated text
    envvar: str | None = None     # None = DRL_UP_<FLAG> (cli/params.py envvars_by_flag)

    def __post_init__(self):
        if not self.key:
            object.__setattr__(self, "key", self.flag.lstrip("-").replace("-", "_"))

    @property
    def is_flag(self) -> bool:
        return isinstance(self.parse, Flag)

    @property
    def per_class(self) -> bool:
        return self.scope in (CLASS, CLASS_ONLY)

    def default_value(self) -> Any:
        """The option's value when nothing sets it."""
        if self.multiple:
            return tuple(self.parse(v) for v in self.default or ())
        if self.is_flag:
            return bool(self.default)
        if self.default is None:
            return None
        return self.parse(self.default() if callable(self.default) else self.default)


_PER_CLIENT = "Per-client rule: "

FIELDS: tuple[Field, ...] = (
    Field("iface", "--iface", TEXT, "Interface whose egress is limited (required, here or in --config)."),
    Field("global_Bps", "--global", RATE, scope=CLASS_ONLY, key="global",
          help="The global limit shared by all agents, e.g. 50mbit: the class 'default' (required without --config)."),
    Field("allocator", "--allocator", Choice(allocator_names()), scope=CLASS, default="fps", show_default=True,
          help="How the global limit is divided among agents."),
    Field("node_id", "--node-id", TEXT, "This agent's name in the cluster.", default=socket.gethostname,
          show_default="hostname"),
    Field("listen", "--listen", TEXT, "HOST:PORT for gossip (UDP).", default=f"0.0.0.0:{DEFAULT_PORT}",
          show_default=True),
    Field("peers", "--peers", TEXT, "Other agents as [ID@]HOST:PORT,... (ID required by gdrl, fillratio, dqmp, lease).",
          default="", joined=True),
    Field("key_file", "--key-file", FILE, "Cluster key (HMAC-SHA256) shared by all agents."),
    Field("insecure", "--insecure", FLAG, "Run without a cluster key: gossip is not authenticated."),
    Field("identity_file", "--identity", FILE, key="identity",
          help="This agent's Ed25519 private key (PEM; openssl genpkey -algorithm ed25519): it signs all its "
               "gossip, and peers accept only what verifies under a key listed for its node id (docs/security.md)."),
    Field("peer_keys_file", "--peer-keys", FILE, key="peer_keys",
          help="The peers' public keys, lines 'NODE_ID BASE64_KEY' (several per node while rotating); "
               "with --identity. With --registry, members also publish their own."),
    Field("interval_s", "--interval", INTERVAL, "Estimate interval.", default="100ms", show_default=True),
    Field("branching", "--branching", IntRange(lo=1), default=16, show_default=True,
          help="Gossip branching factor: peers updated per interval (>= peers = full mesh: every peer "
               "each interval up to 17 hosts; FPS's limits sum to G only on weights heard this recently)."),
    Field("peer_timeout_s", "--peer-timeout", DURATION,
          "Silence after which a peer is stale [default: 3 gossip rounds = 3 x interval x ceil(peers/branching)]."),
    Field("burst_bytes", "--burst", SIZE, scope=CLASS,
          help="Most one host's bucket (police) or HTB burst (shape) holds [default: 300 ms (police) or 4 ms (shape) "
               "of its rate, within its share of --burst-budget]."),
    Field("burst_budget", "--burst-budget", SIZE, scope=CLASS,
          help="Bytes all hosts together may pass beyond the global rate in any window (the cluster's bucket depth D) "
               "[default: 300 ms (police) or 100 ms (shape) of the global rate, at least 128 KiB (police) or 66 KiB "
               "(shape) per host]."),
    Field("class_specs", "--class", TEXT, scope=CLASS_ONLY, key="match", multiple=True, metavar="SPEC",
          help="Which egress traffic is limited (repeatable; a packet matching any SPEC is limited): "
               "key=value,... of src, dst (address or CIDR; dst is the remote end), proto (tcp, udp, ...), "
               "sport (the local port: what a server on it sends), dport (the remote port: what this host "
               "sends to a server on it), mark (MARK[/MASK]), or all; e.g. sport=8080,proto=tcp. "
               "Default: all IP traffic."),
    Field("socket_path", "--socket", TEXT, "Control socket for drlctl.", default=DEFAULT_SOCKET, show_default=True),
    Field("safe_Bps", "--safe-rate", RATE, scope=CLASS,
          help="Rate the kernel falls back to if the agent stops updating [default: global/N]."),
    Field("ewma", "--ewma", FloatRange(0, 1, hi_open=True), scope=CLASS, default=0.1, show_default=True,
          help="Share of an estimate still present after one second (the paper's 1-second EWMA; 0 = none)."),
    Field("flow_ewma", "--flow-ewma", FloatRange(0, 1, hi_open=True), scope=CLASS, default=0.8, show_default=True,
          help="Share of a flow's byte share still present after one second (FPS's flow rates; docs/datapath.md, TCP on veth)."),
    Field("sample_probability", "--sample-probability", PROBABILITY,
          "Probability that a new flow enters the flow table (FPS's sample set) [default: fps 0.1, others 1]."),
    Field("max_flows", "--max-flows", IntRange(lo=16), default=abi.MAX_FLOWS, show_default=True,
          help="Flow table size (the kernel keeps two maps of this many flows, ~130 bytes each)."),
    Field("max_classes", "--max-classes", IntRange(1, MAX_CLASS_TABLES), default=abi.MAX_CLASSES, show_default=True,
          help="Classes the datapath has room for (a load-time size)."),
    Field("max_clients", "--max-clients", IntRange(1024, 2**24), default=MAX_CLIENTS, show_default=True,
          help="Per-client windows the datapath keeps, LRU (a load-time size: ~128 bytes of kernel memory each, "
               "allocated at start; docs/clients.md)."),
    Field("eta", "--eta", FLOAT, "GDRL / fill-ratio step size [default: 1/(2d)].", scope=CLASS),
    Field("quota", "--quota", QUOTA, "DQMP volume quota SIZE/PERIOD, e.g. 10TB/30d.", scope=CLASS),
    Field("lease_servers", "--lease-servers", TEXT, "lease: node ids that serve leases [default: the lowest node id].",
          scope=CLASS, default=""),
    Field("on_lease_loss", "--on-lease-loss", Choice(["pessimistic", "optimistic", "safe"]), scope=CLASS,
          default="safe", show_default=True, help="lease: what a client enforces when it cannot renew."),
    Field("shadow", "--shadow", FLAG, scope=CLASS,
          help="Shadow mode for every class: count what the limits would drop (dropped_*), drop nothing "
               "(per class: shadow = true in --config; docs/config.md)."),
    # no default here: it depends on the class's allocator and on the other classes (build.py
    # default_enforce, default_police_reason), so an explicit shape with grd is refused and the default never is
    Field("enforce", "--enforce", Choice(["police", "shape"]), scope=CLASS,
          help="How every class's local limit is enforced: shape (queue it in an HTB class at that rate) or "
               "police (drop what exceeds it) [default: shape when a class matches all IP traffic; police for "
               "grd, volume quotas, traffic left outside every class or more than 32 classes; docs/config.md]."),
    Field("client_key", "--client-key", CLIENT_KEY, scope=CLASS, key="client",
          help=_PER_CLIENT + "who a client is, dst/LEN or dst/LEN4/LEN6 (remote address of egress "
               "packets; src = local), e.g. dst/32 (docs/clients.md) [default: no per-client rule]."),
    Field("client_measure", "--client-measure", Choice(["bytes", "packets", "conns"]), scope=CLASS, key="measure",
          help=_PER_CLIENT + "what is counted (conns = TCP connections opened or accepted) [default: bytes]."),
    Field("client_threshold", "--client-threshold", THRESHOLD, scope=CLASS, key="threshold",
          help=_PER_CLIENT + "a rate (2mbit) or COUNT/WINDOW (2000/1200s), counted across all hosts."),
    Field("client_action", "--client-action", Choice(["throttle", "ban"]), scope=CLASS, key="action",
          help=_PER_CLIENT + "throttle (drop above the threshold) or ban (cut off for the rest of the "
               "window plus --ban-duration) [default: throttle]."),
    Field("ban_duration_s", "--ban-duration", SPAN, scope=CLASS,
          help="Per-client rule, action ban: how long a ban lasts after its window [default: 0s]."),
    Field("client_exempt", "--client-exempt", PREFIX, scope=CLASS, key="exempt", multiple=True, metavar="PREFIX",
          help=_PER_CLIENT + "addresses or prefixes never counted, throttled or banned (repeatable)."),
    Field("state_dir", "--state-dir", TEXT, default="/var/lib/drl", show_default=True,
          help="Where allocators that must survive a restart keep their state (dqmp)."),
    Field("gossip_mark", "--gossip-mark", MARK, default=f"{GOSSIP_MARK:#x}", show_default=True,
          help="Socket mark of the gossip socket: only UDP from --listen's port with this mark skips the "
               "limiter. Pick one no firewall or ip rule on the host uses."),
    Field("filter_ahead", "--filter-ahead", Choice(["reassert", "warn"]), default="reassert", show_default=True,
          help="Another tool's tc egress filter found running before drl's: reassert adds drl's again ahead of "
               "it (it then no longer sees the traffic drl passes), warn only reports it; neither removes it."),
    Field("log_format", "--log-format", Choice(logs.FORMATS), default="logfmt", show_default=True,
          help="Log lines on stderr: logfmt or JSON, one event per line, same keys (docs/logs.md)."),
    Field("metrics", "--metrics", TEXT, metavar="HOST:PORT",
          help="Serve Prometheus metrics at http://HOST:PORT/metrics (docs/metrics.md) [default: off]."),
    Field("registry", "--registry", TEXT, metavar="etcd://HOST:PORT[,...]", joined=True,
          help="Find peers and read classes in etcd (docs/registry.md); --peers may then be empty."),
    Field("cluster", "--cluster", TEXT, "The cluster's name in --registry: agents with the same name limit together."),
    Field("registry_ca", "--registry-ca", FILE, "CA certificate of etcd's TLS (https)."),
    Field("registry_cert", "--registry-cert", FILE, "Client certificate for etcd (with --registry-key)."),
    Field("registry_key", "--registry-key", FILE, "Key of --registry-cert."),
    Field("registry_timeout_s", "--registry-timeout", DURATION, default="30s", show_default=True,
          help="How long a starting agent waits for its first view of etcd (its peers and classes) before "
               "it gives up, or starts on --peers and classes of its own."),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}
CLASS_OPTIONS = tuple(f.name for f in FIELDS if f.per_class)           # the rest are agent-wide
PER_CLASS_ONLY = tuple(f.name for f in FIELDS if f.scope == CLASS_ONLY)  # a default for every class makes no sense


def field(name: str) -> Field:
    return BY_NAME[name]


def defaults() -> dict[str, Any]:
    """The options of ``drl-agent up`` given no flag, no variable and no file."""
    return {f.name: f.default_value() for f in FIELDS}

