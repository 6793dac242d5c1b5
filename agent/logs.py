"""The agent's log: one event per line on stderr, as logfmt or JSON lines.

    log = logs.get_logger("drl.agent")
    log.info("started", node="a", iface="eth0", global_bps=50_000_000)
    log.error("stop_failed", error=str(e))
    logs.setup("json")              # in `drl-agent up`, before the first event

    ts=2026-11-24T02:00:00.123Z level=info event=started node=a iface=eth0 global_bps=50000000
    {"ts": "2026-11-24T02:00:00.123Z", "level": "info", "event": "started", "node": "a", ...}

Both formats carry the same keys in the same order: ``ts`` (RFC 3339, UTC,
milliseconds), ``level``, ``event``, then the event's fields as given.  A field
named after a Python keyword takes a trailing ``_`` at the call site
(``class_=``, ``from_=``), which the log drops; ``msg`` and ``level`` are
LoggerAdapter's own arguments, and ``ts``, ``level``, ``event`` the log's.  Numbers stay numbers (rates in
bits/s, ``*_bps``); in logfmt a list is comma-joined and None is ``""``.  An
exception logged with ``exc_info`` (and any uncaught one, see :func:`setup`)
adds ``error`` and ``at`` (innermost frame); JSON also carries ``traceback``.
docs/logs.md lists the events.
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time
import traceback
from typing import Any, TextIO

FORMATS = ("logfmt", "json")
RESERVED = ("ts", "level", "event")       # written first by the formatter; a field of that name is dropped
_LOGGING_KWARGS = ("exc_info", "stack_info", "stacklevel", "extra")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class Event:
    """A record's ``msg``: the event and its fields.  ``str()`` is the logfmt text, so a
    handler that is not ours (pytest's caplog, a library's) still shows the fields."""
    __slots__ = ("name", "fields")

    def __init__(self, name: str, fields: dict[str, Any]):
        self.name, self.fields = name, fields

    def __str__(self) -> str:
        return logfmt({"event": self.name, **self.fields})


class EventLogger(logging.LoggerAdapter):
    """``log.info(event, **fields)``; the usual ``exc_info=`` and friends still work, and
    so does a plain ``log.info("text %s", x)`` (it logs as event ``message``)."""

    def process(self, msg: Any, kwargs: dict) -> tuple[Any, dict]:
        fields = {k.removesuffix("_"): kwargs.pop(k) for k in list(kwargs) if k not in _LOGGING_KWARGS}
        # an event name is an identifier; anything else is a %-style message, left as it is
        return (Event(msg, fields) if fields or (isinstance(msg, str) and msg.isidentifier()) else msg), kwargs


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name), {})


# -- formatting ---------------------------------------------------------------------------

def logfmt(fields: dict[str, Any]) -> str:
    return " ".join(f"{key}={quote(text(value))}" for key, value in fields.items())


def text(value: Any) -> str:
    """A value as logfmt writes it, before quoting."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(text, value))
    return repr(value) if isinstance(value, float) else str(value)


def quote(value: str) -> str:
    """Bare when a logfmt parser reads it back unchanged; else quoted, escaped as Go's
    strconv.Quote does, which logfmt parsers (go-logfmt, Loki, vector) unquote."""
    if value and not any(ch in ' ="\\' or not ch.isprintable() for ch in value):
        return value
    return '"' + "".join(_escape(ch) for ch in value) + '"'


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if ch.isprintable():
        return ch
    # U+2028, U+0085 ... end a line for some readers (str.splitlines): never raw
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"


def rfc3339(created: float) -> str:
    seconds, millis = divmod(int(created * 1000), 1000)     # one rounding for both parts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """ts, level, event, then the event's fields (and the error, if one was logged)."""
    out: dict[str, Any] = {"ts": rfc3339(record.created), "level": record.levelname.lower()}
    if isinstance(record.msg, Event):
        out["event"] = record.msg.name
        out.update((k, v) for k, v in record.msg.fields.items() if k not in RESERVED)
    else:                       # a plain message: ours before conversion, or a library's
        out.update(event="message", logger=record.name, msg=record.getMessage())
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        out.setdefault("error", f"{type(exc).__name__}: {exc}")
        out.setdefault("at", _where(record.exc_info[2]))
    return out


def _where(tb) -> str | None:
    frames = traceback.extract_tb(tb)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return logfmt(record_fields(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {k: _json_value(v) for k, v in record_fields(record).items()}
        if record.exc_info and record.exc_info[1] is not None:
            out["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        # ASCII only: no raw U+2028 or the like that would split the line for some readers
        return json.dumps(out, default=str)


def _json_value(value: Any) -> Any:
    """NaN and infinity are not JSON: as the text logfmt writes, inside lists and dicts too."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


FORMATTERS = {"logfmt": LogfmtFormatter, "json": JsonFormatter}


# -- setup --------------------------------------------------------------------------------

def setup(fmt: str = "logfmt", stream: TextIO | None = None) -> logging.Handler:
    """Every record (ours and any library's) to ``stream`` (stderr, which journald keeps)
    in ``fmt``, at INFO; an uncaught exception becomes one ``crashed`` event.  Calling
    it again replaces the handler it added."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "drl_events", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.setFormatter(FORMATTERS[fmt]())
    handler.drl_events = True
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    sys.excepthook = _log_crash
    return handler


class StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record: tests and click's CliRunner swap
    it, and a handler holding the old one would write to a closed file."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


def _log_crash(kind, exc, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):      # Ctrl-C is not a crash: Python's usual exit
        sys.__excepthook__(kind, exc, tb)
        return
    get_logger("drl.agent").error("crashed", exc_info=(kind, exc, tb))
