"""agent/logs.py: one event per line, logfmt that a logfmt parser reads back, JSON lines
with the same keys, and `drl-agent up --log-format` (flag and config file)."""
from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from drl.agent import logs
from drl.agent.service.daemon import Agent
from drl.cli.agent import main as agent_main, up

from daemon_harness import load
from daemon_harness import FakeDatapath, FakeShaper, agent, config

# -- a logfmt reader written apart from agent/logs.py ---------------------------------------
# go-logfmt's grammar: key=value pairs split by one space; a value is bare (no space, quote or
# '=') or double-quoted with strconv.Unquote's escapes.  Strict: anything else fails the test.

PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s"=\\]*)(?: (?=\S)|$)')
ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(["\\nrt]))|([^"\\])', re.S)
SIMPLE = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


def parse_logfmt(line: str) -> dict[str, str]:
    assert line.splitlines() == [line], f"not one line: {line!r}"
    out, pos = {}, 0
    while pos < len(line):
        m = PAIR.match(line, pos)
        assert m, f"not logfmt at {pos}: {line[pos:]!r}"
        key, value = m.groups()
        assert key not in out, f"{key} twice"
        out[key] = unquote(value) if value.startswith('"') else value
        pos = m.end()
    return out


def unquote(quoted: str) -> str:
    body, pos, out = quoted[1:-1], 0, []
    while pos < len(body):
        m = ESCAPE.match(body, pos)
        assert m, f"bad escape in {quoted!r} at {pos}"
        u4, u8, simple, plain = m.groups()
        out.append(plain or SIMPLE.get(simple) or chr(int(u4 or u8, 16)))
        pos = m.end()
    return "".join(out)


# -- records through both formatters ---------------------------------------------------------

class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def captured():
    """Records of the logger ``drl.test``, kept from the root's handlers."""
    handler, logger = Records(), logging.getLogger("drl.test")
    logger.addHandler(handler)
    logger.propagate, logger.level = False, logging.INFO
    yield handler.records
    logger.removeHandler(handler)


def both(record: logging.LogRecord) -> tuple[dict[str, str], dict]:
    """The record as logfmt (parsed) and as JSON (loaded)."""
    return parse_logfmt(logs.LogfmtFormatter().format(record)), json.loads(logs.JsonFormatter().format(record))


def one(captured, event: str, level=logging.INFO, /, **fields) -> logging.LogRecord:
    logs.get_logger("drl.test").log(level, event, **fields)
    return captured[-1]


EDGES = ["plain", "a b", 'say "hi"', "k=v", "=", '"', "", " ", "héllo wörld ✓", "🙂", "line\nbreak", "cr\rlf",
         "back\\slash", "tab\there", "sep\u2028arator", "nel\x85", "nul\x00esc\x1b", "tag\U000e0001", 'a\\"b',
         "trailing ", "x=", "-", "10.0.0.1:7470"]


@pytest.mark.parametrize("value", EDGES)
def test_every_value_survives_a_logfmt_parser_on_one_line(captured, value):
    parsed, doc = both(one(captured, "change", what=value, now="alive"))
    assert parsed["what"] == value and doc["what"] == value and parsed["now"] == "alive"


@given(st.text())
def test_any_text_survives_a_logfmt_parser(value):
    record = logging.LogRecord("drl.test", logging.INFO, __file__, 1, logs.Event("change", {"what": value}), (), None)
    assert parse_logfmt(logs.LogfmtFormatter().format(record))["what"] == value


def test_a_value_is_quoted_only_when_a_parser_needs_it(captured):
    line = logs.LogfmtFormatter().format(one(captured, "started", iface="eth0", listen="10.0.0.1:7470",
                                                auth="hmac-sha256", node="a b", empty=""))
    assert " iface=eth0 listen=10.0.0.1:7470 auth=hmac-sha256 node=\"a b\" empty=\"\"" in line


