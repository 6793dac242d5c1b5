"""An in-memory transport with the interface of ``gossip.transport.UdpTransport`` (``gossip.interface``).

    agent = Agent(cfg, transport=MemoryTransport, datapath=...)
    agent.transport.arrive(datagrams, src)     # queued for the agent's next poll
    agent.transport.sent                       # [(addr, datagram)] put on the wire

The real gossip core runs; only the socket is lists.
"""
from __future__ import annotations

from drl.agent.gossip.core import CLUSTER, GossipCore, PeerList


class MemoryTransport:
    """gossip.core's GossipCore with lists for a network: ``arrive`` queues a datagram
    for the next poll, ``sent`` keeps what publish and send put on the wire."""

    sock = None      # serve() selects on nothing of ours

    def __init__(self, cfg):
        self.address = cfg.listen
        self.resolved = {p.addr: p.addr for p in cfg.peers}
        self.peer_addrs = PeerList(p.addr for p in cfg.peers)
        self.core = GossipCore(cfg.node_id, CLUSTER, cfg.key, self.peer_addrs, cfg.branching, incarnation=1)
        self.stats = self.core.stats
        self.queue: list[tuple[bytes, tuple]] = []
        self.sent: list[tuple[tuple, bytes]] = []
        self.unresolved: dict = {}

    @property
    def incarnation(self):
        return self.core.incarnation

    def set_signed(self, signed):
        self.core.signed = signed

    def arrive(self, datagrams, src):
        self.queue += [(data, src) for _, data in datagrams]

    def poll(self, now):
        got = [self.core.receive(data, src, now) for data, src in self.queue]
        self.queue = []
        return [rx for rx in got if rx is not None]

    def publish(self, values, now):
        self.sent += self.core.publish(values, now)

    def announce(self, note, addr=None):
        self.core.announce(note, addr)

    def report_clients(self, reports, now):
        self.sent += self.core.report_clients(reports, now)

    def send(self, env, class_id, now):
        routed = self.core.route(env, class_id, now)
        if routed is not None:
            self.sent.append(routed)
        return routed is not None

    def send_sums(self, node, sums, now):
        self.sent += self.core.sums(node, sums, now)

    def knows(self, node):
        return self.core.knows(node)

    def overdue(self, now, gap_s):
        return self.core.overdue(now, gap_s)

    def set_peers(self, peers, timeout_s=None):
        self.core.set_peers(list(peers), {a: n for a, n in peers.items() if n}, timeout_s)
        self.peer_addrs = self.core.peers
        return dict(peers)

    def close(self):
        pass
