"""drl-agent: enforce one global egress limit together with peer agents.

Examples:

    drl-agent up --iface eth0 --global 50mbit
    drl-agent up --iface eth0 --global 50mbit --node-id a --listen 0.0.0.0:7470 \\
        --peers 10.0.0.2:7470,10.0.0.3:7470 --key-file /etc/drl/cluster.key
    drl-agent up --config /etc/drl/drl.toml
    drl-agent up --iface eth0 --global 50mbit --listen 10.0.0.1:7470 \\
        --registry etcd://10.0.0.9:2379 --cluster prod --key-file /etc/drl/cluster.key
    drl-agent reload
    drl-agent down
"""
from __future__ import annotations

import dataclasses
import socket
import sys

import click
from click.core import ParameterSource

from drl.agent.abi import GOSSIP_MARK, MAX_CLIENTS
from drl.agent.allocators import names as allocator_names
from drl.agent.service.control import DEFAULT_SOCKET, ControlError, request
from drl.agent import logs
from drl.cli import configfile
from drl.cli.params import (CLIENT_KEY, DURATION, PREFIX, PROBABILITY, QUOTA, RATE, SIZE, SPAN, THRESHOLD,
                            envvars_by_flag, version_option)

DEFAULT_PORT = 7470


class Mark(click.ParamType):
    """A 32-bit packet mark, decimal or 0x hex, never 0."""
    name = "mark"

    def convert(self, value, param, ctx):
        try:
            mark = value if isinstance(value, int) else int(str(value), 0)
        except ValueError:
            self.fail(f"{value!r} is not a number (decimal or 0x hex)", param, ctx)
        if not 0 < mark < 2**32:
            self.fail(f"{value!r} is not in 0x1-0xffffffff", param, ctx)
        return mark


MARK = Mark()

RELOAD_TIMEOUT_S = 60.0


@click.group(context_settings={"auto_envvar_prefix": "DRL", "help_option_names": ["-h", "--help"]})
@version_option
def main() -> None:
    """Run the drl agent (distributed rate limiter)."""


@main.command()
@click.option("--config", type=click.Path(dir_okay=False),
              help="TOML file with agent options and [[class]] tables (docs/config.md); flags override it.")
@click.option("--iface", help="Interface whose egress is limited (required, here or in --config).")
@click.option("--global", "global_Bps", type=RATE,
              help="The global limit shared by all agents, e.g. 50mbit: the class 'default' (required without --config).")
@click.option("--allocator", type=click.Choice(allocator_names()), default="fps", show_default=True,
              help="How the global limit is divided among agents.")
@click.option("--node-id", default=socket.gethostname, show_default="hostname", help="This agent's name in the cluster.")
@click.option("--listen", default=f"0.0.0.0:{DEFAULT_PORT}", show_default=True, help="HOST:PORT for gossip (UDP).")
@click.option("--peers", default="", help="Other agents as [ID@]HOST:PORT,... (ID required by gdrl, fillratio, dqmp, lease).")
@click.option("--key-file", type=click.Path(dir_okay=False), help="Cluster key (HMAC-SHA256) shared by all agents.")
@click.option("--insecure", is_flag=True, help="Run without a cluster key: gossip is not authenticated.")
@click.option("--interval", "interval_s", type=DURATION, default="100ms", show_default=True, help="Estimate interval.")
@click.option("--branching", type=click.IntRange(min=1), default=3, show_default=True,
              help="Gossip branching factor: peers updated per interval (>= peers = full mesh).")
@click.option("--peer-timeout", "peer_timeout_s", type=DURATION, help="Silence after which a peer is stale [default: 3 gossip rounds = 3 x interval x ceil(peers/branching)].")
@click.option("--burst", "burst_bytes", type=SIZE, help="Token bucket depth [default: the datapath's rule for the rate].")
@click.option("--class", "class_specs", multiple=True, metavar="SPEC",
              help="Which egress traffic is limited (repeatable; a packet matching any SPEC is limited). Default: all IP traffic.")
@click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True, help="Control socket for drlctl.")
@click.option("--safe-rate", "safe_Bps", type=RATE, help="Rate the kernel falls back to if the agent stops updating [default: global/N].")
@click.option("--ewma", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True,
              help="Share of an estimate still present after one second (the paper's 1-second EWMA; 0 = none).")
