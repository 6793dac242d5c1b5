"""``--listen`` and ``--peers`` as the CLI writes them -> addresses and peers.

    >>> parse_peers("b@10.0.0.2:7470,[::1]:7471")
    [Peer(addr=('10.0.0.2', 7470), node_id='b'), Peer(addr=('::1', 7471), node_id=None)]
    >>> format_addr(("::1", 7471))
    '[::1]:7471'
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

HostPort = tuple[str, int]


class AddressError(ValueError):
    """A malformed --listen address or peer list; one line for the CLI."""


def parse_hostport(text: str) -> HostPort:
    """``"10.0.0.1:7000"``, ``"host:7000"`` or ``"[::1]:7000"`` -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise AddressError(f"IPv6 address needs brackets: [{host}]:{port}")
    if not sep or not host:
        raise AddressError(f"expected HOST:PORT or [IPv6]:PORT, got {text!r}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"bad port in {text!r} (1-65535)")
    return host, int(port)


class Peer(NamedTuple):
    """One ``--peers`` entry: its address and, if written ``ID@HOST:PORT``, its node id."""
    addr: HostPort
    node_id: str | None = None


def parse_peers(text: str) -> list[Peer]:
    """``"b@10.0.0.2:7000,[::1]:7001"`` -> [Peer(("10.0.0.2", 7000), "b"), Peer(("::1", 7001))].

    The id is optional for static/grd/fps/...; allocators whose state depends on
    who the members are (graphs, lease servers) need it for every peer."""
    peers = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        node, sep, hostport = item.partition("@")
        if sep and not node:
            raise AddressError(f"empty node id in {item!r} (write ID@HOST:PORT)")
        peers.append(Peer(parse_hostport(hostport if sep else item), node if sep else None))
    for what, values in (("peer", [p.addr for p in peers]), ("node id", [p.node_id for p in peers if p.node_id])):
        dups = {format_addr(v) for v in values if values.count(v) > 1}
        if dups:
            raise AddressError(f"{what} listed twice: {', '.join(sorted(dups))}")
    return peers


def format_addr(addr: Hashable) -> str:
    """(host, port) -> "host:port" / "[v6]:port"; other addresses (sim/) -> str()."""
    if isinstance(addr, tuple) and len(addr) == 2:
        host, port = addr
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr)
