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

Every value from outside (a flag, the config file, etcd, a datagram, the
control socket, a state file) is checked here against finite bounds before
anything stores or uses it: the parsers check text, the ``check_*`` functions
numbers that arrive already decoded (JSON, protobuf).  Each raises
:class:`UnitError` with one line; the caller prefixes where the value came
from (``--global: ...``, ``limits file PATH: ...``)::

    >>> try:
    ...     parse_rate("0bit")
    ... except UnitError as e:
    ...     print(e)
    rate '0bit' is below the floor of 8 kbit/s

Bounds (docs/config.md "Bounds"):

* a rate: MIN_RATE_Bps (8 kbit/s) .. MAX_RATE_Bps (1 Tbit/s).  The ceiling keeps
  the datapath's price of a byte (agent/kernel/bucket.py, 2^-16 ns units) at
  524.3 units, rounded up to 525 (0.14 % under the rate) and well inside its
  64-bit arithmetic, and a local limit inside the wire's 32-bit kB/s field
  (34 Tbit/s); below the floor a 1,500-byte packet waits 1.5 s for its tokens.
* a duration: 0 .. MAX_DURATION_S (3,650 days: a quota period or a ban;
  monotonic time plus it stays exact in a float).  The estimate interval:
  MIN_INTERVAL_S (10 ms: a shorter tick burns a core) .. MAX_INTERVAL_S (10 s).
* a size or an amount (bytes, counts, weights): 0 .. MAX_AMOUNT (2^53, 9 PB:
  every integer below it is exact in a double, which is how JSON and the wire
  carry it).
* a probability: 0 .. 1.
* a version (a class's global limit, a ban): 0 .. MAX_VERSION - 1 (2^63 - 2), so
  that one more always fits the wire's uint64 and JSON's int64; a limit heard
  from a peer one lower still, so that a ``drlctl set`` can follow it.
"""
from __future__ import annotations

import math
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


MIN_RATE_Bps = 1e3                 # 8 kbit/s
MAX_RATE_Bps = 1.25e11             # 1 Tbit/s
MAX_DURATION_S = 3650 * 86400.0    # ten years
MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 10.0
MAX_AMOUNT = 2**53
MAX_VERSION = 2**63 - 1            # exclusive: a version that could not be incremented is refused


class UnitError(ValueError):
    """Raised with a one-line message a CLI can print as it is."""


def _number(value, what: str) -> float:
    """A real, finite number (JSON's NaN, Infinity and 1e400 are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnitError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise UnitError(f"{what} must be finite, got {value!r}")
    return value


def check_rate(rate_Bps, what: str = "rate") -> float:
    """A rate in bytes/s, within MIN_RATE_Bps..MAX_RATE_Bps."""
    rate = float(_number(rate_Bps, what))
    if not MIN_RATE_Bps <= rate <= MAX_RATE_Bps:
        raise UnitError(f"{what} {rate:g} B/s is outside {format_rate(MIN_RATE_Bps)} .. {format_rate(MAX_RATE_Bps)}")
    return rate


def check_amount(value, what: str = "amount", limit: float = MAX_AMOUNT) -> float:
    """A size, count or weight: finite, 0 .. ``limit`` (MAX_AMOUNT)."""
    if not 0 <= _number(value, what) <= limit:
        raise UnitError(f"{what} {value!r} is outside 0 .. {limit:g}")
    return value


def check_duration(seconds, what: str = "duration") -> float:
    """Seconds, 0 .. MAX_DURATION_S."""
    return float(check_amount(seconds, what, MAX_DURATION_S))


def check_version(version, what: str = "version") -> int:
    """A version one more than which still fits: an integer 0 .. MAX_VERSION - 1."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise UnitError(f"{what} must be a whole number, got {version!r}")
    if not 0 <= version < MAX_VERSION:
        raise UnitError(f"{what} {version} is outside 0 .. {MAX_VERSION - 1} (one more must still fit)")
    return version


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
    rate = num * _RATE_UNITS[unit]
    if not rate >= MIN_RATE_Bps:          # NaN cannot come out of the pattern, inf (1e400) can
        raise UnitError(f"rate {text!r} is below the floor of {format_rate(MIN_RATE_Bps)}")
    if not rate <= MAX_RATE_Bps:
        raise UnitError(f"rate {text!r} is above the ceiling of {format_rate(MAX_RATE_Bps)}")
    return rate


def parse_size(text: str) -> int:
    """Size -> bytes ('75KB', '1mb', '1500', '64KiB')."""
    num, unit = _split(text, "size")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB)")
    size = num * _SIZE_UNITS[unit]
    if not size <= MAX_AMOUNT:
        raise UnitError(f"size {text!r} is above the ceiling of {format_size(MAX_AMOUNT)}")
    return int(round(size))


def parse_duration(text: str) -> float:
    """Duration -> seconds ('100ms', '1s', '30d', '0.5')."""
    num, unit = _split(text, "duration")
    if unit not in _DURATION_UNITS:
        raise UnitError(f"unknown duration unit {unit!r} in {text!r} (use us, ms, s, m, h, d)")
    seconds = num * _DURATION_UNITS[unit]
    if not seconds <= MAX_DURATION_S:
        raise UnitError(f"duration {text!r} is above the ceiling of {MAX_DURATION_S / 86400:g} days")
    return seconds


def parse_interval(text: str) -> float:
    """The estimate interval -> seconds, MIN_INTERVAL_S (10 ms) .. MAX_INTERVAL_S (10 s)."""
    seconds = parse_duration(text)
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise UnitError(f"interval {text!r} is outside {MIN_INTERVAL_S * 1000:g}ms .. {MAX_INTERVAL_S:g}s "
                        f"(a shorter tick burns a core)")
    return seconds


def parse_probability(text: str) -> float:
    """'0.01' -> 0.01, within 0..1."""
    try:
        p = float(text)
    except (TypeError, ValueError):
        raise UnitError(f"not a probability: {text!r}") from None
    if not 0.0 <= p <= 1.0:
        raise UnitError(f"probability must be within 0..1: {text!r}")
    return p


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
    for scale, name in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if abs(bits) >= scale:
            return f"{bits / scale:.4g} {name}"
    return f"{bits:.0f} bit/s"      # an idle estimate's 1.2e-05 bit/s reads as what it is: 0


def format_size(n_bytes: float) -> str:
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.4g} {name}"
    return f"{n_bytes:.0f} B"
