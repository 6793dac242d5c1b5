"""drl.toml, the agent's config file: one more source of `drl-agent up`'s own options.

    [agent]                          # any agent-wide option of `drl-agent up`
    iface = "eth0"
    node_id = "a"
    peers = ["b@10.0.0.2:7470", "c@10.0.0.3:7470"]
    key_file = "/etc/drl/cluster.key"
    allocator = "fps"                # class options here are defaults for every class

    [[class]]                        # one per class (tenant)
    name = "gold"
    global = "50mbit"
    match = ["dst=10.1.0.0/16", "mark=0x10"]

A key is the long option's name with ``_`` for ``-`` (``--node-id`` is
``node_id``), ``--class`` is ``match``, and every value goes through the very
click parameter type that checks the flag, so a file can hold nothing that
the command line would refuse.  Errors name the file and line
(:class:`ConfigFileError`).  docs/config.md is the annotated reference.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Iterable

import click

from drl.agent.cluster.registry import NAME     # one rule for class names: a class is also a key in etcd

# Options that belong to one class; the rest are agent-wide.
CLASS_OPTIONS = ("global_Bps", "allocator", "class_specs", "burst_bytes", "safe_Bps", "ewma", "flow_ewma",
                 "eta", "quota", "lease_servers", "on_lease_loss", "shadow", "enforce",
                 "client_key", "client_measure", "client_threshold", "client_action", "ban_duration_s",
                 "client_exempt")
PER_CLASS_ONLY = ("global_Bps", "class_specs")        # a default for every class makes no sense
NOT_IN_FILE = ("config",)          # the file does not name itself
_FILE_KEY = {"class_specs": "match", "client_key": "client", "client_measure": "measure",
             "client_threshold": "threshold", "client_action": "action", "client_exempt": "exempt"}


class ConfigFileError(Exception):
    """A config file that cannot be used: ``path:line: where: what``."""


@dataclass(frozen=True)
class FileConfig:
    agent: dict[str, Any]                    # option dest -> value, as click would pass it
    classes: tuple[dict[str, Any], ...]      # each: "name" plus class option dests


def merge(file: FileConfig | None, opts: dict[str, Any], explicit: set[str],
          overlay: Iterable[dict[str, Any]] = ()) -> tuple[dict, list[dict]]:
    """The options in force: (agent-wide options, one dict per class).

    Flags override the file: an agent-wide flag given on the command line (or
    in the environment) wins over [agent]; a class option given so wins over
    every class's own value; ``--global`` (with ``--class``) defines the class
    ``default``, replacing a file class of that name.  Unset class options
    take [agent]'s value, then the flag's default.  ``overlay`` (the classes
    in etcd, :func:`table_options`) is the live source: each replaces the keys
    it names of the class of its name, flags included, or adds the class.
    """
    file = file or FileConfig({}, ())
    if "class_specs" in explicit and opts.get("global_Bps") is None:
        raise ConfigFileError("--class selects the traffic of the class 'default': give --global RATE with it")
    agent = {k: v for k, v in opts.items() if k not in CLASS_OPTIONS}
    agent.update({k: v for k, v in file.agent.items() if k not in CLASS_OPTIONS and k not in explicit})
    defaults = {k: opts[k] for k in CLASS_OPTIONS if k not in PER_CLASS_ONLY}
    defaults.update({k: v for k, v in file.agent.items() if k in CLASS_OPTIONS and k not in explicit})
    forced = {k: opts[k] for k in CLASS_OPTIONS if k in explicit and k not in PER_CLASS_ONLY}
    classes = [{**defaults, "class_specs": (), **c, **forced} for c in file.classes]
    if opts.get("global_Bps") is not None:
        classes = [c for c in classes if c["name"] != "default"]
        classes.insert(0, {**defaults, **forced, "name": "default", "global_Bps": opts["global_Bps"],
                           "class_specs": opts["class_specs"]})
    for live in overlay:
        at = next((i for i, c in enumerate(classes) if c["name"] == live["name"]), None)
        if at is None:
            classes.append({**defaults, "class_specs": (), **live})
        else:
            classes[at] = {**classes[at], **live}
    if not classes and not agent.get("registry"):      # with one, the agent reads etcd's at start
        raise ConfigFileError("no class to limit: give --global RATE, or [[class]] tables in --config FILE")
    return agent, classes


def file_key(param: click.Parameter) -> str:
    return _FILE_KEY.get(param.name, param.opts[-1].lstrip("-").replace("-", "_"))


def _params(command: click.Command) -> dict[str, click.Parameter]:
    """File key -> the option it sets."""
    return {file_key(p): p for p in command.params if p.name not in NOT_IN_FILE}


def read(path: str, command: click.Command) -> FileConfig:
    """Parse and check ``path`` against ``command``'s options; raises ConfigFileError."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot read the config file: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path}: {e}") from None
    src = _Source(path, raw.decode(errors="replace").splitlines())
    params = _params(command)
    unknown = set(data) - {"agent", "class"}
    if unknown:
        raise ConfigFileError(f"{path}: unknown table [{sorted(unknown)[0]}] (use [agent] and [[class]])")
    agent = _table(src, data.get("agent", {}), "agent", None, params, forbid=PER_CLASS_ONLY)
    tables = data.get("class", [])
    if not isinstance(tables, list):
        raise ConfigFileError(f"{src.at('class', None, None)}: write classes as [[class]] tables")
    classes = tuple(_class(src, t, i, params) for i, t in enumerate(tables))
    names = [c["name"] for c in classes]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigFileError(f"{src.at('class', names.index(dup, names.index(dup) + 1), 'name')}: "
                              f"class {dup!r} defined twice")
    return FileConfig(agent, classes)


