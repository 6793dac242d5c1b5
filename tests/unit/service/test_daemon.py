"""agent/service/daemon.py's Agent without root: an in-memory datapath whose counters the test
advances, and the real gossip core on lists instead of a socket."""
from __future__ import annotations

import dataclasses

import json
import shutil
import time

import pytest

from drl.agent.burst import POLICE_FLOOR, SHAPE_FLOOR
from drl.agent.config.build import class_key
from drl.agent.service.daemon import CLUSTER, Agent
from drl.agent.service.rates import safe_rate, send_gap_s
from drl.agent.kernel.datapath import DatapathError
from drl.agent.kernel.shaper import handle
from drl.agent.gossip.core import GossipCore, Outgoing, PeerList
from drl.agent.model import Mode
from drl.agent.cluster.registry import Registry, RegistryConfig, import_classes
from drl.agent.gossip.wire import decode
from drl.cli.agent import up
from drl.cli.ctl import render, render_set
from drl.lab.etcd import Etcd

from daemon_harness import (CLASS_ID, DEFAULT, TWO, FakeDatapath, FakeShaper, agent, config, file_agent,
                            published, rules_of, values)


B = ("10.0.0.2", 7470)
C = ("10.0.0.3", 7470)

# docs/agent.md "Status": the keys of `drlctl status --json`.
STATUS_KEYS = {
    "node_id", "interface", "allocator", "interval_s", "uptime_s", "listen", "authenticated",
    "global_limit_bps", "effective_limit_bps", "local_limit_bps", "safe_rate_bps", "burst_budget_bytes", "mode",
    "drop_probability", "demand_bps", "rate_bps", "flows", "max_flow_bps", "passed_bytes",
    "passed_packets", "dropped_bytes", "dropped_packets", "quota_bytes_left", "allocator_state",
    "gossip", "peers", "unseen_peers",
    # the sum tree's state (null when the agent does not run it)
    "sum_tree",
    # since classes: the default (or first) class's version and lost values, the lone-agent flag, every class
    "limit_version", "gossip_lost", "standalone", "classes", "ticks",
    # whether our filter is still attached
    "datapath",
    # exceptions the class's step threw, caught there (tick.errors counts every one)
    "errors",
    # tick durations and overruns, the default class's drops by reason
    "tick", "dropped_bytes_by_reason", "dropped_packets_by_reason",
    # shadow mode (what the class's dropped_* count would have been dropped)
    "shadow",
    # etcd's state (null without --registry)
    "registry",
    # police or shape; whether its HTB class holds (false: policed instead); why the default policed it
    "enforce", "shaped", "enforce_reason",
    # per-client throttle and ban (the class's client rule and its refusals)
    "throttled_bytes", "throttled_packets", "banned_bytes", "banned_packets", "clients",
    # a class whose spec matched nothing while the interface carried traffic (null otherwise)
    "hint"}
# The contract for each entry of "classes".
CLASS_KEYS = {"name", "allocator", "global_limit_bps", "effective_limit_bps", "local_limit_bps", "demand_bps",
              "drop_probability", "passed_bytes", "dropped_bytes", "limit_version", "errors"}










def test_a_burst_budget_is_shared_by_the_hosts_buckets(tmp_path):
    """--burst-budget 400KB over 3 hosts: a policed host's bucket is its floor plus a third
    of what D has above 3 floors (133,333 B), less than 300 ms of its rate (150,000 B)."""
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static", "--enforce", "police",
                 "--burst-budget", "400KB", "--peers", "b@10.0.0.2:7470,10.0.0.3:7470")
    dp = FakeDatapath()
    with agent(cfg, dp) as a:
        a.tick(time.monotonic())
        assert dp.classes[CLASS_ID][1]["burst_bytes"] == 133_333
        assert dp.classes[CLASS_ID][1]["safe_burst_bytes"] == 133_333     # at the safe rate G/N: the same share
        assert a.status()["classes"][0]["burst_budget_bytes"] == 400_000


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
        # 50 ms of 12 Mbit/s is less than 3 hosts' HTB floors: each host's burst is its floor
        assert settings == {"rate_Bps": 500_000.0, "burst_bytes": SHAPE_FLOOR, "drop_probability": 0.0,
                            "safe_rate_Bps": 500_000.0, "timeout_s": 20.0, "quota_bytes": None, "shadow": False,
                            "shape_prio": handle(CLASS_ID),             # the one class matches all: shaped
                            "safe_burst_bytes": POLICE_FLOOR}           # the fail-safe polices: its floor
        status = a.status()
        assert status["local_limit_bps"] == 4e6 and status["mode"] == "bucket"
        assert 0 < status["demand_bps"] <= 2e6 and status["passed_bytes"] == 1_000_000
        assert status["classes"][0]["burst_budget_bytes"] == 3 * SHAPE_FLOOR
        assert published(a.transport)[-2:] == [status["demand_bps"] / 8] * 2    # a full mesh: b and c
    assert dp.closed


