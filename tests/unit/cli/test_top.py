"""drlctl top without a terminal: frame() from two statuses, and the batch mode through click.

The statuses have the shape of agent/service/daemon.py Agent.status(); one test renders a
real Agent's status (in-memory datapath) so that a change of shape shows here.
"""
from __future__ import annotations

import copy
import time

import pytest
from click.testing import CliRunner

from drl.agent.service.control import ControlError
from drl.cli import ctl, top
from drl.cli.top import class_rows, fit, frame, interval


def klass(name: str, rate_bps: float, dropped_packets: int, *, shadow: bool = False, flows: int = 3) -> dict:
    return {"name": name, "allocator": "fps", "global_limit_bps": 50e6, "limit_version": 0,
            "effective_limit_bps": 50e6, "local_limit_bps": 20e6, "safe_rate_bps": 16.7e6, "mode": "bucket",
            "shadow": shadow, "drop_probability": 0.0, "demand_bps": rate_bps * 1.5, "rate_bps": rate_bps,
            "flows": flows, "max_flow_bps": rate_bps / flows, "passed_bytes": 10**9, "passed_packets": 10**6,
            "dropped_bytes": dropped_packets * 1500, "dropped_packets": dropped_packets, "quota_bytes_left": None,
            "gossip_lost": 0, "allocator_state": {"weight": 1.0}}


def status(uptime_s: float, sent: int, bytes_sent: int, classes: list[dict], peers=("alive", "stale")) -> dict:
    st = {"node_id": "a", "interface": "eth0", "interval_s": 0.1, "uptime_s": uptime_s, "ticks": int(uptime_s * 10),
          "listen": "10.0.0.1:7470", "standalone": False, "authenticated": True,
          "datapath": {"state": "attached", "reattached": 0, "error": None},
          "gossip": {"sent": sent, "received": sent // 2, "lost": 1, "rejected": 0, "rejected_by_reason": {},
                     "bytes_sent": bytes_sent, "bytes_received": bytes_sent // 2, "unroutable": 0, "send_errors": 0,
                     "control_bps": 8000.0},
          "peers": [{"node_id": f"p{i}", "address": f"10.0.0.{i + 2}:7470", "state": state, "last_seen_s": 0.1,
                     "incarnation": 1, "lost": 0} for i, state in enumerate(peers)]}
    st.update({k: v for k, v in classes[0].items() if k != "name"})
    st["classes"] = classes
    return st


BEFORE = status(3725.0, 1000, 100_000, [klass("gold", 18e6, 100), klass("silver", 30e6, 0, shadow=True)])
AFTER = status(3727.0, 1020, 104_000, [klass("gold", 19e6, 160), klass("silver", 31e6, 50, shadow=True)])


def test_rows_are_sorted_by_rate_with_drops_per_second_and_the_shadow_marker():
    rows = class_rows(BEFORE, AFTER, 2.0)
    assert [r[0] for r in rows] == ["silver", "gold"]
    assert rows[0] == ("silver", "50 Mbit/s", "20 Mbit/s", "46.5 Mbit/s", "31 Mbit/s", "25.0", "3", "yes")
    assert rows[1][5] == "30.0" and rows[1][7] == ""


def test_the_header_has_node_uptime_peers_and_gossip_rates():
    lines = frame(BEFORE, AFTER, interval(BEFORE, AFTER))
    assert lines[0] == "drl top - node a on eth0  up 1h02m  peers 1 alive, 1 stale  classes 2"
    assert lines[1] == "gossip  sent 10.0/s 2 KB/s   received 5.0/s 1 KB/s   lost 1"
    assert lines[3].split() == ["CLASS", "GLOBAL", "LOCAL", "DEMAND", "RATE", "DROPS/S", "FLOWS", "SHADOW"]
    assert lines[4].startswith("silver") and lines[5].startswith("gold") and len(lines) == 6


def test_without_a_previous_read_rates_are_unknown():
    lines = frame(None, AFTER, None)
    assert "sent -/s -/s" in lines[1]
    assert all(row[5] == "-" for row in class_rows(None, AFTER, None))


def test_a_restarted_agent_or_a_reset_counter_shows_no_rate():
    restarted = copy.deepcopy(AFTER)
    restarted["uptime_s"] = 1.0
    assert interval(BEFORE, restarted) is None
    reset = copy.deepcopy(AFTER)
    reset["classes"][0]["dropped_packets"] = 5          # gold, removed and added again: 100 before
    assert class_rows(BEFORE, reset, 2.0)[1][:1] + class_rows(BEFORE, reset, 2.0)[1][5:6] == ("gold", "-")


def test_a_new_class_has_no_rate_until_its_second_read():
    grown = copy.deepcopy(AFTER)
    grown["classes"].append(klass("bronze", 1e6, 7))
    assert class_rows(BEFORE, grown, 2.0)[-1][:1] + class_rows(BEFORE, grown, 2.0)[-1][5:6] == ("bronze", "-")


def test_a_small_terminal_gets_a_cut_frame():
    lines = frame(BEFORE, AFTER, 2.0, width=20, height=3)
    assert len(lines) == 3 and all(len(line) <= 20 for line in lines)
    assert frame(BEFORE, AFTER, 2.0, width=0, height=0) == []
    assert fit(["abc"], -1, 5) == [""]


def test_a_lone_agent_says_it_does_not_gossip():
    alone = status(10.0, 0, 0, [klass("default", 1e6, 0)], peers=())
    alone["standalone"] = True
    lines = frame(alone, alone, None)
    assert "peers 0 alive, 0 stale" in lines[0] and lines[1] == "gossip  off (running alone)"


def test_a_real_agents_status_renders(tmp_path):
    from daemon_harness import FakeDatapath, agent, config
    with agent(config(tmp_path, "--global", "10mbit", "--shadow"), FakeDatapath()) as a:
        first = a.status()
        a.tick(time.monotonic())
        second = a.status()
    lines = frame(first, second, interval(first, second))
    assert lines[-1].split()[0] == "default" and lines[-1].split()[-1] == "yes"


@pytest.fixture
def agent_replies(monkeypatch):
    """drlctl's requests answered from a list of statuses, in order."""
    replies = [BEFORE, AFTER, AFTER]
    monkeypatch.setattr(top, "request", lambda path, cmd: {"ok": True, "status": replies.pop(0)})
    monkeypatch.setattr(top.time, "sleep", lambda s: None)
    return replies


def test_batch_mode_prints_a_frame_per_iteration(agent_replies):
    result = CliRunner().invoke(ctl.main, ["top", "--batch", "--iterations", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count("drl top - node a") == 2 and out.count("\nsilver ") == 2 and out.count("\ngold ") == 2, out


def test_once_is_one_frame(agent_replies):
    result = CliRunner().invoke(ctl.main, ["top", "--once"])
    assert result.exit_code == 0 and result.output.count("CLASS") == 1


def test_no_agent_is_one_line_and_exit_1(monkeypatch):
    def refuse(path, cmd):
        raise ControlError(f"no agent socket at {path} (is drl-agent running? try --socket)")
    monkeypatch.setattr(top, "request", refuse)
    result = CliRunner().invoke(ctl.main, ["--socket", "/nowhere", "top"])
    assert result.exit_code == 1
    assert result.output == "Error: no agent socket at /nowhere (is drl-agent running? try --socket)\n"


def test_interactive_mode_needs_a_terminal(agent_replies):
    result = CliRunner().invoke(ctl.main, ["top"])
    assert result.exit_code == 1 and "use drlctl top --batch" in result.output
