"""agent/config/toml.py's line finder, which drl.toml's errors and the lab's experiment files share."""
from __future__ import annotations

from drl.agent.config.toml import key_line

TEXT = """\
top = 1
[agent]
iface = "lo"   # a comment
"node_id" = "a"

[[class]]
name = "a"
global = "1mbit"

[[class]]   # the second
name = "b"

[params.fps]
eta = 0.1
""".splitlines()


def test_a_key_is_found_in_its_own_table():
    assert key_line(TEXT, "agent", None, "iface") == 3
    assert key_line(TEXT, "agent", None, "node_id") == 4         # a quoted key
    assert key_line(TEXT, "class", 1, "name") == 11
    assert key_line(TEXT, None, None, "top") == 1                # the top level


def test_a_missing_key_is_its_table_header_and_never_a_later_tables_key():
    assert key_line(TEXT, "class", 1, "global") == 10            # not line 8, the first class's
    assert key_line(TEXT, "class", 0, None) == 6
    assert key_line(TEXT, "params", 0, "eta") == 14              # [params.fps] is one of params'


def test_no_such_table_is_none():
    assert key_line(TEXT, "link", 0, "rate") is None
    assert key_line(TEXT, "class", 5, None) is None
