"""click parameter types: user text -> internal units, once, with clear errors.

All conversions are the parsers of agent/config/schema.py (which use
agent/units.py); these types only turn their OptionError into click's one-line
usage error, and :func:`field_options` makes the schema's fields click options.
"""
from __future__ import annotations

import importlib.util

import click

from drl.agent.config import schema


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


class _Parsed:
    """A click type around a parser of agent/config/schema.py: the parser's OptionError
    becomes click's one-line usage error, naming the flag."""
    parser: schema.Parser

    def convert(self, value, param, ctx):
        if not isinstance(value, str) and not self.parser.numeric:
            return value            # already converted (a default given as a value)
        try:
            return self.parser(value)
        except schema.OptionError as e:
            self.fail(str(e), param, ctx)


class _Type(_Parsed, click.ParamType):
    def __init__(self, parser: schema.Parser):
        self.parser, self.name = parser, parser.name


# click's own types for the kinds whose --help it describes ([a|b], INTEGER RANGE ... x>=1),
# converting through the parser all the same
class _Choice(_Parsed, click.Choice):
    def __init__(self, parser: schema.Choice):
        click.Choice.__init__(self, parser.choices)
        self.parser = parser


class _IntRange(_Parsed, click.IntRange):
    def __init__(self, parser: schema.IntRange):
        click.IntRange.__init__(self, parser.lo, parser.hi)
        self.parser = parser


class _FloatRange(_Parsed, click.FloatRange):
    def __init__(self, parser: schema.FloatRange):
        click.FloatRange.__init__(self, parser.lo, parser.hi, max_open=parser.hi_open)
        self.parser = parser


def param_type(parser: schema.Parser) -> click.ParamType:
    for kind, wrap in ((schema.Choice, _Choice), (schema.IntRange, _IntRange), (schema.FloatRange, _FloatRange)):
        if isinstance(parser, kind):
            return wrap(parser)
    return _Type(parser)


def field_options(fields: tuple[schema.Field, ...]):
    """Decorator: one click option per field of the configuration model, in the fields' order."""
    def decorate(command):
        for f in reversed(fields):
            kw = dict(help=f.help, default=f.default, show_default=f.show_default, metavar=f.metavar,
                      multiple=f.multiple, envvar=f.envvar)
            if f.is_flag:
                kw.update(is_flag=True, default=bool(f.default))
            else:
                kw.update(type=param_type(f.parse))
            command = click.option(f.flag, f.name, **kw)(command)
        return command
    return decorate


RATE, SIZE, DURATION, QUOTA, PROBABILITY = map(param_type, (schema.RATE, schema.SIZE, schema.DURATION, schema.QUOTA,
                                                            schema.PROBABILITY))
SPAN, CLIENT_KEY, THRESHOLD, PREFIX = map(param_type, (schema.SPAN, schema.CLIENT_KEY, schema.THRESHOLD, schema.PREFIX))
MARK = param_type(schema.MARK)
