"""agent/daemon.py's Agent without root: an in-memory datapath whose counters the test
advances, and the real gossip core on lists instead of a socket."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from agent.config import build_config
from agent.daemon import CLASS_ID, CLUSTER, Agent
from agent.datapath import Counters, FlowKey, FlowSample, now_ns
from agent.gossip import GossipCore, PeerList
from agent.model import Mode
from agent.units import to_bps
from agent.wire import Update, decode
from cli.agent import up

B = ("10.0.0.2", 7470)
C = ("10.0.0.3", 7470)

# README, "Running agents": the keys of `drlctl status --json`.
STATUS_KEYS = {
    "node_id", "interface", "allocator", "interval_s", "uptime_s", "listen", "authenticated",
    "global_limit_bps", "effective_limit_bps", "local_limit_bps", "safe_rate_bps", "mode",
    "drop_probability", "demand_bps", "rate_bps", "flows", "max_flow_bps", "passed_bytes",
    "passed_packets", "dropped_bytes", "dropped_packets", "quota_bytes_left", "allocator_state",
    "gossip", "peers"}


class FakeDatapath:
    """What the daemon uses of agent.datapath.Datapath, in memory."""

    def __init__(self):
        self.counters = Counters()
        self.flows: list[FlowSample] = []
        self.classes: dict[int, tuple[Mode, dict]] = {}
        self.attached = self.closed = False
        self.sample_probability = None

    def attach(self):
        self.attached = True

    def close(self):
        self.closed = True

    def set_sample_probability(self, p):
        self.sample_probability = p

    def set_class(self, class_id, mode, **settings):
        self.classes[class_id] = (mode, settings)

    def read_counters(self):
        return {CLASS_ID: self.counters}

    def read_flows(self):
        return list(self.flows)

    def send(self, nbytes: int) -> None:
        """``nbytes`` passed the limiter, as one flow."""
        c = self.counters
        self.counters = replace(c, passed_bytes=c.passed_bytes + nbytes, passed_packets=c.passed_packets + 1)
        key = FlowKey(4, 6, "10.0.0.1", "10.0.0.9", 40000, 80)
        first = self.flows[0].first_ns if self.flows else now_ns()
        self.flows = [FlowSample(key, CLASS_ID, self.counters.passed_bytes, self.counters.passed_packets,
                                 first, now_ns())]


class MemoryTransport:
    """agent.gossip's GossipCore with lists for a network: ``arrive`` queues a datagram
    for the next poll, ``sent`` keeps what publish and send put on the wire."""

    def __init__(self, cfg):
        self.address = cfg.listen
        self.resolved = {p.addr: p.addr for p in cfg.peers}
        self.peer_addrs = PeerList(p.addr for p in cfg.peers)
        self.core = GossipCore(cfg.node_id, CLUSTER, cfg.key, self.peer_addrs, cfg.branching, incarnation=1)
        self.stats = self.core.stats
        self.queue: list[tuple[bytes, tuple]] = []
        self.sent: list[tuple[tuple, bytes]] = []

    def arrive(self, datagrams, src):
        self.queue += [(data, src) for _, data in datagrams]

    def poll(self, now):
        got = [self.core.receive(data, src, now) for data, src in self.queue]
        self.queue = []
        return [rx for rx in got if rx is not None]

    def publish(self, values, now):
        self.sent += self.core.publish(values, now)

    def send(self, env, class_id, now):
        routed = self.core.route(env, class_id, now)
        if routed is not None:
            self.sent.append(routed)
        return routed is not None

    def close(self):
        pass


def config(tmp_path, *args):
    opts = up.make_context("up", ["--iface", "lo", "--node-id", "a", "--listen", "10.0.0.1:7470", "--insecure",
                                  "--interval", "1s", "--socket", str(tmp_path / "ctl.sock"),
                                  "--state-dir", str(tmp_path / "state"), *args]).params
    return build_config(opts, check_host=False)


def agent(cfg, dp):
    return Agent(cfg, transport=MemoryTransport, datapath=lambda cfg, gossip_port: dp)


def published(transport) -> list[float]:
    """The values of the Updates this agent put on the wire, oldest first."""
    return [decode(data, None, CLUSTER).payload.value for _, data in transport.sent]


def test_static_agent_writes_global_over_n_and_publishes_its_demand(tmp_path):
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static", "--peers", "b@10.0.0.2:7470,10.0.0.3:7470")
    dp = FakeDatapath()
    with agent(cfg, dp) as a:
        assert dp.attached and dp.sample_probability == 1.0
        t0 = time.monotonic()
        for k in range(4):
            dp.send(250_000)
            a.tick(t0 + k)
        mode, settings = dp.classes[CLASS_ID]
        assert mode == Mode.BUCKET
        assert settings == {"rate_Bps": 500_000.0, "burst_bytes": None, "drop_probability": 0.0,
                            "safe_rate_Bps": 500_000.0, "timeout_s": 20.0, "quota_bytes": None}
        status = a.status()
        assert status["local_limit_bps"] == 4e6 and status["mode"] == "bucket"
        assert 0 < status["demand_bps"] <= 2e6 and status["passed_bytes"] == 1_000_000
        assert published(a.transport)[-2:] == [status["demand_bps"] / 8] * 2    # a full mesh: b and c
    assert dp.closed


def test_fps_agent_divides_the_limit_by_the_weights_it_hears(tmp_path):
    # b is heard at the real time of receive(), the ticks run on a clock of their own: a long
    # peer timeout keeps b alive across them
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470",
                 "--peer-timeout", "1h")
    dp = FakeDatapath()
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    with agent(cfg, dp) as a:
        t0 = time.monotonic()
        weights = []
        for k in range(6):
            a.transport.arrive(peer.publish({CLASS_ID: 3.0}, t0 + k), B)
            a.receive()
            dp.send(125_000)
            a.tick(t0 + k)
            weights.append(a.status()["allocator_state"]["weight"])
        status = a.status()
        assert status["peers"][0]["state"] == "alive" and status["effective_limit_bps"] == 8e6
        assert status["allocator_state"]["remote_weights"] == 3.0
        mode, settings = dp.classes[CLASS_ID]
        # FPS line 10 on the weight published last tick and b's 3.0
        assert mode == Mode.BUCKET and weights[-2] > 0
        assert settings["rate_Bps"] == pytest.approx(1e6 * weights[-2] / (weights[-2] + 3.0))
        assert published(a.transport)[-1] == weights[-1]


def test_status_has_the_documented_keys_before_and_after_a_tick(tmp_path):
    cfg = config(tmp_path, "--global", "10mbit", "--allocator", "grd")
    with agent(cfg, FakeDatapath()) as a:
        before = a.status()
        a.tick(time.monotonic())
        after = a.status()
    for status in (before, after):
        assert set(status) == STATUS_KEYS
        json.dumps(status)
    assert before["mode"] == "pass" and after["allocator_state"]


def keys(tree) -> set[str]:
    """Every key of a JSON tree, nested ones too."""
    if isinstance(tree, dict):
        return set(tree) | {k for v in tree.values() for k in keys(v)}
    return set().union(*map(keys, tree)) if isinstance(tree, list) else set()


@pytest.mark.parametrize("allocator, rate_key", [("grd", "global_limit"), ("gtb", "remote"),
                                                 ("gdrl", "capacity"), ("fps", "share")])
def test_allocator_state_rates_are_bits_per_second(tmp_path, allocator, rate_key):
    cfg = config(tmp_path, "--global", "10mbit", "--allocator", allocator, "--peers", "b@10.0.0.2:7470",
                 "--peer-timeout", "1h")
    dp = FakeDatapath()
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    with agent(cfg, dp) as a:
        t0 = time.monotonic()
        for k in range(3):
            a.transport.arrive(peer.publish({CLASS_ID: 1e6}, t0 + k), B)   # gdrl: b is short, a gives
            a.receive()
            dp.send(500_000)
            a.tick(t0 + k)
        info = a.last[1].decision.info
        state = a.status()["allocator_state"]
    assert not any(k.endswith("_Bps") for k in keys(state)), state
    assert state[f"{rate_key}_bps"] == 8 * info[f"{rate_key}_Bps"]
    if allocator == "gdrl":
        assert {"net_bps", "sent_total_bps", "applied_total_bps"} <= set(state["neighbours"]["b"])


def test_dqmp_state_file_is_written_every_tick_and_restored(tmp_path):
    cfg = config(tmp_path, "--global", "10mbit", "--allocator", "dqmp", "--quota", "1GB/1d",
                 "--peers", "b@10.0.0.2:7470")
    dp = FakeDatapath()
    with agent(cfg, dp) as first:
        t0 = time.monotonic()
        for k in range(3):
            dp.send(2_000_000)
            first.tick(t0 + k)
        saved = cfg.allocator.dump_state(first.state)
    path = tmp_path / "state" / "dqmp-a.json"
    assert json.loads(path.read_text()) == saved
    fresh = cfg.allocator.dump_state(cfg.allocator.initial_state("a", ("a", "b")))
    assert saved != fresh
    with agent(cfg, FakeDatapath()) as second:
        assert cfg.allocator.dump_state(second.state) == saved