@click.option("--flow-ewma", type=click.FloatRange(0, 1, max_open=True), default=0.8, show_default=True,
              help="Share of a flow's byte share still present after one second (FPS's flow rates; see README).")
@click.option("--sample-probability", type=PROBABILITY,
              help="Probability that a new flow enters the flow table (FPS's sample set) [default: fps 0.1, others 1].")
@click.option("--max-flows", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Flow table size (the kernel keeps two maps of this many flows, ~130 bytes each).")
@click.option("--max-classes", type=click.IntRange(1, 65536), default=4096, show_default=True,
              help="Classes the datapath has room for (a load-time size).")
@click.option("--max-clients", type=click.IntRange(1024, 2**24), default=MAX_CLIENTS, show_default=True,
              help="Per-client windows the datapath keeps, LRU (a load-time size: ~128 bytes of kernel memory each, "
                   "allocated at start; docs/clients.md).")
@click.option("--eta", type=float, help="GDRL / fill-ratio step size [default: 1/(2d)].")
@click.option("--quota", type=QUOTA, help="DQMP volume quota SIZE/PERIOD, e.g. 10TB/30d.")
@click.option("--lease-servers", default="", help="lease: node ids that serve leases [default: the lowest node id].")
@click.option("--on-lease-loss", type=click.Choice(["pessimistic", "optimistic", "safe"]), default="safe", show_default=True,
              help="lease: what a client enforces when it cannot renew.")
@click.option("--shadow", is_flag=True,
              help="Shadow mode for every class: count what the limits would drop (dropped_*), drop nothing "
                   "(per class: shadow = true in --config; docs/config.md).")
@click.option("--enforce", type=click.Choice(["police", "shape"]), default="police", show_default=True,
              help="How every class's local limit is enforced: police (drop what exceeds it) or shape (queue "
                   "it in an HTB class at that rate) (per class: enforce = \"shape\" in --config; docs/config.md).")
@click.option("--client-key", type=CLIENT_KEY,
              help="Per-client rule: who a client is, dst/LEN or dst/LEN4/LEN6 (remote address of egress "
                   "packets; src = local), e.g. dst/32 (docs/clients.md) [default: no per-client rule].")
@click.option("--client-measure", type=click.Choice(["bytes", "packets", "conns"]),
              help="Per-client rule: what is counted (conns = TCP connections opened or accepted) [default: bytes].")
@click.option("--client-threshold", type=THRESHOLD,
              help="Per-client rule: a rate (2mbit) or COUNT/WINDOW (2000/1200s), counted across all hosts.")
@click.option("--client-action", type=click.Choice(["throttle", "ban"]),
              help="Per-client rule: throttle (drop above the threshold) or ban (cut off for the rest of the "
                   "window plus --ban-duration) [default: throttle].")
@click.option("--ban-duration", "ban_duration_s", type=SPAN,
              help="Per-client rule, action ban: how long a ban lasts after its window [default: 0s].")
@click.option("--client-exempt", multiple=True, type=PREFIX, metavar="PREFIX",
              help="Per-client rule: addresses or prefixes never counted, throttled or banned (repeatable).")
@click.option("--state-dir", default="/var/lib/drl", show_default=True,
              help="Where allocators that must survive a restart keep their state (dqmp).")
@click.option("--gossip-mark", type=MARK, default=f"{GOSSIP_MARK:#x}", show_default=True,
              help="Socket mark of the gossip socket: only UDP from --listen's port with this mark skips the "
                   "limiter. Pick one no firewall or ip rule on the host uses.")
@click.option("--log-format", type=click.Choice(logs.FORMATS), default="logfmt", show_default=True,
              help="Log lines on stderr: logfmt or JSON, one event per line, same keys (docs/logs.md).")
@click.option("--metrics", metavar="HOST:PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (docs/metrics.md) [default: off].")
@click.option("--registry", metavar="etcd://HOST:PORT[,...]",
              help="Find peers and read classes in etcd (docs/registry.md); --peers may then be empty.")
@click.option("--cluster", help="The cluster's name in --registry: agents with the same name limit together.")
@click.option("--registry-ca", type=click.Path(dir_okay=False), help="CA certificate of etcd's TLS (https).")
@click.option("--registry-cert", type=click.Path(dir_okay=False), help="Client certificate for etcd (with --registry-key).")
@click.option("--registry-key", type=click.Path(dir_okay=False), help="Key of --registry-cert.")
@click.pass_context
def up(ctx: click.Context, config: str | None, **opts) -> None:
    """Attach the limiter to IFACE and run in the foreground until SIGTERM/SIGINT.

    \b
    Examples:
      drl-agent up --iface eth0 --global 50mbit
      drl-agent up --iface eth0 --global 50mbit --allocator grd \\
          --peers 10.0.0.2:7470 --key-file /etc/drl/cluster.key
      drl-agent up --config /etc/drl/drl.toml
      drl-agent up --iface eth0 --global 50mbit --listen 10.0.0.1:7470 \\
          --registry etcd://10.0.0.9:2379 --cluster prod --key-file /etc/drl/cluster.key
    """
    from drl.agent.config.build import ConfigError
    from drl.agent.service.daemon import run

    explicit = {name for name in opts
                if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    logs.setup(opts["log_format"])      # loading the config can warn (the key file); run() applies the file's
    try:
        cfg = load_config(config, opts, explicit)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(run(cfg))


def load_config(path: str | None, opts: dict, explicit: set[str], check_host: bool = True):
    """The Config of `drl-agent up`: the file at ``path`` (if any) under the flags in
    ``explicit``; its ``reload`` re-reads the file with the same flags on top, and its
    ``live_classes`` puts the registry's classes on top of the file as last read (an
    edit not yet reloaded does not go live with a change in etcd; configfile.merge)."""
    from drl.agent.config.build import ConfigError, build_classes, build_config

    def read() -> configfile.FileConfig | None:
        try:
            return configfile.read(path, up) if path else None
        except configfile.ConfigFileError as e:
            raise ConfigError(str(e)) from None

    loaded = [read()]

    def classes(live: dict[str, dict] | None = None, file: configfile.FileConfig | None = None):
        try:
            overlay = [configfile.table_options(table, up, f"etcd class {name!r}")
                       for name, table in sorted((live or {}).items())]
            agent_opts, tables = configfile.merge(file or loaded[0], opts, explicit, overlay)
        except configfile.ConfigFileError as e:
            raise ConfigError(str(e)) from None
        try:
            return build_classes(agent_opts, tables, cfg.peers, cfg.max_classes)
        except ConfigError as e:
            raise ConfigError(configfile.located(path, str(e))) from None

    def reload(live: dict[str, dict] | None = None):
        file = read()
        confs = classes(live, file)
        loaded[0] = file            # only a file that checks is the one etcd's classes go on
        return confs

    try:
        cfg = build_config(*configfile.merge(loaded[0], opts, explicit), check_host=check_host)
    except configfile.ConfigFileError as e:
        raise ConfigError(str(e)) from None
    except ConfigError as e:
        raise ConfigError(configfile.located(path, str(e))) from None
    return dataclasses.replace(cfg, reload=reload if path else None,
                               live_classes=classes if cfg.registry else None)


@main.command()
@click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True, help="The agent's control socket.")
def reload(socket_path: str) -> None:
    """Ask the agent on SOCKET to re-read its --config file (as SIGHUP does)."""
    try:
        # a reload may rewrite thousands of classes' rules and slots: more time than a status
        # gets (3 s), so systemd's ExecReload does not report a reload still going on as failed
        reply = request(socket_path, "reload", timeout_s=RELOAD_TIMEOUT_S)
    except ControlError as e:
        raise click.ClickException(str(e)) from None
    click.echo("reloaded: " + ", ".join(f"{what} {', '.join(reply[what]) or '-'}"
                                        for what in ("added", "changed", "removed")))


@main.command()
@click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True, help="The agent's control socket.")
def down(socket_path: str) -> None:
    """Ask the agent on SOCKET to detach and exit."""
    try:
        request(socket_path, "down")
    except ControlError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"agent on {socket_path} is stopping")


envvars_by_flag(main, "DRL")
