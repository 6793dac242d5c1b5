"""Client rules: who a client is, what is counted, the threshold and the action, parsed and checked.

One class may carry one rule (docs/clients.md)::

    rule = client_rule(parse_client_key("dst/24"), "bytes", parse_threshold("2mbit"), "throttle")
    rule.key.client_of("198.51.100.7")     # -> the packed /24 prefix, a Client
    rule.check_interval(0.1)                # a window holds at least one interval

Every parse error is a :class:`ClientRuleError` whose message is one line, naming the text it
came from.
"""
from __future__ import annotations

import functools
import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Iterable, Union

from drl.agent import units

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
# A client prefix as the kernel keys it and every table here holds it: the packed network
# address, 4 bytes (IPv4) or 16 (IPv6), host bits zero; its length is the class's ClientKey's.
# bytes cache their hash; ip_network objects recompute theirs on every lookup, which made a
# tick at 100,000 clients 13 times slower.
Client = bytes

MEASURES = ("bytes", "packets", "conns")
ACTIONS = ("throttle", "ban")
SIDES = ("dst", "src")
# A single length in a client key is its family's; the other family gets the
# prefix one host has: an IPv4 address, an IPv6 /64 (SLAAC and privacy
# addresses give every host a whole /64, so a /128 key would let one host be
# 2**64 clients).
HOST_LENGTH = {4: 32, 6: 64}
RATE_WINDOW_s = 1.0           # a rate threshold ('2mbit') is its count over a 1-s sliding window


class ClientRuleError(ValueError):
    """A client rule that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ClientKey:
    """Which address is the client's and how it is grouped, per family.

    A client is a :data:`Client`: the packed network address of its prefix, as the kernel
    keys it, with the length this key gives its family."""
    side: str          # "dst": the remote address of egress packets; "src": the local one
    v4_len: int
    v6_len: int

    def length(self, client: Client) -> int:
        return self.v4_len if len(client) == 4 else self.v6_len

    def client_of(self, address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> Client:
        """The client prefix an address belongs to."""
        addr = ipaddress.ip_address(address)
        length = self.v4_len if addr.version == 4 else self.v6_len
        return ipaddress.ip_network((addr, length), strict=False).network_address.packed

    def network(self, client: Client) -> Network:
        """A client as a prefix, for people (drlctl, logs)."""
        return ipaddress.ip_network((client, self.length(client)))

    def owns(self, client: Client) -> bool:
        """A well-formed client of this key: 4 or 16 bytes, no bit set past the prefix."""
        if len(client) not in (4, 16):
            return False
        host_bits = 8 * len(client) - self.length(client)
        return int.from_bytes(client, "big") & ((1 << host_bits) - 1) == 0

    def __str__(self) -> str:
        return f"{self.side}/{self.v4_len}/{self.v6_len}"


def parse_client_key(text: str) -> ClientKey:
    """``dst/32`` -> IPv4 /32 and IPv6 /64; ``dst/64`` -> IPv6 /64 and IPv4 /32;
    ``dst/24/56`` -> IPv4 /24 and IPv6 /56 (first IPv4, then IPv6)."""
    m = re.fullmatch(r"\s*([a-z]+)/([0-9]+)(?:/([0-9]+))?\s*", text)
    if not m:
        raise ClientRuleError(f"client key {text!r}: write dst/LEN or dst/LEN4/LEN6, e.g. 'dst/32' "
                              "(IPv4 /32, IPv6 /64) or 'dst/24/56'")
    side, first, second = m.group(1), int(m.group(2)), m.group(3)
    if side not in SIDES:
        raise ClientRuleError(f"client key {text!r}: the client is 'dst' (the remote address of egress "
                              "packets) or 'src'")
    if second is not None:
        return ClientKey(side, _length(text, first, 4, " (the first length is IPv4's)"), _length(text, int(second), 6))
    if first <= 32:
        return ClientKey(side, first, HOST_LENGTH[6])
    return ClientKey(side, HOST_LENGTH[4], _length(text, first, 6))


def _length(text: str, length: int, version: int, hint: str = "") -> int:
    most = 32 if version == 4 else 128
    if length > most:
        raise ClientRuleError(f"client key {text!r}: an IPv{version} prefix length is at most {most}{hint}")
    return length


@dataclass(frozen=True)
class Threshold:
    """A count per sliding window, in the measure's unit; ``kind`` is how it was written."""
    count: float
    window_s: float
    kind: str          # "rate" ('2mbit': bytes over RATE_WINDOW_s), "size" ('250KB/1s'), "count" ('2000/1200s')
    text: str

    @property
    def per_s(self) -> float:
        return self.count / self.window_s

    def __str__(self) -> str:
        return self.text


def _unit(parse, value: str, text: str):
    """``parse(value)`` (agent/units.py), its UnitError as the threshold's one line."""
    try:
        return parse(value)
    except units.UnitError as e:
        raise ClientRuleError(f"threshold {text!r}: {e}") from None