def test_a_failure_in_the_loop_leaves_the_datapath_enforcing_and_a_stop_detaches(tmp_path, signals_kept):
    """Detached, a failed agent's host would pass everything; attached, its kernel falls back
    to the safe rate, as a killed agent's does (tests/kernel/test_datapath.py shows that part)."""
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static")
    crashed, failed, stopped = FakeDatapath(), FakeDatapath(), FakeDatapath()
    with pytest.raises(ZeroDivisionError):
        with agent(cfg, crashed) as a:
            a.tick = lambda now: 1 / 0                  # a bug
            a.serve()
    assert a.failed and crashed.closed and crashed.attached

    def broken(class_ids):
        raise DatapathError("reading a BPF map failed: Bad address")
    failed.read_counters = broken
    with agent(cfg, failed) as a:
        assert a.serve() == 1
    assert a.failed and failed.closed and failed.attached
    with agent(cfg, stopped) as a:
        a.stopping = True
        assert a.serve() == 0
    assert not a.failed and stopped.closed and not stopped.attached


def test_a_config_is_written_when_it_changes_and_the_heartbeat_every_tick(tmp_path):
    # bpf/police.h stale: the heartbeat keeps an unchanged config fresh, so it is not written again
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static", "--peers", "b@10.0.0.2:7470")
    dp = FakeDatapath()
    with agent(cfg, dp) as a:
        started = dp.writes                       # ClassTable's 1/N share, before any tick
        t0 = time.monotonic()
        for k in range(3):
            a.tick(t0 + k)
        assert (dp.writes - started, dp.heartbeats) == (1, 3)
        a.set_limit({"class": "default", "global": "6mbit"})
        a.tick(t0 + 3)
        assert (dp.writes - started, dp.heartbeats) == (2, 4)
        assert dp.classes[CLASS_ID][1]["rate_Bps"] == 375_000.0


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
            a.transport.arrive(peer.publish(values({DEFAULT: 3.0}), t0 + k), B)
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
        assert published(a.transport)[-1] == pytest.approx(weights[-1], rel=1e-6)   # a 32-bit float


