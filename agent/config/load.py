"""The sources of a Config put together: the options given (flags, by cli/agent.py, or
:func:`~drl.agent.config.schema.defaults`), the config file, and the class tables of etcd.

    cfg = load_config("/etc/drl/drl.toml", opts, explicit={"iface"})
    cfg.reload(live)            # SIGHUP, `drl-agent reload`: the file again, flags and etcd on top
    cfg.live_classes(live)      # etcd changed: its classes on the file as last read

Everything is checked by the schema's parsers and by build.py, so a running agent
refuses a bad reload or a bad etcd class exactly as `drl-agent up` refuses a bad start.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from drl.agent.config import toml
from drl.agent.config.build import ClassConf, Config, ConfigError, build_classes, build_config
from drl.agent.config.schema import defaults


def load_config(path: str | None, opts: dict[str, Any], explicit: set[str], check_host: bool = True) -> Config:
    """The Config of `drl-agent up`: the file at ``path`` (if any) under the options in
    ``explicit``; its ``reload`` re-reads the file with the same options on top, and its
    ``live_classes`` puts the registry's classes on top of the file as last read (an
    edit not yet reloaded does not go live with a change in etcd; toml.merge).  Raises
    ConfigError, at the file's line where it has one."""

    def read() -> toml.FileConfig | None:
        try:
            return toml.read(path) if path else None
        except toml.ConfigFileError as e:
            raise ConfigError(str(e)) from None

    loaded = [read()]

    def classes(live: dict[str, dict] | None = None, file: toml.FileConfig | None = None) -> tuple[ClassConf, ...]:
        try:
            overlay = [toml.table_options(table, f"etcd class {name!r}") for name, table in sorted((live or {}).items())]
            agent_opts, tables = toml.merge(file or loaded[0], opts, explicit, overlay)
        except toml.ConfigFileError as e:
            raise ConfigError(str(e)) from None
        try:
            return build_classes(agent_opts, tables, cfg.peers, cfg.max_classes)
        except ConfigError as e:
            raise ConfigError(toml.located(path, str(e))) from None

    def reload(live: dict[str, dict] | None = None) -> tuple[ClassConf, ...]:
        file = read()
        confs = classes(live, file)
        loaded[0] = file            # only a file that checks is the one etcd's classes go on
        return confs

    try:
        cfg = build_config(*toml.merge(loaded[0], opts, explicit), check_host=check_host)
    except toml.ConfigFileError as e:
        raise ConfigError(str(e)) from None
    except ConfigError as e:
        raise ConfigError(toml.located(path, str(e))) from None
    return dataclasses.replace(cfg, reload=reload if path else None,
                               live_classes=classes if cfg.registry else None)


def import_tables(path: str) -> list[dict[str, Any]]:
    """The file's [[class]] tables for etcd (``drlctl import``), refused (ConfigError, at
    ``path:line`` where known) unless an agent would accept them: the file's syntax and
    types, then each class as a ClassConf."""
    try:
        tables = toml.class_tables(path)
        agent_opts, classes = toml.merge(toml.read(path), defaults(), set())
        build_classes(agent_opts, classes, (), agent_opts["max_classes"])
    except toml.ConfigFileError as e:
        raise ConfigError(str(e)) from None
    except ConfigError as e:
        where = toml.located(path, str(e))
        raise ConfigError(where if where.startswith(path) else f"{path}: {where}") from None
    if not tables:
        raise ConfigError(f"{path}: no [[class]] table to import")
    return tables
