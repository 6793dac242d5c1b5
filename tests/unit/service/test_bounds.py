"""Hostile or absurd values at the agent's edges: a peer's datagram, drlctl set, the limits file."""
from __future__ import annotations

import json
import time

import pytest

from daemon_harness import DEFAULT, FakeDatapath, agent, config, values
from drl.agent import units
from drl.agent.cluster.limits import Limit
from drl.agent.service.daemon import StartupError
from drl.agent.gossip.core import CLUSTER, GossipCore, PeerList
from drl.agent.service.control import answer

B = ("10.0.0.2", 7470)


def peer_of(cfg):
    return GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)


def test_a_peers_negative_weight_is_dropped_counted_and_never_summed(tmp_path):
    """One peer publishing -max(weights) gave 2.04x the limit."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470",
                 "--peer-timeout", "1h")
    peer = peer_of(cfg)
    with agent(cfg, FakeDatapath()) as a:
        t0 = time.monotonic()
        a.transport.arrive(peer.publish(values({DEFAULT: 3.0}), t0), B)
        a.receive()
        a.transport.arrive(peer.publish(values({DEFAULT: -3.0}), t0 + 1), B)
        a.receive()
        a.tick(t0 + 1)
        assert a.transport.stats.rejected == {"out_of_range": 1}
        assert a.status()["allocator_state"]["remote_weights"] == 3.0


def test_a_gdrl_indicator_below_0_still_arrives(tmp_path):
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "gdrl", "--peers", "b@10.0.0.2:7470",
                 "--peer-timeout", "1h")
    peer = peer_of(cfg)
    with agent(cfg, FakeDatapath()) as a:
        a.transport.arrive(peer.publish(values({DEFAULT: -2.5e5}), time.monotonic()), B)
        a.receive()
        assert not a.transport.stats.rejected and a.transport.stats.received == 1


def _set(a, rate: str) -> dict:
    raw = json.dumps({"cmd": "set", "class": "default", "global": rate}).encode()
    return answer(raw, a.commands())


@pytest.mark.parametrize("rate", ["0bit", "1000tbit", "1e300mbit", "1e400mbit"])
def test_drlctl_set_of_an_absurd_rate_is_refused_and_nothing_is_saved(tmp_path, rate):
    """1e400mbit was saved as Infinity to the limits file, and every restart crashed on it."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "static")
    with agent(cfg, FakeDatapath()) as a:
        path = a.book.path
        before = path.read_text()
        reply = _set(a, rate)
        assert reply["ok"] is False and "rate" in reply["error"] and "\n" not in reply["error"]
        assert a.book.get("default") == Limit(0, 1e6) and path.read_text() == before
        a.tick(time.monotonic())


def test_drlctl_set_after_a_forged_top_version_wins_and_the_agent_goes_on(tmp_path):
    """A forged 2^63 - 3 was adopted for good, and every set after it was refused."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "static")
    with agent(cfg, FakeDatapath()) as a:
        assert not a.book.merge("default", Limit(2**64 - 1, 7.5e6))
        assert not a.book.merge("default", Limit(units.MAX_VERSION - 2, 7.5e6))
        reply = _set(a, "16mbit")
        assert reply["ok"] and 0 < reply["limit_version"] - time.time() * 1000 + 5000 < 10_000, reply
        a.tick(time.monotonic())                  # publishes its version: fits the wire
        assert a.book.get("default").global_Bps == 2e6


def test_an_absurd_limits_file_refuses_the_start_in_one_line(tmp_path):
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "static")
    path = tmp_path / "state" / "limits-a.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"default": {"version": 3, "global_Bps": Infinity, "configured_Bps": 1000000.0}}')
    with pytest.raises(StartupError, match=rf"^limits file {path}: class 'default': global_Bps must be finite"):
        agent(cfg, FakeDatapath())
