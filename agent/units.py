"""Units: the one place user-facing quantities are parsed and printed.

Inside drl every rate is **bytes per second** (names end in ``_Bps``), every
size is bytes, every duration is seconds (float).  Only the edges convert:
user input here, and JSON output (``*_bps`` keys are bits per second) through
:func:`to_bps`.

Rates follow tc(8): ``bit kbit mbit gbit tbit`` are bits/s (SI, x1000; the
``kibit``/``mibit``/``gibit`` forms are x1024) and ``Bps KBps MBps GBps`` are
bytes/s.  tc's lowercase ``kbps``/``mbps`` also mean *bytes*/s, which nearly
every user misreads as megabits, so we refuse them with a hint instead of
guessing::

    >>> parse_rate("50mbit")
    6250000.0
    >>> parse_rate("10MBps")
    10000000.0
"""
from __future__ import annotations

import re

_NUM = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>[A-Za-z/]*)"

_RATE_UNITS = {  # multiplier to bytes/s
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "kibit": 1024 / 8, "mibit": 1024**2 / 8, "gibit": 1024**3 / 8,
    "Bps": 1, "KBps": 1e3, "MBps": 1e6, "GBps": 1e9,
    "KiBps": 1024, "MiBps": 1024**2, "GiBps": 1024**3,
}
_AMBIGUOUS_RATE = {"bps", "kbps", "mbps", "gbps", "tbps", "Kbps", "Mbps", "Gbps"}

_SIZE_UNITS = {  # multiplier to bytes
    "": 1, "b": 1, "B": 1,
    "k": 1e3, "kb": 1e3, "KB": 1e3, "m": 1e6, "mb": 1e6, "MB": 1e6,
    "g": 1e9, "gb": 1e9, "GB": 1e9, "t": 1e12, "tb": 1e12, "TB": 1e12,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
    "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
}

_DURATION_UNITS = {  # multiplier to seconds
    "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "": 1.0, "s": 1.0, "sec": 1.0,
    "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0,
}


class UnitError(ValueError):
    """Raised with a one-line message a CLI can print as it is."""


def _split(text: str, what: str) -> tuple[float, str]:
    m = re.fullmatch(_NUM, text.strip())
    if not m:
        if text.strip().startswith("-"):
            raise UnitError(f"{what} must not be negative: {text!r}")
        raise UnitError(f"not a {what}: {text!r}")
    return float(m.group("num")), m.group("unit")


def parse_rate(text: str) -> float:
    """tc-style rate -> bytes/s ('50mbit', '10MBps', '1gbit', '800kbit')."""
    num, unit = _split(text, "rate")
    if unit in _AMBIGUOUS_RATE:
        raise UnitError(
            f"ambiguous rate unit in {text!r}: write '{num:g}{unit[:-3].lower()}bit' for bits/s "
            f"or '{num:g}{unit[:-3].upper()}Bps' for bytes/s")
    if unit == "":
        raise UnitError(f"rate {text!r} needs a unit, e.g. '{num:g}mbit' or '{num:g}MBps'")
    if unit not in _RATE_UNITS:
        raise UnitError(f"unknown rate unit {unit!r} in {text!r} (use bit, kbit, mbit, gbit, Bps, KBps, MBps, GBps)")
    return num * _RATE_UNITS[unit]


def parse_size(text: str) -> int:
    """Size -> bytes ('75KB', '1mb', '1500', '64KiB')."""
    num, unit = _split(text, "size")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB)")
    return int(round(num * _SIZE_UNITS[unit]))


def parse_duration(text: str) -> float:
    """Duration -> seconds ('100ms', '1s', '30d', '0.5')."""
    num, unit = _split(text, "duration")
    if unit not in _DURATION_UNITS:
        raise UnitError(f"unknown duration unit {unit!r} in {text!r} (use us, ms, s, m, h, d)")
    return num * _DURATION_UNITS[unit]


def parse_quota(text: str) -> tuple[int, float]:
    """Volume quota 'SIZE/DURATION' -> (bytes, seconds), e.g. '10TB/30d'."""
    size, sep, period = text.partition("/")
    if not sep:
        raise UnitError(f"quota {text!r} must look like SIZE/PERIOD, e.g. '10TB/30d'")
    seconds = parse_duration(period)
    if seconds <= 0:
        raise UnitError(f"quota period must be positive: {text!r}")
    return parse_size(size), seconds


def to_bps(rate_Bps: float) -> float:
    """bytes/s -> bits/s, for the ``*_bps`` keys of status and result JSON."""
    return rate_Bps * 8.0


def format_rate(rate_Bps: float) -> str:
    """bytes/s -> short human text in bits/s ('49.8 Mbit/s')."""
    bits = rate_Bps * 8.0
    for scale, name in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if abs(bits) >= scale:
            return f"{bits / scale:.4g} {name}"
    return f"{bits:.0f} bit/s"      # an idle estimate's 1.2e-05 bit/s reads as what it is: 0


def format_size(n_bytes: float) -> str:
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.4g} {name}"
    return f"{n_bytes:.0f} B"
