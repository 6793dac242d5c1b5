"""drlctl: inspect a running drl-agent through its control socket.

Examples:

    drlctl status
    drlctl --socket /run/drl/eth0.sock status --json
"""
from __future__ import annotations

import json
import sys

import click

from agent.control import DEFAULT_SOCKET, ControlError, request
from agent.units import format_rate, format_size


@click.group(context_settings={"auto_envvar_prefix": "DRL", "help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True,
              help="The agent's control socket (env DRL_SOCKET).")
@click.pass_context
def main(ctx: click.Context, socket_path: str) -> None:
    """Inspect a running drl-agent."""
    ctx.obj = socket_path


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (keys name their unit; *_bps = bits/s).")
@click.pass_obj
def status(socket_path: str, as_json: bool) -> None:
    """Show the agent's limits, rates, counters, peers and gossip.

    \b
    Examples:
      drlctl status
      drlctl status --json | jq .local_limit_bps
    """
    try:
        st = request(socket_path, "status")["status"]
    except ControlError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        json.dump(st, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return
    click.echo(render(st))


def render(st: dict) -> str:
    """The human view of a status dict."""
    rate = lambda key: format_rate(st[key] / 8)  # noqa: E731  (status rates are bits/s)
    lines = [
        f"node        {st['node_id']} on {st['interface']}  (allocator {st['allocator']}, interval {st['interval_s'] * 1000:g} ms)",
        f"global      {rate('global_limit_bps')}   effective {rate('effective_limit_bps')}",
        f"local       {rate('local_limit_bps')}   mode {st['mode']}   drop probability {st['drop_probability']:.3f}",
        f"measured    demand {rate('demand_bps')}   sent {rate('rate_bps')}   flows {st['flows']}",
        f"passed      {format_size(st['passed_bytes'])} in {st['passed_packets']} packets",
        f"dropped     {format_size(st['dropped_bytes'])} in {st['dropped_packets']} packets",
    ]
    g = st["gossip"]
    lines.append(f"gossip      sent {g['sent']}  received {g['received']}  lost {g['lost']}  "
                 f"rejected {g['rejected']}  control {format_rate(g['control_bps'] / 8)}")
    peers = st.get("peers", [])
    lines.append(f"peers       {len(peers)}" + ("" if peers else " (running alone)"))
    for p in peers:
        seen = "never" if p["last_seen_s"] is None else f"{p['last_seen_s']:.1f} s ago"
        lines.append(f"  {p['node_id'] or '?':<16} {p['address']:<24} {p['state']:<6} last seen {seen}")
    for key, value in sorted(st.get("allocator_state", {}).items()):
        lines.append(f"  {st['allocator']}.{key} = {value}")
    return "\n".join(lines)
