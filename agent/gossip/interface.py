"""What the service needs of a transport: the one interface ``UdpTransport``, ``Standalone`` and
``MemoryTransport`` share.  The daemon is typed against :class:`TransportPort`."""
from __future__ import annotations

from typing import Any, Mapping, Protocol

from drl.agent.gossip.core import Outgoing, Received
from drl.agent.gossip.peers import HostPort
from drl.agent.gossip.wire import ClassClients, LimitNote
from drl.agent.model import Envelope


class TransportPort(Protocol):
    address: HostPort | None
    resolved: Mapping[HostPort, HostPort]
    peer_addrs: Any
    stats: Any
    sock: Any                # selectable by serve(), or None
    unresolved: Mapping

    def set_peers(self, peers: Mapping[HostPort, str | None], timeout_s: float | None = None) -> Mapping: ...
    def poll(self, now: float) -> list[Received]: ...
    def publish(self, classes: Mapping[int, Outgoing], now: float) -> None: ...
    def announce(self, note: LimitNote, addr: HostPort | None = None) -> None: ...
    def report_clients(self, reports: list[ClassClients], now: float) -> None: ...
    def send(self, env: Envelope, class_id: int, now: float) -> bool: ...
    def close(self) -> None: ...
