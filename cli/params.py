"""click parameter types: user text -> internal units, once, with clear errors.

All conversions go through agent/units.py; these types only turn a
:class:`~agent.units.UnitError` into click's one-line usage error.
"""
from __future__ import annotations

import importlib.util

import click

from drl.agent.clients import table as clients
from drl.agent import units


def version_option(command):
    """--version: the installed distribution's version (pyproject.toml).

    A new click option per command: click's callback remembers the first
    program name it printed, so one shared decorator would name every CLI alike.
    """
    return click.version_option(package_name="drl", message="%(prog)s %(version)s")(command)


def envvars_by_flag(group: click.Group, prefix: str) -> None:
    """Each option's environment variable is named after its long flag under ``prefix`` and
    the command (DRL_UP_GLOBAL for ``drl-agent up --global``, DRL_SOCKET for ``drlctl
    --socket``), as docs/config.md says.  click's auto_envvar_prefix names it after the
    parameter instead (DRL_UP_GLOBAL_BPS), which still works.  Call once every command
    is added."""
    def walk(command: click.Command, pre: str) -> None:
        for p in command.params:
            flags = [o for o in p.opts if o.startswith("--")] if isinstance(p, click.Option) else []
            if flags and p.envvar is None and p.name:
                by_flag = f"{pre}_{flags[0][2:].replace('-', '_').upper()}"
                p.envvar = [by_flag, f"{pre}_{p.name.upper()}"] if by_flag != f"{pre}_{p.name.upper()}" else by_flag
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{pre}_{name.replace('-', '_').upper()}")
    walk(group, prefix)


def require_extra(extra: str, *modules: str) -> None:
    """One line instead of an ImportError when an optional extra is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"this command needs {', '.join(missing)}: pip install 'drl[{extra}]'")


class _UnitType(click.ParamType):
    parse = staticmethod(lambda text: text)

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except (units.UnitError, ValueError) as e:
            self.fail(str(e), param, ctx)


class RateType(_UnitType):
    """A tc-style rate ('50mbit', '10MBps') -> bytes/s."""
    name = "rate"
    parse = staticmethod(units.parse_rate)


class SizeType(_UnitType):
    """A size ('75KB', '1MB') -> bytes."""
    name = "size"
    parse = staticmethod(units.parse_size)


def _duration(text: str, positive: bool) -> float:
    seconds = units.parse_duration(text)
    if seconds < 0 or (positive and seconds == 0):
        raise units.UnitError(f"duration must be {'positive' if positive else '0 or more'}: {text!r}")
    return seconds


class DurationType(_UnitType):
    """A duration ('100ms', '2s') -> seconds; must be positive."""
    name = "duration"
    parse = staticmethod(lambda text: _duration(text, positive=True))


class QuotaType(_UnitType):
    """A volume quota ('10TB/30d') -> (bytes, seconds)."""
    name = "quota"
    parse = staticmethod(units.parse_quota)


class ProbabilityType(_UnitType):
    name = "probability"

    @staticmethod
    def parse(text):
        p = float(text)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability must be within 0..1: {text!r}")
        return p


class SpanType(_UnitType):
    """A duration that may be 0 ('0s', '3600s', '1h') -> seconds (a ban's extra time)."""
    name = "duration"
    parse = staticmethod(lambda text: _duration(text, positive=False))


class ClientKeyType(_UnitType):
    """Who a client is: 'dst/32', 'dst/24/56', 'src/64' (agent/clients/table.py)."""
    name = "client-key"
    parse = staticmethod(clients.parse_client_key)


class ThresholdType(_UnitType):
    """A per-client threshold: a rate ('2mbit') or COUNT/WINDOW ('2000/1200s')."""
    name = "threshold"
    parse = staticmethod(clients.parse_threshold)


class PrefixType(_UnitType):
    """An address or CIDR prefix, either family."""
    name = "prefix"
    parse = staticmethod(clients.parse_prefix)


RATE, SIZE, DURATION, QUOTA, PROBABILITY = RateType(), SizeType(), DurationType(), QuotaType(), ProbabilityType()
SPAN, CLIENT_KEY, THRESHOLD, PREFIX = SpanType(), ClientKeyType(), ThresholdType(), PrefixType()