def test_a_host_its_peer_does_not_hear_holds_itself_to_its_safe_rate(tmp_path):
    """One-way loss: we hear b, b does not hear us (its echo says so), so b counts us stale at
    our safe rate: whatever FPS gives us, we pass at most that, until b hears us again."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470")
    dp = FakeDatapath()
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    safe = 1e6 / 2
    with agent(cfg, dp) as a:
        def round_trip(b_hears_us):
            now = time.monotonic()          # receive() and tick() on one clock: b stays alive
            if b_hears_us:
                for _, data in a.transport.sent:
                    peer.receive(data, cfg.listen, now)
            a.transport.sent.clear()
            a.transport.arrive(peer.publish(values({DEFAULT: 0.05}), now), B)
            a.receive()
            dp.send(300_000)                # ~3 MB/s at these 0.1-s ticks: more than the limit
            a.tick(now)
            time.sleep(0.1)
            return dp.classes[CLASS_ID][1]["rate_Bps"], a.status()["allocator_state"]
        for _ in range(10):
            rate, state = round_trip(b_hears_us=False)
        assert state["remote_weights"] == pytest.approx(0.05, rel=1e-6) and state["share_bps"] / 8 > 1.5 * safe
        assert rate == safe and state["unheard_by"] == 1
        for _ in range(3):
            rate, state = round_trip(b_hears_us=True)
        assert rate == pytest.approx(state["share_bps"] / 8) and rate > 1.5 * safe and "unheard_by" not in state


def test_a_loop_held_up_past_the_stale_rules_slack_holds_itself_to_its_safe_rate(tmp_path, caplog):
    """A tick so late that b had no datagram from us for more than half the slack (one lost
    in between): b may count us stale and reserve our safe rate once our fail-safe would have
    started, while our kernel, heartbeat by heartbeat, passes our limit.  So that tick passes at
    most the safe rate; the next on-time one, after a round that reached b, its share again."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470",
                 "--peer-timeout", "1h")
    dp = FakeDatapath()
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    safe, step = 1e6 / 2, cfg.interval_s
    with agent(cfg, dp) as a:
        t0 = time.monotonic()

        def tick_at(t):
            for _, data in a.transport.sent:    # b hears every datagram we sent
                peer.receive(data, cfg.listen, t)
            a.transport.sent.clear()
            a.transport.arrive(peer.publish(values({DEFAULT: 0.05}), t), B)
            a.receive()
            dp.send(3 * 10**6 * step)        # more than the limit
            a.tick(t)
            return dp.classes[CLASS_ID][1]["rate_Bps"], a.status()
        for k in range(10):
            rate, st = tick_at(t0 + k * step)
        assert rate > 1.5 * safe and st["tick"]["held_late"] == 0
        gap_s = send_gap_s(cfg, 1)     # one peer's cycle is 1 round: 1.5 intervals and the jitter
        rate, st = tick_at(t0 + 9 * step + gap_s + 0.1 * step)
        assert rate == safe and st["tick"]["held_late"] == 1 and st["allocator_state"]["unheard_by"] == 1
        assert sum("gossip_late" in r.getMessage() for r in caplog.records) == 1
        rate, st = tick_at(t0 + 10 * step + gap_s + 0.1 * step)
        assert rate > 1.5 * safe and st["tick"]["held_late"] == 1 and "unheard_by" not in st["allocator_state"]


def test_status_has_the_documented_keys_before_and_after_a_tick(tmp_path):
    cfg = config(tmp_path, "--global", "10mbit", "--allocator", "grd")
    with agent(cfg, FakeDatapath()) as a:
        before = a.status()
        a.tick(time.monotonic())
        after = a.status()
    for status in (before, after):
        assert set(status) == STATUS_KEYS
        json.dumps(status)
    assert before["mode"] == "bucket" and before["local_limit_bps"] == 10e6   # policed from the start
    assert before["allocator_state"] == {} and after["allocator_state"]
    assert all(set(c) >= CLASS_KEYS for c in after["classes"]) and after["classes"][0]["name"] == "default"


def test_a_class_whose_step_throws_falls_back_to_its_safe_rate_and_the_others_go_on(tmp_path, caplog):
    """One class's exception (a bug, a value no check foresaw) is that class's: it is held to
    its safe rate, counted and logged once a minute; the other class and the tick go on."""
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)
    with a:
        runs = {run.name: run for run in a.table}
        broken = runs["A"].conf.allocator

        class Boom:
            name = broken.name

            def step(self, state, snap):
                raise OverflowError("cannot convert float infinity to integer")
        runs["A"].conf = dataclasses.replace(runs["A"].conf, allocator=Boom())
        with caplog.at_level("ERROR", logger="drl.agent"):
            for _ in range(3):
                a.tick(time.monotonic())
        status = a.status()
    a_id, b_id = runs["A"].class_id, runs["B"].class_id
    assert dp.classes[a_id][0] == Mode.BUCKET and dp.classes[a_id][1]["rate_Bps"] == 1e6 / 2   # 8mbit / 2 hosts
    assert dp.classes[b_id][1]["rate_Bps"] == 0.5e6 / 2 and runs["B"].last is not None       # B decided
    by_name = {c["name"]: c for c in status["classes"]}
    assert by_name["A"]["errors"] == 3 and by_name["B"]["errors"] == 0 and status["tick"]["errors"] == 3
    assert status["tick"]["errors_by"] == [{"class": "A", "stage": "allocate", "count": 3}]
    lines = [r.getMessage() for r in caplog.records if "tick_error" in r.getMessage()]
    assert len(lines) == 1 and "class=A stage=allocate" in lines[0] and "OverflowError" in lines[0], lines


