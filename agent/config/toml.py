"""drl.toml, the agent's config file, and the class tables etcd holds: views of the
options of agent/config/schema.py.

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

A key is a field's ``key`` (the long flag's name with ``_`` for ``-``; ``--class``
is ``match``), and every value goes through the field's parser, the one that
checks the flag, so a file can hold nothing that the command line would refuse.
Errors name the file and line (:class:`ConfigFileError`; :func:`key_line` finds
it, for lab/reader.py's experiment files too).  docs/config.md is the annotated
reference.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Iterable

from drl.agent.cluster.registry import NAME     # one rule for class names: a class is also a key in etcd
from drl.agent.config.schema import BY_KEY, CLASS_OPTIONS, FIELDS, MAX_CLASS_TABLES, PER_CLASS_ONLY, Field, OptionError


class ConfigFileError(Exception):
    """A config file that cannot be used: ``path:line: where: what``."""


@dataclass(frozen=True)
class FileConfig:
    agent: dict[str, Any]                    # option name -> value, as a flag would give it
    classes: tuple[dict[str, Any], ...]      # each: "name" plus class option names


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


def read(path: str) -> FileConfig:
    """Parse and check ``path``; raises ConfigFileError."""
    raw, data = _load(path)
    src = _Source(path, raw.splitlines())
    unknown = set(data) - {"agent", "class"}
    if unknown:
        raise ConfigFileError(f"{path}: unknown table [{sorted(unknown)[0]}] (use [agent] and [[class]])")
    agent = _table(src, data.get("agent", {}), "agent", None, forbid=PER_CLASS_ONLY)
    tables = data.get("class", [])
    if not isinstance(tables, list):
        raise ConfigFileError(f"{src.at('class', None, None)}: write classes as [[class]] tables")
    if len(tables) > MAX_CLASS_TABLES:       # before parsing them: a million tables cost minutes
        raise ConfigFileError(f"{path}: {len(tables)} [[class]] tables, at most {MAX_CLASS_TABLES} (--max-classes)")
    classes = tuple(_class(src, t, i) for i, t in enumerate(tables))
    first: dict[str, int] = {}
    for i, c in enumerate(classes):
        if first.setdefault(c["name"], i) != i:
            raise ConfigFileError(f"{src.at('class', i, 'name')}: class {c['name']!r} defined twice")
    return FileConfig(agent, classes)


def class_tables(path: str) -> list[dict[str, Any]]:
    """The file's [[class]] tables as written (file keys, e.g. ``global = "50mbit"``), each
    with [agent]'s class defaults it does not override folded in, so that a table means the
    same without the file (``drlctl import``); checked first like ``read``."""
    read(path)
    _, data = _load(path)
    keys = {f.key for f in FIELDS if f.name in CLASS_OPTIONS and f.name not in PER_CLASS_ONLY}
    defaults = {k: v for k, v in data.get("agent", {}).items() if k in keys}
    return [{**defaults, **table} for table in data.get("class", [])]


def located(path: str | None, message: str) -> str:
    """A class's refusal found past parsing ("class 'gold': ..." from agent/config/build.py), at its
    [[class]] table's line when the file defines that class; other messages as they are."""
    found = re.match(r"class '([^']+)': ", message)
    if not path or not found:
        return message
    try:
        text, data = _load(path)
        names = [t.get("name") if isinstance(t, dict) else None for t in data.get("class", [])]
    except (ConfigFileError, AttributeError):
        return message      # the file changed under us: the message alone
    if found.group(1) not in names:
        return message
    return f"{_Source(path, text.splitlines()).at('class', names.index(found.group(1)), None)}: {message}"


def table_options(table: dict[str, Any], origin: str) -> dict[str, Any]:
    """One [[class]] table from elsewhere (etcd) -> its option dict, as ``read`` gives a class;
    errors name ``origin``."""
    return _class(_Source(origin, []), table, 0)


def key_line(lines: list[str], table: str | None, index: int | None, key: str | None) -> int | None:
    """Line (from 1) of ``key`` in the ``index``-th ``[table]``/``[[table]]`` of a TOML text
    (``table=None``: the top level, before any header), else of that table's header, else None;
    a ``[table.sub]`` header counts as one of ``table``'s.  tomllib gives lines for syntax
    errors only, so the error messages of drl.toml and the lab's experiment files look here."""
    header = re.compile(rf"^\s*\[\[?\s*{re.escape(table)}(\.[^\]]*)?\s*\]\]?") if table else None
    count, start = -1, None if table else 0
    for n, line in enumerate(lines, 1):
        if header and header.match(line) and start is None:
            count += 1
            if count == (index or 0):
                start = n
            continue
        if start is None:
            continue
        if re.match(r"^\s*\[", line):
            break
        if key and re.match(rf"^\s*\"?{re.escape(key)}\"?\s*=", line):
            return n
    return start or None


def _load(path: str) -> tuple[str, dict]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot read the config file: {e.strerror}") from None
    try:
        text = raw.decode()
        return text, tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path}: {e}") from None


def _class(src: "_Source", table: Any, index: int) -> dict[str, Any]:
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
    opts = _table(src, table, "class", index, only=CLASS_OPTIONS, where=f"class {name!r}")
    return {"name": name, **opts}


def _table(src: "_Source", table: Any, header: str, index: int | None, *,
           only: Iterable[str] = (), forbid: Iterable[str] = (), where: str = "[agent]") -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigFileError(f"{src.at(header, index, None)}: [{header}] must be a table")
    out = {}
    for key, value in table.items():
        f = BY_KEY.get(key)
        if f is None or (only and f.name not in only) or f.name in forbid:
            raise ConfigFileError(f"{src.at(header, index, key)}: {where}: unknown key {key!r} "
                                  "(docs/config.md lists the keys)")
        try:
            out[f.name] = value_of(f, value)
        except OptionError as e:
            raise ConfigFileError(f"{src.at(header, index, key)}: {where}: {key}: {e}") from None
    return out


def value_of(f: Field, value: Any) -> Any:
    """A TOML value of ``f``'s key -> the option's value, as the flag would give it."""
    if f.multiple:
        return tuple(f.parse(_scalar(f, v)) for v in (value if isinstance(value, list) else [value]))
    if f.joined and isinstance(value, list):
        value = ",".join(map(str, value))
    if f.is_flag:
        return f.parse(value)
    return f.parse(_scalar(f, value))


def _scalar(f: Field, value: Any) -> Any:
    """Text for the parser; a number as it is for the numeric ones."""
    if isinstance(value, (list, dict)):
        raise OptionError(f"expected a single value, got {value!r}")
    return value if f.parse.numeric and not isinstance(value, bool) else str(value)


class _Source:
    """``path:line`` for messages."""

    def __init__(self, path: str, lines: list[str]):
        self.path, self.lines = path, lines

    def at(self, header: str, index: int | None, key: str | None) -> str:
        n = key_line(self.lines, header, index, key)
        return f"{self.path}:{n}" if n else self.path
