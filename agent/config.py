"""``drl-agent up`` options -> a checked :class:`Config`, before anything is touched.

Everything a user can get wrong is found here and reported as one
:class:`ConfigError` line: not root, unknown interface, malformed peers or
class specs, an unreadable key file, allocator parameters out of range.  What
can only fail when tried (a port in use, the BPF program not loading) fails in
agent/daemon.py, which still acquires sockets before it attaches anything.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

from agent.allocators import allocator_class, create
from agent.allocators.common import ParameterError
from agent.classes import ClassRule, ClassSpecError, parse_classes
from agent.membership import liveness_timeout
from agent.model import Allocator
from agent.peers import AddressError, HostPort, Peer, parse_hostport, parse_peers
from agent.wire import KeyFileError, load_key

# The kernel falls back to the safe rate when the agent has not written a
# class for this long: long enough that a slow tick never trips it, short
# enough that a dead agent's host stops using a share it no longer owns.
FAILSAFE_INTERVALS = 20
FAILSAFE_MIN_S = 2.0


class ConfigError(Exception):
    """One line for the user; nothing has been attached when it is raised."""


@dataclass(frozen=True)
class Config:
    iface: str
    global_Bps: float
    allocator: Allocator
    node_id: str
    listen: HostPort
    peers: tuple[Peer, ...]
    key: bytes | None
    interval_s: float
    branching: int
    peer_timeout_s: float
    burst_bytes: int | None
    classes: tuple[ClassRule, ...]
    socket_path: str
    safe_Bps: float
    failsafe_s: float
    ewma: float
    flow_ewma: float
    sample_probability: float
    max_flows: int
    state_dir: str

    @property
    def n_nodes(self) -> int:
        return 1 + len(self.peers)


def build_config(opts: Mapping[str, Any], check_host: bool = True) -> Config:
    """The click options of ``drl-agent up`` -> Config; raises ConfigError.

    ``check_host=False`` skips the checks of this machine (root, the interface), so
    tests can build a Config for an Agent with an in-memory datapath."""
    if check_host:
        _check_host(opts["iface"])
    try:
        listen = parse_hostport(opts["listen"])
        peers = tuple(parse_peers(opts["peers"] or ""))
        classes = tuple(parse_classes(opts["class_specs"]))
    except (AddressError, ClassSpecError) as e:
        raise ConfigError(str(e)) from None
    node_id = opts["node_id"]
    if not node_id or any(p.node_id == node_id for p in peers):
        raise ConfigError(f"node id {node_id!r} must be non-empty and differ from every peer's")
    n_nodes = 1 + len(peers)
    allocator = _allocator(opts, peers, n_nodes)
    interval_s = opts["interval_s"]
    return Config(
        iface=opts["iface"], global_Bps=opts["global_Bps"], allocator=allocator, node_id=node_id,
        listen=listen, peers=peers, key=_key(opts), interval_s=interval_s, branching=opts["branching"],
        peer_timeout_s=opts["peer_timeout_s"] or liveness_timeout(interval_s, len(peers), opts["branching"]),
        burst_bytes=opts["burst_bytes"], classes=classes, socket_path=opts["socket_path"],
        safe_Bps=opts["safe_Bps"] if opts["safe_Bps"] is not None else opts["global_Bps"] / n_nodes,
        failsafe_s=max(FAILSAFE_MIN_S, FAILSAFE_INTERVALS * interval_s), ewma=opts["ewma"],
        flow_ewma=opts["flow_ewma"],
        sample_probability=_sample_probability(opts, allocator), max_flows=opts["max_flows"],
        state_dir=opts["state_dir"])


def _sample_probability(opts: Mapping[str, Any], allocator: Allocator) -> float:
    """FPS samples flows (its resampleprob); the others see every flow unless told."""
    if opts["sample_probability"] is not None:
        return opts["sample_probability"]
    return getattr(allocator, "sample_probability", 1.0)


def _check_host(iface: str) -> None:
    if os.geteuid() != 0:
        raise ConfigError("drl-agent must run as root (it loads BPF and changes tc on the interface)")
    try:
        socket.if_nametoindex(iface)
    except OSError:
        raise ConfigError(f"no interface named {iface!r} (see `ip link`)") from None


def _key(opts: Mapping[str, Any]) -> bytes | None:
    if opts["key_file"] and opts["insecure"]:
        raise ConfigError("give either --key-file or --insecure, not both")
    if opts["insecure"]:
        return None
    if not opts["key_file"]:
        raise ConfigError("gossip needs a cluster key: --key-file PATH (or --insecure to run unauthenticated)")
    try:
        return load_key(opts["key_file"])
    except KeyFileError as e:
        raise ConfigError(str(e)) from None


def _allocator(opts: Mapping[str, Any], peers: tuple[Peer, ...], n_nodes: int) -> Allocator:
    name = opts["allocator"]
    if getattr(allocator_class(name), "needs_member_ids", False):
        unnamed = [p for p in peers if not p.node_id]
        if unnamed:
            raise ConfigError(f"--allocator {name} needs every peer's node id: write --peers ID@HOST:PORT,...")
    quota_bytes, period_s = opts["quota"] or (None, None)
    params = dict(opts, quota_bytes=quota_bytes, period_s=period_s, servers=opts["lease_servers"] or None)
    try:
        allocator = create(name, **params)
        members = tuple(sorted([opts["node_id"], *(p.node_id or f"?{i}" for i, p in enumerate(peers))]))
        allocator.initial_state(opts["node_id"], members)   # graphs, lease servers: fail now, not mid-run
    except ParameterError as e:
        raise ConfigError(f"--allocator {name}: {e}") from None
    return allocator