def test_a_class_whose_write_throws_is_counted_as_enforce_and_written_at_its_safe_rate(tmp_path, caplog):
    """The datapath refuses one class's decision (set_class is all or nothing, a DatapathError):
    that class is written at its safe rate instead, and the next tick writes its decision again."""
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)
    with a:
        runs = {run.name: run for run in a.table}
        a_id, b_id = runs["A"].class_id, runs["B"].class_id
        real, refused = dp.set_class, []

        def set_class(class_id, mode, **settings):
            if class_id == a_id and not refused and settings.get("shape_prio") is not None:
                refused.append(settings)
                raise DatapathError(f"class {class_id}: rate inf is not a finite number")
            real(class_id, mode, **settings)
        dp.set_class = set_class
        dp.classes.clear()
        with caplog.at_level("ERROR", logger="drl.agent"):
            a.tick(time.monotonic())
            first = dict(dp.classes)
            a.tick(time.monotonic())
        status = a.status()
    assert refused and first[a_id][1]["rate_Bps"] == 1e6 / 2 and "shape_prio" not in first[a_id][1]   # the fallback
    assert first[b_id][1]["rate_Bps"] == 0.5e6 / 2
    assert dp.classes[a_id][1].get("shape_prio") is not None        # the next tick: its decision, written
    assert status["tick"]["errors_by"] == [{"class": "A", "stage": "enforce", "count": 1}]
    lines = [r.getMessage() for r in caplog.records if "tick_error" in r.getMessage()]
    assert len(lines) == 1 and "class=A stage=enforce" in lines[0] and "DatapathError" in lines[0], lines


def test_a_control_request_whose_handler_throws_is_counted_and_answered(tmp_path, monkeypatch):
    from drl.agent.service.control import answer

    with agent(config(tmp_path, "--global", "8mbit"), FakeDatapath()) as a:
        def broken(req):
            raise ZeroDivisionError("a bug")
        monkeypatch.setattr(a, "set_limit", broken)
        reply = answer(b'{"cmd": "set", "class": "default", "global": "1mbit"}', a.commands())
        a.tick(time.monotonic())
        status = json.loads(b"".join(answer(b'{"cmd": "status"}', a.commands())))["status"]     # streamed
    assert reply["ok"] is False and "set" in reply["error"]
    assert status["tick"]["errors"] == 1
    assert status["tick"]["errors_by"] == [{"class": "", "stage": "control", "count": 1}]


def test_a_datagram_whose_handling_throws_is_counted_and_the_rest_are_handled(tmp_path, monkeypatch):
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470")
    peer = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
    with agent(cfg, FakeDatapath()) as a:
        heard, calls = a.limits.heard, []

        def once_broken(rx):
            calls.append(rx)
            if len(calls) == 1:
                raise KeyError("a bug")
            heard(rx)
        monkeypatch.setattr(a.limits, "heard", once_broken)
        now = time.monotonic()
        a.transport.arrive(peer.publish(values({DEFAULT: 1.0}), now) + peer.publish(values({DEFAULT: 2.0}), now), B)
        a.receive()
        a.tick(now)
        status = a.status()
    assert len(calls) == 2 and status["tick"]["errors"] == 1
    assert status["tick"]["errors_by"] == [{"class": "", "stage": "receive", "count": 1}]
    assert status["peers"][0]["state"] == "alive" and status["allocator_state"]["remote_weights"] == 2.0


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
            a.transport.arrive(peer.publish(values({DEFAULT: 1e6}), t0 + k), B)   # gdrl: b is short, a gives
            a.receive()
            dp.send(500_000)
            a.tick(t0 + k)
        info = a.table.get("default").last[1].decision.info
        state = a.status()["allocator_state"]
    assert not any(k.endswith("_Bps") for k in keys(state)), state
    assert state[f"{rate_key}_bps"] == 8 * info[f"{rate_key}_Bps"]
    if allocator == "gdrl":
        assert {"net_bps", "sent_total_bps", "applied_total_bps"} <= set(state["neighbours"]["b"])


