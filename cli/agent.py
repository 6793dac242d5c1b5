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

import sys

import click
from click.core import ParameterSource

from drl.agent import logs
from drl.agent.config import schema
from drl.agent.config.load import load_config
from drl.agent.config.schema import DEFAULT_SOCKET
from drl.agent.service.control import ControlError, request
from drl.cli.params import MARK, envvars_by_flag, field_options, version_option

__all__ = ["MARK", "load_config", "main", "up"]     # MARK, load_config: what tests reach through the CLI

RELOAD_TIMEOUT_S = 60.0


@click.group(context_settings={"auto_envvar_prefix": "DRL", "help_option_names": ["-h", "--help"]})
@version_option
def main() -> None:
    """Run the drl agent (distributed rate limiter)."""


@main.command()
@click.option("--config", type=click.Path(dir_okay=False),
              help="TOML file with agent options and [[class]] tables (docs/config.md); flags override it.")
@field_options(schema.FIELDS)     # the configuration model (agent/config/schema.py), flag by flag
@click.pass_context
def up(ctx: click.Context, config: str | None, **opts) -> None:
    """Attach the limiter to IFACE and run in the foreground until SIGTERM/SIGINT.

    \b
    Examples:
      drl-agent up --iface eth0 --global 50mbit
      drl-agent up --iface eth0 --global 20mbit --class sport=8080,proto=tcp
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
