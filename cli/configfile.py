"""Moved to agent/config/toml.py: the agent reads its own file (a reload) and etcd's
class tables without its command line.  Kept for callers that still hand the click
command along, which the file's keys no longer come from."""
from __future__ import annotations

from typing import Any

from drl.agent.config import toml
from drl.agent.config.toml import ConfigFileError, FileConfig, located, merge

__all__ = ["ConfigFileError", "FileConfig", "class_tables", "located", "merge", "read", "table_options"]


def read(path: str, command: Any = None) -> FileConfig:
    return toml.read(path)


def class_tables(path: str, command: Any = None) -> list[dict[str, Any]]:
    return toml.class_tables(path)


def table_options(table: dict[str, Any], command: Any, origin: str) -> dict[str, Any]:
    return toml.table_options(table, origin)