def test_dqmp_state_file_is_written_every_tick_and_restored(tmp_path):
    cfg = config(tmp_path, "--global", "10mbit", "--allocator", "dqmp", "--quota", "1GB/1d",
                 "--peers", "b@10.0.0.2:7470")
    alloc = cfg.classes[0].allocator
    dp = FakeDatapath()
    with agent(cfg, dp) as first:
        t0 = time.monotonic()
        for k in range(3):
            dp.send(2_000_000)
            first.tick(t0 + k)
        saved = alloc.dump_state(first.table.get("default").state)
    path = tmp_path / "state" / "dqmp-a.json"
    assert json.loads(path.read_text()) == saved
    fresh = alloc.dump_state(alloc.initial_state("a", ("a", "b")))
    assert saved != fresh
    with agent(cfg, FakeDatapath()) as second:
        assert alloc.dump_state(second.table.get("default").state) == saved


# -- many classes: reload, live limits, a lone agent ------------------------------------------

from drl.agent.cluster.limits import Limit                      # noqa: E402
from drl.agent.gossip.wire import LimitNote  # noqa: E402
from drl.cli.agent import load_config                    # noqa: E402







def test_each_class_gets_its_own_slot_rules_limit_and_status(tmp_path):
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)
    with a:
        assert rules_of(dp) == {"proto=6,dport=5201": 0, "proto=6,dport=5202": 1}
        a.tick(time.monotonic())
        assert dp.classes[0][1]["rate_Bps"] == 500_000 and dp.classes[1][1]["rate_Bps"] == 250_000
        status = a.status()
    assert [c["name"] for c in status["classes"]] == ["A", "B"]
    assert status["global_limit_bps"] == 8e6 and status["classes"][1]["global_limit_bps"] == 4e6


def test_reload_adds_changes_and_removes_classes_and_leaves_the_rest_alone(tmp_path):
    dp = FakeDatapath()
    a, path = file_agent(tmp_path, TWO, dp)
    with a:
        a.tick(time.monotonic())
        b_before = a.table.get("B")
        path.write_text(TWO.replace('name = "A"\nglobal = "8mbit"\nmatch = ["dport=5201,proto=tcp"]',
                                    'name = "C"\nglobal = "2mbit"\nmatch = ["dport=5203,proto=tcp"]'))
        reply = a.reload()
        assert reply == {"ok": True, "added": ("C",), "changed": (), "removed": ("A",)}
        assert a.table.get("B") is b_before and a.table.get("B").class_id == 1     # untouched
        # C took a free slot, not A's: A's slot is reset only once no rule points at it
        assert rules_of(dp) == {"proto=6,dport=5202": 1, "proto=6,dport=5203": 2}
        assert dp.resets[-1] == 0 and dp.classes[2][0] == Mode.BUCKET             # C policed at once
        path.write_text("[agent\n")
        bad = a.reload()
        assert not bad["ok"] and "drl.toml" in bad["error"] and len(a.table) == 2


def test_a_live_set_is_announced_to_every_peer_and_persisted(tmp_path):
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)
    with a:
        reply = a.set_limit({"class": "B", "global": "6mbit"})
        v = reply["limit_version"]                  # the time of the set, in ms (cluster/limits.py)
        assert abs(v - time.time() * 1000) < 5000, reply
        assert reply == {"ok": True, "class": "B", "global_limit_bps": 6e6, "limit_version": v, "peers": 1}
        assert render_set(reply).endswith(f"(version {v}); the other agents follow within a few intervals")
        assert render_set({**reply, "peers": 0}) == f"B: global 6 Mbit/s (version {v})"
        a.tick(time.monotonic())
        assert dp.classes[1][1]["rate_Bps"] == 375_000                      # 6 Mbit/s over 2 nodes
        notes = [n for _, data in a.transport.sent for n in decode(data, None, CLUSTER).payload.limits]
        assert LimitNote(class_key("B"), v, 750_000.0) in notes
        assert not a.set_limit({"class": "Z", "global": "1mbit"})["ok"]
        unban = a.commands()["unban"]
        assert unban({"prefix": "10.0.0.9", "class": "Z"})["error"] == "no class 'Z' (see drlctl classes)"
        assert "unit" in a.set_limit({"class": "B", "global": "6"})["error"]
    again, _ = file_agent(tmp_path, TWO, FakeDatapath())
    with again:
        assert again.book.get("B") == Limit(v, 750_000.0)                    # a restart keeps it


