"""drlctl: inspect a running drl-agent through its control socket.

Examples:

    drlctl status
    drlctl --socket /run/drl/eth0.sock status --json
    drlctl classes
    drlctl set gold --global 100mbit
    drlctl clients gold
    drlctl unban 203.0.113.0/24
    drlctl top
    drlctl import /etc/drl/drl.toml --registry etcd://10.0.0.9:2379 --cluster prod
    drlctl class delete gold --registry etcd://10.0.0.9:2379 --cluster prod
"""
from __future__ import annotations

import json
import sys

import click

from drl.agent.config.schema import DEFAULT_SOCKET
from drl.agent.service.control import ControlError, request
from drl.agent.units import UnitError, format_rate, format_size, parse_rate
from drl.cli.params import envvars_by_flag, version_option
from drl.cli.top import top


@click.group(context_settings={"auto_envvar_prefix": "DRL", "help_option_names": ["-h", "--help"]})
@version_option
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
    show(ask(socket_path, "status")["status"], as_json, render)


def ask(socket_path: str, cmd: str, **args) -> dict:
    """The agent's reply; a ControlError becomes click's one-line error."""
    try:
        return request(socket_path, cmd, **args)
    except ControlError as e:
        raise click.ClickException(str(e)) from None


def show(data, as_json: bool, render_text) -> None:
    if as_json:
        json.dump(data, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        click.echo(render_text(data))


@main.command("set")
@click.argument("class_name", metavar="CLASS")
@click.option("--global", "global_rate", required=True, metavar="RATE", help="The class's new global limit, e.g. 100mbit.")
@click.pass_obj
def set_limit(socket_path: str, class_name: str, global_rate: str) -> None:
    """Change CLASS's global limit on every agent (a new version, gossiped within seconds).

    \b
    Examples:
      drlctl set gold --global 100mbit
    """
    try:
        parse_rate(global_rate)
    except UnitError as e:
        raise click.BadParameter(str(e), param_hint="--global") from None
    click.echo(render_set(ask(socket_path, "set", **{"class": class_name, "global": global_rate})))


def render_set(reply: dict) -> str:
    """The set reply as a line.  With a registry no version is given: the change is etcd's to
    order, and every agent, this one too, applies it from etcd's watch (docs/registry.md)."""
    head = f"{reply['class']}: global {format_rate(reply['global_limit_bps'] / 8)}"
    if reply.get("classes_refused"):        # written to etcd, but no agent applies etcd's classes now
        return (f"{head}; registry: {reply['registry']}, but etcd's classes do not check, so no agent applies "
                f"it until they do: {reply['classes_refused']}")
    if reply.get("registry") == "queued":
        return f"{head}; registry: queued, every agent applies it from etcd within a few intervals"
    if reply.get("registry") == "pending":
        return f"{head}; registry: pending, etcd is unreachable: written when it is back (lost if the agent restarts)"
    if reply.get("peers") == 0:
        return f"{head} (version {reply['limit_version']})"      # a lone agent: nobody else to follow
    return f"{head} (version {reply['limit_version']}); the other agents follow within a few intervals"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the classes as JSON (*_bps = bits/s).")
@click.pass_obj
def classes(socket_path: str, as_json: bool) -> None:
    """One row per class: limits, demand, drops, limit version."""
    show(ask(socket_path, "status")["status"]["classes"], as_json, render_classes)


CLASS_COLUMNS = (("CLASS", "name", str), ("ALLOCATOR", "allocator", str),
                 ("GLOBAL", "global_limit_bps", "rate"), ("EFFECTIVE", "effective_limit_bps", "rate"),
                 ("LOCAL", "local_limit_bps", "rate"), ("DEMAND", "demand_bps", "rate"),
                 ("DROP P", "drop_probability", "{:.3f}".format), ("PASSED", "passed_bytes", format_size),
                 ("DROPPED", "dropped_bytes", format_size), ("VERSION", "limit_version", str),
                 ("SHADOW", "shadow", lambda on: "yes" if on else ""),   # DROPPED: would have dropped
                 # shape!: shape mode could not be set up, so the class is policed (log: shape_failed)
                 ("ENFORCE", None, lambda c: "shape!" if c.get("enforce") == "shape" and not c.get("shaped")
                  else c.get("enforce", "")))


def render_classes(rows: list[dict]) -> str:
    """The classes as an aligned table."""
    fmt = {"rate": lambda bps: format_rate(bps / 8)}
    cells = [[title for title, _, _ in CLASS_COLUMNS]]
    cells += [[fmt.get(f, f)(row if key is None else row.get(key)) for _, key, f in CLASS_COLUMNS]
              for row in rows]   # get: older agents; no key: the cell needs the whole row
    widths = [max(len(r[i]) for r in cells) for i in range(len(CLASS_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def render(st: dict) -> str:
    """The human view of a status dict."""
    rate = lambda key: format_rate(st[key] / 8)  # noqa: E731  (status rates are bits/s)
    lines = [
        f"node        {st['node_id']} on {st['interface']}  (allocator {st['allocator']}, interval {st['interval_s'] * 1000:g} ms, "
        f"{len(st['classes'])} class{'es' if len(st['classes']) != 1 else ''}: drlctl classes)",
        f"global      {rate('global_limit_bps')}   effective {rate('effective_limit_bps')}",
        f"local       {rate('local_limit_bps')}   mode {st['mode']}   drop probability {st['drop_probability']:.3f}",
        f"measured    demand {rate('demand_bps')}   sent {rate('rate_bps')}   flows {st['flows']}",
        f"enforce     {st.get('enforce', '?')}" + (f"  (the default polices: {st['enforce_reason']}; "
                                                   "--enforce shape queues instead)" if st.get("enforce_reason") else ""),
        f"passed      {format_size(st['passed_bytes'])} in {st['passed_packets']} packets",
        f"dropped     {format_size(st['dropped_bytes'])} in {st['dropped_packets']} packets"
        + ("  (shadow mode: would have dropped; nothing was)" if st.get("shadow") else ""),
    ]
    lines += [f"hint        {c['name']}: {c['hint']}" for c in st.get("classes", []) if c.get("hint")]
    if ahead := st.get("datapath", {}).get("ahead"):
        lines.append(f"warning     tc filters at pref {','.join(map(str, ahead))} run before drl's on egress: "
                     "what they classify is not limited")
    if st.get("datapath", {}).get("unseen"):
        lines.append(f"warning     {format_rate(st['datapath']['unseen_bps'] / 8)} left {st['interface']} that drl's "
                     "program never counted: it bypasses the limit")
    g = st["gossip"]
    lines.append(f"gossip      sent {g['sent']}  received {g['received']}  lost {g['lost']}  "
                 f"rejected {g['rejected']}  control {format_rate(g['control_bps'] / 8)}")
    peers = st.get("peers", [])
    lines.append(f"peers       {len(peers)}" + ("" if peers else " (running alone: no gossip)"))
    if unseen := st.get("unseen_peers"):
        lines.append(f"warning     capacity reserved for {len(unseen)} unseen peers (never heard): {', '.join(unseen)}")
    for p in peers:
        seen = "never" if p["last_seen_s"] is None else f"{p['last_seen_s']:.1f} s ago"
        lines.append(f"  {p['node_id'] or '?':<16} {p['address']:<24} {p['state']:<6} last seen {seen}")
    if (tree := st.get("sum_tree")) is not None:
        role = "sums its group" if tree["summer"] == st["node_id"] else f"sends to {tree['summer']}"
        covers = "no fresh sum" if tree["covers"] is None else f"reads a sum of {tree['covers']} peers"
        lines.append(f"sum tree    {role}, {tree['leaves']} leaves, {covers}"
                     + (f", passed over {' '.join(tree['passed_over'])}" if tree["passed_over"] else ""))
    lines += render_registry(st.get("registry"))
    for key, value in sorted(st.get("allocator_state", {}).items()):
        lines.append(f"  {st['allocator']}.{key} = {value}")
    return "\n".join(lines)


def render_registry(reg: dict | None) -> list[str]:
    """The registry's lines of the status, none without --registry."""
    if reg is None:
        return []
    lines = [f"registry    {reg['state']} for {reg['for_s']:.0f} s  cluster {reg['cluster']}  "
             f"{len(reg['members'])} member{'s' if len(reg['members']) != 1 else ''}  "
             f"{' '.join(reg['endpoints'])}"]
    if reg.get("error"):
        lines.append(f"  error: {reg['error']}")
    if reg.get("classes_refused"):
        lines.append(f"  etcd's classes refused: {reg['classes_refused']}")
    if reg.get("bad_keys"):
        lines.append(f"  keys not of the layout (ignored): {' '.join(reg['bad_keys'])}")
    return lines


@main.command()
@click.argument("class_name", metavar="[CLASS]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the clients as JSON (*_count per window; *_bps = bits/s).")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Clients per class.")
@click.pass_obj
def clients(socket_path: str, class_name: str | None, as_json: bool, limit: int) -> None:
    """The top clients of each class with a client rule (or of CLASS): global and local
    counts, state (ok, throttled, banned until T) and the hosts that see them.

    \b
    Examples:
      drlctl clients
      drlctl clients gold --json | jq '.[0].clients[0]'
    """
    args = {"limit": limit} if class_name is None else {"class": class_name, "limit": limit}
    show(ask(socket_path, "clients", **args)["classes"], as_json, render_clients)


@main.command()
@click.argument("prefix", metavar="PREFIX")
@click.option("--class", "class_name", metavar="NAME", help="Only this class's bans [default: every class].")
@click.pass_obj
def unban(socket_path: str, prefix: str, class_name: str | None) -> None:
    """Lift every ban PREFIX covers (or the one an address lies in), on every agent: this one
    now, the others with its next reports.

    \b
    Examples:
      drlctl unban 203.0.113.0/24
      drlctl unban 198.51.100.7 --class api
    """
    args = {"prefix": prefix} if class_name is None else {"prefix": prefix, "class": class_name}
    for lifted in ask(socket_path, "unban", **args)["lifted"]:
        click.echo(f"unbanned {lifted['client']} in class {lifted['class']}")


def render_clients(classes: list[dict]) -> str:
    """Per class its rule, then one aligned row per client."""
    if not classes:
        return "no class has a client rule (docs/clients.md)"
    out = []
    for c in classes:
        rule = f"client {c['client_key']}   {c['measure']}   threshold {c['threshold']['text']}   {c['action']}"
        if c["action"] == "ban":
            rule += f" (+{c['ban_duration_s']:g} s)"
        cells = [["CLIENT", "GLOBAL", "LOCAL", "STATE", "HOSTS"]]
        cells += [[r["client"], _amount(c, r, "global"), _amount(c, r, "local"), _state(c, r),
                   ",".join(r["hosts"]) or "-"] for r in c["clients"]]
        widths = [max(len(row[i]) for row in cells) for i in range(5)]
        out += [f"class {c['name']}   {rule}"]
        out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(out)


def _amount(c: dict, row: dict, which: str) -> str:
    if row["state"] == "banned":
        return "-"
    if c["measure"] == "bytes":
        return format_rate(row[f"{which}_bps"] / 8)
    return f"{row[f'{which}_count']:.0f}/{c['threshold']['window_s']:g}s"


def _state(c: dict, row: dict) -> str:
    if row["state"] == "banned":
        return f"banned for {row['banned_for_s']:.0f} s"
    if row["share_count"] is None:
        return row["state"]
    share = (format_rate(row["share_bps"] / 8) if c["measure"] == "bytes"
             else f"{row['share_count']:.0f}/{c['threshold']['window_s']:g}s")
    return f"{row['state']}, share {share}"       # ok, share: held at the line, under its threshold


@main.command("import")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--registry", required=True, metavar="etcd://HOST:PORT[,...]", help="The etcd the agents read.")
@click.option("--cluster", required=True, help="The agents' --cluster.")
@click.option("--registry-ca", type=click.Path(dir_okay=False), help="CA certificate of etcd's TLS (https).")
@click.option("--registry-cert", type=click.Path(dir_okay=False), help="Client certificate for etcd (with --registry-key).")
@click.option("--registry-key", type=click.Path(dir_okay=False), help="Key of --registry-cert.")
def import_file(path: str, registry: str, cluster: str, registry_ca: str | None, registry_cert: str | None,
                registry_key: str | None) -> None:
    """Write FILE's [[class]] tables (a drl.toml) into etcd, replacing classes of the same name;
    every agent of the cluster applies them (docs/registry.md).  FILE is checked as
    `drl-agent up --config` checks it, and nothing is written if it is refused.

    \b
    Examples:
      drlctl import /etc/drl/drl.toml --registry etcd://10.0.0.9:2379 --cluster prod
    """
    from drl.agent.cluster.registry import RegistryError, import_classes, registry_config

    try:
        tables = checked_class_tables(path)
        cfg = registry_config(registry, cluster, registry_ca, registry_cert, registry_key)
        n = import_classes(cfg, tables)
    except RegistryError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"imported {n} class{'es' if n != 1 else ''} into {cfg.prefix}classes/")


@main.group("class")
def class_group() -> None:
    """Classes in etcd (with --registry): see also import."""


@class_group.command("delete")
@click.argument("name")
@click.option("--registry", required=True, metavar="etcd://HOST:PORT[,...]", help="The etcd the agents read.")
@click.option("--cluster", required=True, help="The agents' --cluster.")
@click.option("--registry-ca", type=click.Path(dir_okay=False), help="CA certificate of etcd's TLS (https).")
@click.option("--registry-cert", type=click.Path(dir_okay=False), help="Client certificate for etcd (with --registry-key).")
@click.option("--registry-key", type=click.Path(dir_okay=False), help="Key of --registry-cert.")
def class_delete(name: str, registry: str, cluster: str, registry_ca: str | None, registry_cert: str | None,
                 registry_key: str | None) -> None:
    """Delete class NAME from etcd, for good: every agent drops etcd's table of it, and one with
    a class of that name of its own (--global, --config) goes back to that one.  A class key
    deleted any other way (etcdctl del, an etcd wiped) is taken for lost, and the agents
    write back the table they hold (docs/registry.md).

    \b
    Examples:
      drlctl class delete gold --registry etcd://10.0.0.9:2379 --cluster prod
    """
    from drl.agent.cluster.registry import RegistryError, delete_class, registry_config

    try:
        cfg = registry_config(registry, cluster, registry_ca, registry_cert, registry_key)
        deleted = delete_class(cfg, name)
    except RegistryError as e:
        raise click.ClickException(str(e)) from None
    if not deleted:
        raise click.ClickException(f"no class {name!r} in etcd under {cfg.prefix}classes/ (nothing written)")
    click.echo(f"deleted class {name!r} from {cfg.prefix}classes/ (tombstone {cfg.prefix}deleted/{name})")


def checked_class_tables(path: str) -> list[dict]:
    """FILE's [[class]] tables, refused (ClickException, file:line where known) unless the agent
    would accept them (agent/config/load.py import_tables)."""
    from drl.agent.config.build import ConfigError
    from drl.agent.config.load import import_tables

    try:
        return import_tables(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


main.add_command(top)
envvars_by_flag(main, "DRL")      # DRL_SOCKET, as --help says