def test_numbers_stay_numbers_and_lists_none_and_bools_have_one_spelling(captured):
    parsed, doc = both(one(captured, "reloaded", classes=2, global_bps=50_000_000, interval_ms=100.0,
                           added=["gold", "silver"], removed=[], listen=None, detached=True))
    assert {k: parsed[k] for k in ("classes", "global_bps", "interval_ms", "added", "removed", "listen", "detached")} \
        == {"classes": "2", "global_bps": "50000000", "interval_ms": "100.0", "added": "gold,silver", "removed": "",
            "listen": "", "detached": "true"}
    assert (doc["global_bps"], doc["interval_ms"], doc["added"], doc["removed"], doc["listen"], doc["detached"]) \
        == (50_000_000, 100.0, ["gold", "silver"], [], None, True)
    assert json.loads(logs.JsonFormatter().format(one(captured, "x", v=float("nan"))))["v"] == "nan"
    nested = json.loads(logs.JsonFormatter().format(one(captured, "x", v=[1.0, float("inf")], w={"a": float("nan")})))
    assert (nested["v"], nested["w"]) == ([1.0, "inf"], {"a": "nan"})


def test_both_formats_have_the_same_keys_in_the_same_order(captured):
    parsed, doc = both(one(captured, "limit_changed", class_="gold", global_bps=8_000_000, version=3, from_="b"))
    assert list(parsed) == list(doc) == ["ts", "level", "event", "class", "global_bps", "version", "from"]
    assert (doc["event"], doc["class"], doc["from"]) == (parsed["event"], parsed["class"], parsed["from"]) \
        == ("limit_changed", "gold", "b")
    assert str(doc["version"]) == parsed["version"] and doc["ts"] == parsed["ts"]


def test_ts_is_rfc3339_utc_with_milliseconds_and_level_is_lowercase(captured):
    record = one(captured, "stop_failed", logging.ERROR, error="x")
    record.created = datetime(2026, 11, 24, 2, 0, 0, 123_456, timezone.utc).timestamp()
    parsed, doc = both(record)
    assert parsed["ts"] == doc["ts"] == "2026-11-24T02:00:00.123Z"
    assert parsed["level"] == "error" and both(one(captured, "reattached", logging.WARNING))[0]["level"] == "warning"
    now = datetime.now(timezone.utc)
    ts = datetime.fromisoformat(both(one(captured, "x"))[0]["ts"].replace("Z", "+00:00"))
    assert abs((now - ts).total_seconds()) < 5


def test_a_field_cannot_overwrite_ts_level_or_event(captured):
    parsed, _ = both(one(captured, "started", level_="debug", event="other", ts="yesterday", node="a"))
    assert (parsed["level"], parsed["event"], parsed["node"]) == ("info", "started", "a")
    assert parsed["ts"] != "yesterday"


def test_an_exception_is_one_line_with_the_error_and_json_also_has_the_traceback(captured):
    try:
        {}["missing"]
    except KeyError:
        logs.get_logger("drl.test").exception("crashed")
    parsed, doc = both(captured[-1])
    assert parsed["error"] == doc["error"] == "KeyError: 'missing'" and re.search(r"test_logs\.py:\d+$", parsed["at"])
    assert "traceback" not in parsed and "Traceback (most recent call last)" in doc["traceback"]
    assert list(doc)[:-1] == list(parsed)


def test_a_plain_message_is_the_event_message(captured):
    logging.getLogger("drl.test").warning("library says %s", "a b")
    parsed, doc = both(captured[-1])
    assert (parsed["event"], parsed["logger"], parsed["msg"]) == ("message", "drl.test", "library says a b")
    assert list(doc) == list(parsed)


def test_other_handlers_see_the_fields_as_logfmt(captured):
    assert one(captured, "signal", name="SIGHUP").getMessage() == "event=signal name=SIGHUP"


@pytest.fixture
def restore_logging():
    root, hook = logging.getLogger(), sys.excepthook
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    sys.excepthook = hook


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_setup_sends_every_logger_to_one_handler_and_logs_a_crash_as_one_event(restore_logging, fmt):
    logs.setup("json")
    out = io.StringIO()
    logs.setup(fmt, out)
    assert sum(getattr(h, "drl_events", False) for h in logging.getLogger().handlers) == 1
    logs.get_logger("drl.agent").info("started", node="a")
    try:
        raise RuntimeError("boom\nagain")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    first, crash = out.getvalue().splitlines()
    read = parse_logfmt if fmt == "logfmt" else json.loads
    assert read(first)["event"] == "started"
    assert (read(crash)["event"], read(crash)["level"], read(crash)["error"]) == ("crashed", "error",
                                                                                 "RuntimeError: boom\nagain")