def test_newer_limits_from_peers_win_and_a_peer_behind_is_told(tmp_path):
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)
    peer = GossipCore("b", CLUSTER, None, PeerList([("10.0.0.1", 7470)]), 1, incarnation=1)
    with a:
        peer.announce(LimitNote(class_key("A"), 3, 2e6))
        a.transport.arrive(peer.publish({}, 0.0), B)
        a.receive()
        assert a.book.get("A") == Limit(3, 2e6)
        v = a.set_limit({"class": "B", "global": "1mbit"})["limit_version"]
        a.transport.sent.clear()
        a.transport.arrive(peer.publish({class_key("B"): Outgoing(1.0, version=0)}, 1.0), B)
        a.receive()
        a.tick(time.monotonic())
        told = [n for _, data in a.transport.sent for n in decode(data, None, CLUSTER).payload.limits]
        assert LimitNote(class_key("B"), v, 125_000.0) in told


def test_a_lone_agent_has_no_socket_and_no_key(tmp_path):
    cfg = config(tmp_path, "--global", "10mbit", "--peers", "")
    assert cfg.standalone
    with Agent(cfg, datapath=lambda cfg, gossip_port: FakeDatapath(), shaper=FakeShaper) as a:
        assert a.transport.sock is None and a.status()["listen"] is None
        a.tick(time.monotonic())
        assert a.status()["local_limit_bps"] == 10e6


def test_a_reload_whose_rules_the_datapath_cannot_hold_changes_nothing(tmp_path):
    dp = FakeDatapath()
    a, path = file_agent(tmp_path, TWO, dp)
    with a:
        rules, resets = list(dp.rules), list(dp.resets)
        many = "".join(f'\n[[class]]\nname = "p{i}"\nglobal = "1mbit"\nmatch = ["dport={6000 + i},proto=udp"]\n'
                       for i in range(9))                    # 9 port-only classes: 9 rules at prefix "any"
        path.write_text(TWO + many)
        reply = a.reload()
        assert not reply["ok"] and "at most 8" in reply["error"], reply
        assert dp.rules == rules and [r.name for r in a.table] == ["A", "B"] and dp.resets == resets


def test_agents_whose_files_disagree_at_one_version_converge_on_the_higher_rate(tmp_path):
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO, dp)            # A at 8 Mbit/s, version 0
    peer = GossipCore("b", CLUSTER, None, PeerList([("10.0.0.1", 7470)]), 1, incarnation=1)
    def notes(t):
        return [n for _, data in a.transport.core.publish({}, t) for n in decode(data, None, CLUSTER).payload.limits]

    with a:
        rounds = [notes(t) for t in range(4)]
        assert all(LimitNote(class_key("A"), 0, 1e6) in r for r in rounds[:3]) and rounds[3] == []  # at start
        peer.announce(LimitNote(class_key("A"), 0, 5e5))               # b's file says 4 Mbit/s
        a.transport.arrive(peer.publish({}, 0.0), B)
        a.receive()
        assert a.book.get("A") == Limit(0, 1e6)
        assert notes(5) == [LimitNote(class_key("A"), 0, 1e6)]         # ... and b is told the higher one


