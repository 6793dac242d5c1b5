"""click parameter types: user text -> internal units, once, with clear errors.

All conversions go through agent/units.py; these types only turn a
:class:`~agent.units.UnitError` into click's one-line usage error.
"""
from __future__ import annotations

import click

from agent import units


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


class DurationType(_UnitType):
    """A duration ('100ms', '2s') -> seconds; must be positive."""
    name = "duration"

    @staticmethod
    def parse(text):
        seconds = units.parse_duration(text)
        if seconds <= 0:
            raise units.UnitError(f"duration must be positive: {text!r}")
        return seconds


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


RATE, SIZE, DURATION, QUOTA, PROBABILITY = RateType(), SizeType(), DurationType(), QuotaType(), ProbabilityType()
