"""A class's token bucket as bpf/police.h keeps it: virtual time, in integers.

The program never divides on a packet: the agent turns a rate and a depth
into time once per write (``Datapath.set_class``)::

    ns_per_byte, depth_ns = bucket_times(rate_Bps=6.25e6, burst_bytes=1_875_000)

``ns_per_byte`` is 1e9 / rate in units of 2^-NS_FRAC_BITS ns, rounded up
(a byte never costs less time than the rate says, so rounding never admits
more than the rate); a packet of ``len`` bytes costs
``len * ns_per_byte / 2^NS_FRAC_BITS`` ns, rounded up.  ``depth_ns`` is the depth at that
price, worked out with the same shift, so the C side and this one agree to
the nanosecond.  tests/unit/kernel/test_bucket_model.py checks the arithmetic
against a reference token bucket.

A throttled client's bucket (``Datapath.set_client_limits``) is the same in
its rule's unit, bytes, packets or connections, at a rate that may be below
one a second (``unit_times``).
"""
from __future__ import annotations

import math
from fractions import Fraction

from drl.agent import abi

NS_PER_S = 10**9


def ns_per_byte(rate_Bps: float) -> int:
    """1e9 / rate in 2^-NS_FRAC_BITS ns, rounded up; 0 for rate 0 (the bucket never refills).

    Capped at MAX_NS_PER_BYTE (~7.5 bytes/s): the program multiplies it by a
    packet length (< 2^20 bytes, a 512 KB BIG TCP skb included) in 64 bits."""
    rate = int(rate_Bps)
    if rate <= 0:
        return 0
    return min(abi.MAX_NS_PER_BYTE, -(-(NS_PER_S << abi.NS_FRAC_BITS) // rate))


def cost_ns(length: int, per_byte: int) -> int:
    """What police.h charges a packet of ``length`` bytes (cost_ns there), rounded up."""
    return (length * per_byte + (1 << abi.NS_FRAC_BITS) - 1) >> abi.NS_FRAC_BITS


def bucket_times(rate_Bps: float, burst_bytes: int) -> tuple[int, int]:
    """(ns_per_byte, depth_ns) for class_config; depth capped at MAX_DEPTH_NS (~18 min)."""
    per_byte = ns_per_byte(rate_Bps)
    return per_byte, min(abi.MAX_DEPTH_NS, cost_ns(int(burst_bytes), per_byte))


def unit_times(rate: float, depth_units: float, max_price: int) -> tuple[int, int]:
    """(ns_per_unit, depth_ns) for a client bucket (limiter.h client_bucket): bucket_times for
    a rate in units/s that may be a fraction (0.5 connections a second), rounded up exactly, the
    price capped at ``max_price`` (abi.MAX_NS_PER_UNIT of the measure); rate 0: price 0."""
    if rate <= 0:
        return 0, 0
    price = min(max_price, math.ceil(Fraction(NS_PER_S << abi.NS_FRAC_BITS) / Fraction(rate)))
    return price, min(abi.MAX_DEPTH_NS, cost_ns(math.ceil(depth_units), price))