def test_setup_writes_to_stderr_as_it_is_when_a_record_comes(restore_logging, capsys):
    logs.setup("logfmt")
    logs.get_logger("drl.agent").info("down_requested")
    assert "level=info event=down_requested" in capsys.readouterr().err


# -- the agent's events -----------------------------------------------------------------------

def events(caplog) -> dict[str, dict]:
    """The last record of each event the agent logged, parsed back from its logfmt line."""
    return {r.msg.name: parse_logfmt(logs.LogfmtFormatter().format(r)) for r in caplog.records
            if isinstance(r.msg, logs.Event)}


def test_a_lone_agent_logs_started_standalone_and_stopped_with_numbers(tmp_path, caplog, signals_kept):
    cfg = config(tmp_path, "--global", "50mbit", "--peers", "")
    caplog.set_level(logging.INFO, logger="drl.agent")
    with Agent(cfg, datapath=lambda cfg, gossip_port: FakeDatapath(), shaper=FakeShaper) as a:
        a.stopping = True
        assert a.serve() == 0
    got = events(caplog)
    assert {k: got["started"][k] for k in ("node", "iface", "classes", "allocator", "global_bps", "peers", "listen",
                                           "interval_ms", "auth")} == {
        "node": "a", "iface": "lo", "classes": "1", "allocator": "fps", "global_bps": "50000000", "peers": "0",
        "listen": "", "interval_ms": "1000.0", "auth": "none"}
    assert (got["standalone"]["gossip"], got["standalone"]["reason"]) == ("off", "no_peers")
    assert (got["stopped"]["iface"], got["stopped"]["detached"]) == ("lo", "true")


def test_a_live_set_logs_limit_changed_in_bits_per_second(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="drl.agent")
    with agent(config(tmp_path, "--global", "10mbit"), FakeDatapath()) as a:
        a.set_limit({"class": "default", "global": "6mbit"})
    changed = events(caplog)["limit_changed"]
    assert (changed["class"], changed["global_bps"], changed["from"]) == ("default", "6000000", "drlctl")
    assert abs(int(changed["version"]) - time.time() * 1000) < 60_000    # when it was set (cluster/limits.py)


# -- the option -------------------------------------------------------------------------------

def test_log_format_is_a_flag_and_a_config_key_and_the_flag_wins(tmp_path):
    assert up.make_context("up", []).params["log_format"] == "logfmt"
    assert up.make_context("up", ["--log-format", "json"]).params["log_format"] == "json"
    text = '[agent]\niface = "lo"\nnode_id = "a"\nlog_format = "json"\n\n[[class]]\nname = "x"\nglobal = "1mbit"\n'
    assert load(tmp_path, text).log_format == "json"
    assert load(tmp_path, text, "--log-format", "logfmt").log_format == "logfmt"


def test_a_bad_log_format_is_one_usage_error_line(tmp_path):
    result = CliRunner().invoke(agent_main, ["up", "--log-format", "xml"])
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2 and errors == ["Error: Invalid value for '--log-format': 'xml' is not one of "
                                                "'logfmt', 'json'."], result.output
    with pytest.raises(Exception, match=r"drl.toml:2: \[agent\]: log_format"):
        load(tmp_path, '[agent]\nlog_format = "xml"\n[[class]]\nname = "x"\nglobal = "1mbit"\n')


def test_every_event_the_agent_logs_is_in_docs_logs_md():
    root = Path(__file__).resolve().parents[3]
    source = "\n".join(p.read_text() for p in (root / "agent").rglob("*.py"))
    events = set(re.findall(r"\blog\.(?:info|warning|error|debug)\(\s*\"([a-z_]+)\"", source))
    doc = (root / "docs" / "logs.md").read_text()
    assert events and not sorted(e for e in events if f"`{e}`" not in doc)