def follow(a, until, timeout_s: float = 5.0) -> None:
    """Run the agent's registry step until ``until()`` holds (the watch is a thread)."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, a.status()["registry"]
        a._follow_registry()
        time.sleep(0.02)


@pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd (Debian etcd-server)")
def test_members_classes_and_limits_follow_a_real_etcd(tmp_path):
    with Etcd() as etcd:
        args = ["--iface", "lo", "--node-id", "a", "--listen", "127.0.0.1:7470", "--insecure", "--interval", "1s",
                "--socket", str(tmp_path / "ctl.sock"), "--state-dir", str(tmp_path / "state"),
                "--global", "10mbit", "--registry", etcd.url, "--cluster", "t"]
        opts = up.make_context("up", args).params
        cfg = load_config(None, opts, {"global_Bps", "registry", "cluster"}, check_host=False)
        b = Registry(RegistryConfig(etcd.endpoints, "t"), "b", ("127.0.0.2", 7470), 1)
        b.start()
        dp = FakeDatapath()
        with agent(cfg, dp) as a:
            follow(a, lambda: a.members.n_nodes == 2)                   # b registered: N = 2
            assert safe_rate(a.table.get("default").conf, a.book.get("default"), a.members.n_nodes) == 10e6 / 8 / 2
            import_classes(cfg.registry, [{"name": "gold", "global": "20mbit", "match": ["dst=10.9.0.0/16"]}])
            follow(a, lambda: a.table.get("gold") is not None)          # a class that only etcd has
            assert a.book.get("gold").global_Bps == 20e6 / 8
            reply = a.set_limit({"class": "default", "global": "5mbit"})
            assert reply["ok"] and reply["registry"] == "queued", reply
            assert render_set(reply) == ("default: global 5 Mbit/s; registry: queued, every agent applies it "
                                         "from etcd within a few intervals")       # no version: etcd orders it
            # from etcd, like every agent; b's own watch may hear it a moment after a's
            follow(a, lambda: a.book.get("default").global_Bps == 5e6 / 8 and "default" in b.view().classes)
            # whole: an agent without a class of that name starts this one, not a match-all
            assert b.view().classes["default"] == {"name": "default", "global": "5mbit", "allocator": "fps",
                                                   "match": []}
            b.close()                                                   # revoked: gone at once
            follow(a, lambda: a.members.n_nodes == 1, timeout_s=3.0)
            st = a.status()["registry"]
            assert st["state"] == "reachable" and st["members"] == ["a"] and st["classes"] == ["default", "gold"]


def test_an_agent_that_cannot_reach_etcd_at_start_does_not_start(tmp_path):
    """Alone it would count N = 1 and take the whole limit of a cluster it cannot see."""
    from drl.agent.service.daemon import StartupError
    from drl.lab.etcd import free_port

    args = ["--iface", "lo", "--node-id", "a", "--listen", "127.0.0.1:7470", "--insecure", "--interval", "1s",
            "--socket", str(tmp_path / "ctl.sock"), "--state-dir", str(tmp_path / "state"), "--global", "10mbit",
            "--registry", f"etcd://127.0.0.1:{free_port()}", "--cluster", "t", "--registry-timeout", "1s"]
    cfg = load_config(None, up.make_context("up", args).params,
                      {"global_Bps", "registry", "cluster", "registry_timeout_s"}, check_host=False)
    dp = FakeDatapath()
    t0 = time.monotonic()
    with pytest.raises(StartupError, match=r"no view of the cluster from etcd in 1 s \(--registry-timeout; "
                                           r".*connection refused.*knows neither"):
        agent(cfg, dp)
    assert 1.0 <= time.monotonic() - t0 < 4.0          # it waited its --registry-timeout, no more
    assert not dp.attached and not (tmp_path / "ctl.sock").exists()     # nothing left behind


@pytest.mark.parametrize("allocator", ["gdrl", "fillratio"])
def test_a_diffusion_class_enforces_a_live_set_on_the_next_tick(tmp_path, allocator):
    """Its ledger holds parts of the global limit: a lone agent enforced the old one for good."""
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "20mbit", "--allocator", allocator), dp) as a:
        t0 = time.monotonic()
        a.tick(t0)
        assert dp.classes[CLASS_ID][1]["rate_Bps"] == pytest.approx(2.5e6)
        for k, (rate, Bps) in enumerate((("10mbit", 1.25e6), ("40mbit", 5e6))):
            assert a.set_limit({"class": "default", "global": rate})["ok"]
            a.tick(t0 + 1 + k)
            assert dp.classes[CLASS_ID][1]["rate_Bps"] == pytest.approx(Bps)


def test_rejected_gossip_is_logged_by_reason_at_most_once_a_minute(tmp_path, caplog):
    """A peer with another key (or not in --peers) showed only as stale: now one warning
    per reason, with what to check, then at most one a minute with the count since."""
    import logging
    from drl.agent import logs

    caplog.set_level(logging.WARNING, logger="drl.agent")
    cfg = config(tmp_path, "--global", "8mbit", "--peers", "b@10.0.0.2:7470")
    stranger = GossipCore("x", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)

    def lines():
        return [logs.LogfmtFormatter().format(r) for r in caplog.records
                if isinstance(r.msg, logs.Event) and r.msg.name == "gossip_rejected"]

    with agent(cfg, FakeDatapath()) as a:
        t0 = time.monotonic()
        for k in range(3):          # ticks 1 s apart: one line for the three
            a.transport.arrive(stranger.publish(values({DEFAULT: 1.0}), t0 + k), ("10.0.0.66", 7470))
            a.receive()
            a.tick(t0 + k)
        assert len(lines()) == 1 and "reason=unknown_peer datagrams=1" in lines()[0], lines()
        assert "not in --peers" in lines()[0]
        a.tick(t0 + 61)
        assert len(lines()) == 2 and "datagrams=2" in lines()[1], lines()
        a.tick(t0 + 200)            # nothing new: nothing said
        assert len(lines()) == 2


def test_a_set_on_a_dqmp_class_is_refused_with_what_to_do(tmp_path):
    """Its limit is its volume quota: a set changed the label, promised that every agent
    follows, and enforced nothing."""
    dp = FakeDatapath()
    text = TWO.replace('[[class]]\nname = "A"', '[[class]]\nname = "Q"\nglobal = "1mbit"\nallocator = "dqmp"\n'
                       'quota = "1GB/1d"\nmatch = ["dport=9"]\n\n[[class]]\nname = "A"', 1)
    a, _ = file_agent(tmp_path, text, dp)
    with a:
        reply = a.set_limit({"class": "Q", "global": "2mbit"})
        assert not reply["ok"] and "volume quota" in reply["error"] and "reload" in reply["error"]
        assert a.book.get("Q").version == 0
        assert a.set_limit({"class": "A", "global": "2mbit"})["ok"]


@pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd (Debian etcd-server)")
def test_a_class_in_etcd_that_does_not_check_keeps_no_agent_with_classes_of_its_own_down(tmp_path):
    """One bad table written with etcdctl: running agents refuse it (one line); a starting one
    with classes of its own starts with them instead of exiting (every unit would crash-loop)."""
    from drl.agent.service.daemon import StartupError

    def args(*more):
        return ["--iface", "lo", "--node-id", "a", "--listen", "127.0.0.1:7470", "--insecure", "--interval", "1s",
                "--socket", str(tmp_path / "ctl.sock"), "--state-dir", str(tmp_path / "state"), *more]

    with Etcd() as etcd:
        reg = ["--registry", etcd.url, "--cluster", "t"]
        cfg = load_config(None, up.make_context("up", args("--global", "10mbit", *reg)).params,
                          {"global_Bps", "registry", "cluster"}, check_host=False)
        import_classes(cfg.registry, [{"name": "silver", "global": "lots"}])
        with agent(cfg, FakeDatapath()) as a:
            st = a.status()["registry"]
            assert [c["name"] for c in a.status()["classes"]] == ["default"]
            assert "silver" in st["classes_refused"] and "not a rate" in st["classes_refused"]
            text = render(a.status())
            assert "registry    reachable for " in text and "etcd's classes refused: etcd class 'silver'" in text
            reply = a.set_limit({"class": "default", "global": "5mbit"})
            assert reply["ok"] and "do not check, so no agent applies it" in render_set(reply)
        bare = load_config(None, up.make_context("up", args(*reg)).params, {"registry", "cluster"}, check_host=False)
        with pytest.raises(StartupError, match="etcd's classes do not check and this agent has none of its own"):
            agent(bare, FakeDatapath())
