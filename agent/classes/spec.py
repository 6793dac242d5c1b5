"""Traffic classes: parse ``--class SPEC`` strings into :class:`ClassRule`.

A spec is ``all`` or comma-separated ``key=value`` pairs, all of which must
match::

    dst=10.0.0.0/8,dport=80,proto=tcp    TCP to port 80 in 10/8
    src=fd00::/64                        anything from fd00::/64
    proto=udp,sport=53                   UDP from port 53
    sport=8080,proto=tcp                 what a TCP server on port 8080 sends
    mark=0x10  or  mark=0x10/0xff        skb mark, optionally under a mask
    all                                  every IPv4/IPv6 packet

keys: ``src``, ``dst`` (address or CIDR; both must be the same family),
``proto`` (tcp, udp, icmp, icmpv6, sctp or a number), ``sport``, ``dport``
(1-65535; without ``proto`` they match TCP or UDP), ``mark``.  Specs match
egress packets: ``src`` and ``sport`` are this host's end, ``dst`` and ``dport``
the remote one, so a server's replies carry its port as ``sport``.  Without
``proto`` a class also polices ICMPv6, neighbour discovery included (ARP is
not IP and always passes), so give ``proto=tcp`` when that matters.  Several
``--class`` flags give class ids 0, 1, 2 ... in order (:func:`parse_classes`).

Precedence when several rules match a packet (agent/kernel/classify.py compiles
them so that the datapath needs a few map lookups, never a scan):

1. rules with a ``mark`` (masks tried in the order they were installed);
2. then the rules of the longest matching ``dst`` prefix; rules without
   any address count as ``dst`` "any", the shortest prefix there is;
3. then the rules of the longest matching ``src`` prefix (rules with a
   ``src`` and no ``dst``).

Within one prefix (or mark), rules are tried in the order given; a packet
that matches a prefix but none of its rules goes on to the shorter prefixes
covering it.  So ``all`` never hides a more specific ``dst`` rule, but it
does hide every ``src``-only rule.

A rule set may use at most 4 distinct mark masks and 8 distinct prefix
lengths per direction (``all`` counts as length 0; an IPv4 and an IPv6 /n
as one length): each costs a packet a hash lookup (agent/abi.py).

    >>> parse_class("dst=10.0.0.0/8,dport=80,proto=tcp").dport
    80
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Union

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

PROTOCOLS = {"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "sctp": 132}
_KEYS = ("src", "dst", "proto", "sport", "dport", "mark")


class ClassSpecError(ValueError):
    """A --class spec that cannot be parsed; the message is one line."""


@dataclass(frozen=True)
class ClassRule:
    """One traffic class: every field that is set must match (None = any)."""
    src: Network | None = None
    dst: Network | None = None
    proto: int | None = None
    sport: int | None = None
    dport: int | None = None
    mark: int | None = None
    mark_mask: int = 0xFFFFFFFF

    @property
    def family(self) -> int:
        """4 or 6 when an address pins the family, else 0 (both)."""
        net = self.src or self.dst
        return net.version if net else 0

    def __str__(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("src", "dst", "proto", "sport", "dport")
                 if getattr(self, k) is not None]
        if self.mark is not None:
            parts.append(f"mark={self.mark:#x}/{self.mark_mask:#x}")
        return ",".join(parts) or "all"


def parse_class(spec: str) -> ClassRule:
    """One spec -> ClassRule; raises ClassSpecError naming the bad part."""
    text = spec.strip()
    if text in ("all", "any"):
        return ClassRule()
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ClassSpecError(f"class {spec!r}: expected key=value, got {part!r}")
        if key not in _KEYS:
            raise ClassSpecError(f"class {spec!r}: unknown key {key!r} (use {', '.join(_KEYS)} or 'all')")
        if key in fields:
            raise ClassSpecError(f"class {spec!r}: {key!r} given twice")
        fields[key] = value
    if not fields:
        raise ClassSpecError(f"class {spec!r}: empty (write 'all' to match every packet)")
    return _build(spec, fields)


def parse_classes(specs: Iterable[str]) -> list[ClassRule]:
    """Several specs -> rules whose list index is the class id."""
    return [parse_class(s) for s in specs]


def _build(spec: str, f: dict[str, str]) -> ClassRule:
    src = _network(spec, "src", f.get("src"))
    dst = _network(spec, "dst", f.get("dst"))
    if src and dst and src.version != dst.version:
        raise ClassSpecError(f"class {spec!r}: src is IPv{src.version} but dst is IPv{dst.version}")
    proto = _proto(spec, f.get("proto"))
    sport, dport = _port(spec, "sport", f.get("sport")), _port(spec, "dport", f.get("dport"))
    if (sport or dport) and proto not in (None, PROTOCOLS["tcp"], PROTOCOLS["udp"]):
        raise ClassSpecError(f"class {spec!r}: ports need proto=tcp or proto=udp (or no proto)")
    mark, mask = _mark(spec, f.get("mark"))
    return ClassRule(src=src, dst=dst, proto=proto, sport=sport, dport=dport, mark=mark, mark_mask=mask)


def _network(spec: str, key: str, value: str | None) -> Network | None:
    if value is None:
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ClassSpecError(f"class {spec!r}: {key}={value!r} is not an address or CIDR") from None


def _proto(spec: str, value: str | None) -> int | None:
    if value is None:
        return None
    if value.lower() in PROTOCOLS:
        return PROTOCOLS[value.lower()]
    if value.isdigit() and 0 < int(value) < 256:
        return int(value)
    raise ClassSpecError(f"class {spec!r}: proto={value!r} (use {', '.join(PROTOCOLS)} or 1-255)")


def _port(spec: str, key: str, value: str | None) -> int | None:
    if value is None:
        return None
    if value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    raise ClassSpecError(f"class {spec!r}: {key}={value!r} is not a port 1-65535")


def _mark(spec: str, value: str | None) -> tuple[int | None, int]:
    if value is None:
        return None, 0xFFFFFFFF
    mark_text, _, mask_text = value.partition("/")
    try:
        mark, mask = int(mark_text, 0), int(mask_text or "0xffffffff", 0)
    except ValueError:
        raise ClassSpecError(f"class {spec!r}: mark={value!r} (write e.g. 0x10 or 0x10/0xff)") from None
    if not (0 <= mark < 2**32 and 0 < mask < 2**32) or mark & ~mask:
        raise ClassSpecError(f"class {spec!r}: mark={value!r} must be 32-bit with mark inside mask")
    return mark, mask