def class_tables(path: str, command: click.Command) -> list[dict[str, Any]]:
    """The file's [[class]] tables as written (file keys, e.g. ``global = "50mbit"``), each
    with [agent]'s class defaults it does not override folded in, so that a table means the
    same without the file (``drlctl import``); checked first like ``read``."""
    read(path, command)
    with open(path, "rb") as f:
        data = tomllib.load(f)
    keys = {file_key(p) for p in command.params if p.name in CLASS_OPTIONS and p.name not in PER_CLASS_ONLY}
    defaults = {k: v for k, v in data.get("agent", {}).items() if k in keys}
    return [{**defaults, **table} for table in data.get("class", [])]


def located(path: str | None, message: str) -> str:
    """A class's refusal found past parsing ("class 'gold': ..." from agent/config/build.py), at its
    [[class]] table's line when the file defines that class; other messages as they are."""
    found = re.match(r"class '([^']+)': ", message)
    if not path or not found:
        return message
    try:
        with open(path, "rb") as f:
            text = f.read().decode()
        names = [t.get("name") if isinstance(t, dict) else None for t in tomllib.loads(text).get("class", [])]
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
        return message      # the file changed under us: the message alone
    if found.group(1) not in names:
        return message
    return f"{_Source(path, text.splitlines()).at('class', names.index(found.group(1)), None)}: {message}"


def table_options(table: dict[str, Any], command: click.Command, origin: str) -> dict[str, Any]:
    """One [[class]] table from elsewhere (etcd) -> its option dict, as ``read`` gives a class;
    errors name ``origin``."""
    params = _params(command)
    return _class(_Source(origin, []), table, 0, params)


def _class(src: "_Source", table: Any, index: int, params: dict) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigFileError(f"{src.at('class', index, None)}: [[class]] must be a table")
    table = dict(table)
    name = table.pop("name", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigFileError(f"{src.at('class', index, 'name' if name is not None else None)}: [[class]] "
                              f"#{index + 1}: needs name = \"...\" (1-64 of A-Z a-z 0-9 _ . -, not dots alone), "
                              f"got {name!r}")
    if "global" not in table:
        raise ConfigFileError(f"{src.at('class', index, None)}: class {name!r}: missing global = \"RATE\"")
    opts = _table(src, table, "class", index, params, only=CLASS_OPTIONS, where=f"class {name!r}")
    return {"name": name, **opts}


def _table(src: "_Source", table: Any, header: str, index: int | None, params: dict, *,
           only: Iterable[str] = (), forbid: Iterable[str] = (), where: str = "[agent]") -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigFileError(f"{src.at(header, index, None)}: [{header}] must be a table")
    out = {}
    for key, value in table.items():
        param = params.get(key)
        if param is None or (only and param.name not in only) or param.name in forbid:
            raise ConfigFileError(f"{src.at(header, index, key)}: {where}: unknown key {key!r} "
                                  "(docs/config.md lists the keys)")
        try:
            out[param.name] = _convert(param, value)
        except click.BadParameter as e:
            raise ConfigFileError(f"{src.at(header, index, key)}: {where}: {key}: {e.message}") from None
    return out


def _convert(param: click.Parameter, value: Any) -> Any:
    """The value as the flag would have given it to the command."""
    if param.multiple:
        values = value if isinstance(value, list) else [value]
        return tuple(param.type.convert(_text(param, v), param, None) for v in values)
    if param.name in ("peers", "registry") and isinstance(value, list):
        value = ",".join(map(str, value))
    if getattr(param, "is_flag", False):
        if not isinstance(value, bool):
            raise click.BadParameter(f"expected true or false, got {value!r}")
        return value
    return param.type.convert(_text(param, value), param, None)


def _text(param: click.Parameter, value: Any) -> Any:
    """Unit types take text only: a bare 50 must not silently become 50 bytes/s."""
    if isinstance(value, (list, dict)):
        raise click.BadParameter(f"expected a single value, got {value!r}")
    numeric = isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))
    return value if numeric and not isinstance(value, bool) else str(value)


class _Source:
    """Line numbers for messages: tomllib gives them for syntax errors only."""

    def __init__(self, path: str, lines: list[str]):
        self.path, self.lines = path, lines

    def at(self, header: str, index: int | None, key: str | None) -> str:
        start, seen = None, -1
        head = re.compile(rf"^\s*\[\[?\s*{re.escape(header)}\s*\]\]?\s*(#.*)?$")
        for n, line in enumerate(self.lines, 1):
            if head.match(line):
                seen += 1
                if seen == (index or 0):
                    start = n
                    if key is None:
                        break
                continue
            if start is not None and re.match(r"^\s*\[", line):
                break
            if start is not None and re.match(rf"^\s*\"?{re.escape(key)}\"?\s*=", line):
                return f"{self.path}:{n}"
        return f"{self.path}:{start}" if start else self.path
