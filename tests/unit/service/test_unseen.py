"""Peers never heard are reported, not left at a quiet ``last seen never`` (agent/service/unseen.py)."""
import logging
import time

from drl.agent.gossip.core import GossipCore, PeerList
from drl.agent.service.daemon import CLUSTER
from drl.agent.service.unseen import UnseenPeers
from drl.cli.ctl import render

from daemon_harness import DEFAULT, FakeDatapath, agent, config, values


def rows(**seen):
    return [{"node_id": n, "address": f"10.0.0.{i}:7470", "last_seen_s": s} for i, (n, s) in enumerate(seen.items())]


def test_a_peer_unheard_past_the_liveness_timeout_is_reported_once_per_change(caplog):
    caplog.set_level(logging.INFO, logger="drl.agent")
    u = UnseenPeers(started=100.0, grace_s=3.0)
    u.observe(102.0, rows(b=None, c=None))
    assert u.peers == [] and not caplog.records          # within the grace: peers still starting
    u.observe(103.5, rows(b=0.1, c=None))
    u.observe(104.6, rows(b=0.1, c=None))
    assert u.peers == ["c"]
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "peers_unseen" in caplog.records[0].getMessage() and "capacity reserved for 1 unseen" in caplog.text
    u.observe(105.7, rows(b=0.1, c=0.2))
    assert u.peers == [] and "peers_seen" in caplog.records[-1].getMessage()


def test_at_most_once_a_second():
    u = UnseenPeers(started=0.0, grace_s=0.0)
    u.observe(1.0, rows(b=None))
    assert not u.due(1.5) and u.due(2.0)


def test_a_configured_peer_that_never_comes_up_shows_in_status_and_drlctl(tmp_path):
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470,c@10.0.0.3:7470")
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    with agent(cfg, FakeDatapath()) as a:
        grace = a.members.timeout_s
        now = time.monotonic()
        a.tick(now)
        assert a.status()["unseen_peers"] == []
        for t in (now + grace + 0.1, now + grace + 1.2):
            a.transport.arrive(peer.publish(values({DEFAULT: 0.5}), t), ("10.0.0.2", 7470))
            a.receive()
            a.tick(t)
        st = a.status()
    assert st["unseen_peers"] == ["c"]
    assert "warning     capacity reserved for 1 unseen peers (never heard): c" in render(st)