def parse_threshold(text: str) -> Threshold:
    """``2mbit`` (a rate of bytes), ``250KB/1s`` (bytes per window) or ``2000/1200s`` (a count
    per window; ``2000/1s`` is a rate of 2,000 a second).  The measure is checked by client_rule."""
    amount, sep, window = text.strip().partition("/")
    amount = amount.strip()
    if not sep:
        return _rate_threshold(text, amount)
    window_s = _unit(units.parse_duration, window, text)
    if window_s <= 0:
        raise ClientRuleError(f"threshold {text!r}: the window must be longer than 0")
    if re.fullmatch(r"[0-9]*\.?[0-9]+", amount):
        if not amount.isdigit() or int(amount) == 0:
            raise ClientRuleError(f"threshold {text!r}: the count must be a whole number above 0")
        return Threshold(float(amount), window_s, "count", text.strip())
    size = _unit(units.parse_size, amount, text)
    if size <= 0:
        raise ClientRuleError(f"threshold {text!r}: the size must be above 0")
    return Threshold(float(size), window_s, "size", text.strip())


def _rate_threshold(text: str, amount: str) -> Threshold:
    if re.fullmatch(r"[0-9]*\.?[0-9]+", amount):
        raise ClientRuleError(f"threshold {text!r}: give a rate ('2mbit') or COUNT/WINDOW ('2000/1200s')")
    rate_Bps = _unit(units.parse_rate, amount, text)
    if rate_Bps <= 0:
        raise ClientRuleError(f"threshold {text!r}: the rate must be above 0")
    return Threshold(rate_Bps * RATE_WINDOW_s, RATE_WINDOW_s, "rate", text.strip())


def parse_prefix(text: str) -> Network:
    """An address or CIDR (exempt lists, ``drlctl unban``); host bits are dropped."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ClientRuleError(f"{text!r} is not an address or prefix (e.g. 10.0.0.0/8, 2001:db8::/32)") from None


@dataclass(frozen=True)
class ClientRule:
    """One class's client rule, checked (:func:`client_rule`)."""
    key: ClientKey
    measure: str
    threshold: Threshold
    action: str
    ban_duration_s: float = 0.0
    exempt: tuple[Network, ...] = ()

    @property
    def limit(self) -> float:
        """The threshold as a count per window, in the measure's unit."""
        return self.threshold.count

    @property
    def window_s(self) -> float:
        return self.threshold.window_s

    def is_exempt(self, client: Client) -> bool:
        """The whole client prefix lies in an exempt prefix (the kernel checks each packet's address)."""
        if not self.exempt:
            return False
        value, length = int.from_bytes(client, "big"), self.key.length(client)
        return any(len(client) == size and e_len <= length and value >> shift == top
                   for size, e_len, shift, top in self._exempt_bits)

    @functools.cached_property
    def _exempt_bits(self) -> tuple[tuple[int, int, int, int], ...]:
        """Per exempt prefix: address bytes, length, host bits, the prefix's top bits; integer
        tests, as a tick may check 100,000 clients."""
        return tuple((e.max_prefixlen // 8, e.prefixlen, e.max_prefixlen - e.prefixlen,
                      int(e.network_address) >> (e.max_prefixlen - e.prefixlen)) for e in self.exempt)

    def check_interval(self, interval_s: float) -> None:
        """Counts arrive once an interval, so a window must hold at least one."""
        if self.window_s < interval_s:
            raise ClientRuleError(f"threshold {self.threshold.text!r}: the window ({self.window_s:g} s) is "
                                  f"shorter than the interval ({interval_s:g} s)")


def client_rule(key: ClientKey | None, measure: str | None = None, threshold: Threshold | None = None,
                action: str | None = None, ban_duration_s: float | None = None,
                exempt: Iterable[Network] = ()) -> ClientRule | None:
    """The parsed fields of one class -> a checked ClientRule, or None without a client key.
    Defaults: measure bytes, action throttle, ban duration 0 (banned for the rest of the window)."""
    exempt = tuple(sorted(set(exempt), key=lambda n: (n.version, n)))
    if key is None:
        given = [name for name, value in (("measure", measure), ("threshold", threshold), ("action", action),
                                          ("ban_duration", ban_duration_s), ("exempt", exempt or None))
                 if value is not None]
        if given:
            raise ClientRuleError(f"client {given[0]} given without a client key: add client = \"dst/32\" "
                                  "(--client-key dst/32)")
        return None
    measure, action = measure or "bytes", action or "throttle"
    if measure not in MEASURES:
        raise ClientRuleError(f"client measure {measure!r}: use {', '.join(MEASURES)}")
    if action not in ACTIONS:
        raise ClientRuleError(f"client action {action!r}: use {' or '.join(ACTIONS)}")
    if threshold is None:
        raise ClientRuleError(f"client key {key}: needs a threshold, e.g. '2mbit' or '2000/1200s'")
    _check_measure(measure, threshold)
    if action == "throttle" and ban_duration_s is not None:
        raise ClientRuleError("ban_duration applies to action = \"ban\", not throttle")
    ban_duration_s = 0.0 if ban_duration_s is None else ban_duration_s
    if not 0.0 <= ban_duration_s < math.inf:
        raise ClientRuleError(f"ban_duration must be 0 s or more, got {ban_duration_s!r}")
    return ClientRule(key, measure, threshold, action, ban_duration_s, exempt)


def _check_measure(measure: str, threshold: Threshold) -> None:
    if measure == "bytes" and threshold.kind == "count":
        raise ClientRuleError(f"measure 'bytes': threshold {threshold.text!r} has no size unit; give a rate "
                              "('2mbit') or a size per window ('250KB/1s')")
    if measure != "bytes" and threshold.kind != "count":
        raise ClientRuleError(f"measure {measure!r} counts {'packets' if measure == 'packets' else 'new connections'}: "
                              f"threshold {threshold.text!r} is bytes; write COUNT/WINDOW, e.g. '2000/1s'")
