"""agent/service/metrics.py without root: the daemon's status as Prometheus series, checked by
``promtool check metrics`` (Debian's prometheus package) when it is installed."""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from drl.agent.config.build import ConfigError
from drl.agent.service.daemon import Agent, StartupError
from drl.agent.service.metrics import (Board, Collector, DropTally, MetricsError, MetricsServer, TickStats,
                               drop_reason)
from drl.agent.model import Decision, Mode
from drl.agent.config import toml

from daemon_harness import FakeDatapath, FakeShaper, MemoryTransport, agent, config


def exposition(board: Board) -> str:
    registry = CollectorRegistry()
    registry.register(Collector(board, version="1.2.3"))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus; scripts/setup.sh does)")
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    # promtool prints lint problems and exits 1 on any; an empty report is a pass
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def running_agent(tmp_path, *args):
    """A grd agent with peers after a few ticks, some of its traffic dropped."""
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "grd", "--peers", "b@10.0.0.2:7470", *args)
    dp = FakeDatapath()
    a = agent(cfg, dp)
    t0 = time.monotonic()
    for k in range(3):
        dp.send(500_000)
        dp.counters = dp.counters._replace(dropped_bytes=dp.counters.dropped_bytes + 3000,
                                           dropped_packets=dp.counters.dropped_packets + 2)
        a.tick(t0 + k)
        a.tick_stats.observe(0.003 * (k + 1), overran=k == 2)
    a.board.timeout_s = 0       # no loop runs here to answer a scrape: serve what was published
    return a


def test_tick_stats_is_a_cumulative_histogram_with_overruns():
    t = TickStats(buckets=(0.001, 0.01))
    for d, late, start in ((0.0005, False, 0.002), (0.001, False, 0.0), (0.005, False, 0.0), (0.5, True, 0.001)):
        t.observe(d, late, start)
    assert [t.unsent(n) for n in (0, 2, 1, 0, 3)] == [False, True, False, False, True]   # when it starts
    assert t.as_dict() == {"buckets": {"0.001": 2, "0.01": 3, "+Inf": 4}, "sum_s": pytest.approx(0.5065),
                           "count": 4, "last_s": 0.5, "overruns": 1, "late_ms": 1.0, "late_max_ms": 2.0,
                           "held_late": 3}


def test_drops_take_the_reason_of_the_decision_in_force():
    assert drop_reason(None) == "bucket"
    assert drop_reason(Decision(Mode.BUCKET, 1e6)) == "bucket"
    assert drop_reason(Decision(Mode.DROP, 1e6, drop_probability=0.3)) == "random_drop"
    assert drop_reason(Decision(Mode.PASS, 0.0, quota_bytes=10)) == "quota"
    assert drop_reason(Decision(Mode.BUCKET, 1e6, quota_bytes=0)) == "quota"       # allowance used up
    assert drop_reason(Decision(Mode.BUCKET, 1e6, quota_bytes=10)) == "bucket"
    tally = DropTally()
    tally.add(1000, 2, "bucket")
    tally.add(1500, 3, "random_drop")
    tally.add(100, 1, "bucket")            # the slot was reset: nothing counted backwards
    assert tally.bytes == {"bucket": 1000, "random_drop": 500, "quota": 0}
    assert tally.packets == {"bucket": 2, "random_drop": 1, "quota": 0}


def test_every_series_matches_the_status_and_passes_promtool(tmp_path):
    with running_agent(tmp_path) as a:
        a.board.publish(a.status())
        st = a.board.latest.status
    text = exposition(a.board)
    promtool_check(text)
    got = samples(text)
    cl = st["classes"][0]
    assert got[("drl_build_info", (("version", "1.2.3"),))] == 1
    assert got[("drl_passed_bytes_total", (("class", "default"),))] == cl["passed_bytes"] == 1_500_000
    assert got[("drl_class_global_limit_bytes_per_second", (("class", "default"),))] == 1e6   # 8 Mbit/s
    assert got[("drl_class_demand_bytes_per_second", (("class", "default"),))] == cl["demand_bps"] / 8
    assert got[("drl_class_mode", (("class", "default"), ("mode", "drop")))] == 1
    # the first tick's drops went to the start-up bucket, the later ones to grd's random drop
    assert cl["dropped_bytes_by_reason"] == {"bucket": 3000, "random_drop": 6000, "quota": 0}
    assert got[("drl_dropped_bytes_total", (("class", "default"), ("reason", "random_drop")))] == 6000
    assert got[("drl_dropped_packets_total", (("class", "default"), ("reason", "bucket")))] == 2
    assert got[("drl_peer_up", (("address", "10.0.0.2:7470"), ("peer", "b")))] == 0      # never heard
    assert got[("drl_gossip_sent_datagrams_total", ())] == st["gossip"]["sent"] > 0
    assert got[("drl_gossip_rejected_datagrams_total", (("reason", "forged"),))] == 0
    assert got[("drl_tick_duration_seconds_count", ())] == 3
    assert got[("drl_tick_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("drl_tick_overruns_total", ())] == st["tick"]["overruns"] == 1
    assert got[("drl_ticks_total", ())] == st["ticks"] == 3


def test_tick_errors_are_counted_by_class_and_stage(tmp_path):
    with running_agent(tmp_path) as a:
        a.errors.record("allocate", OverflowError("inf"), 0.0, class_="default")
        a.errors.record("allocate", OverflowError("inf"), 1.0, class_="default")
        a.errors.record("receive", KeyError("x"), 1.0, peer="b")
        a.board.publish(a.status())
    text = exposition(a.board)
    promtool_check(text)
    got = samples(text)
    assert got[("drl_tick_errors_total", (("class", "default"), ("stage", "allocate")))] == 2
    assert got[("drl_tick_errors_total", (("class", ""), ("stage", "receive")))] == 1


def test_a_scrape_waits_for_the_next_tick_or_takes_the_last_state():
    board = Board(timeout_s=5)
    assert not board.wanted
    got = []
    scrape = threading.Thread(target=lambda: got.append(board.request()))
    scrape.start()
    deadline = time.monotonic() + 5
    while not board.wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    board.publish({"ticks": 7})          # what the loop does after the tick
    scrape.join(5)
    assert got[0].status == {"ticks": 7} and not board.wanted
    board.timeout_s = 0.01               # a loop that does not tick: the last state, stale
    assert board.request().status == {"ticks": 7} and board.wanted


def test_scrapes_in_a_burst_share_one_snapshot():
    board = Board(timeout_s=0.01, max_age_s=60)
    board.publish({"ticks": 1})
    assert [board.request().status for _ in range(3)] == [{"ticks": 1}] * 3
    assert not board.wanted              # none of them asked the loop for a new status


def test_before_the_first_tick_only_build_info():
    got = samples(exposition(Board(timeout_s=0)))
    assert list(got) == [("drl_build_info", (("version", "1.2.3"),))]


def test_a_quota_class_shows_its_allowance(tmp_path):
    with running_agent(tmp_path) as a:
        st = a.status()
    st["classes"][0]["quota_bytes_left"] = 1234
    board = Board(timeout_s=0)
    board.publish(st)
    assert samples(exposition(board))[("drl_class_quota_remaining_bytes", (("class", "default"),))] == 1234


def test_the_server_serves_metrics_and_a_busy_port_is_one_line(tmp_path):
    with running_agent(tmp_path) as a:
        a.board.publish(a.status())
    server = MetricsServer(("127.0.0.1", 0), a.board)
    try:
        host, port = server.address
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
        assert "drl_passed_bytes_total{class=\"default\"} 1.5e+06" in body
        assert "process_cpu_seconds_total" in body
        with pytest.raises(MetricsError, match=rf"^cannot serve metrics on 127.0.0.1:{port}: port already in use$"):
            MetricsServer(("127.0.0.1", port), Board(timeout_s=0))
    finally:
        server.close()


def test_agent_with_a_busy_metrics_port_exits_before_attaching(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg = config(tmp_path, "--global", "8mbit", "--metrics", "127.0.0.1:%d" % busy.getsockname()[1])
        dp = FakeDatapath()
        with pytest.raises(StartupError, match="port already in use"):
            Agent(cfg, transport=MemoryTransport, datapath=lambda cfg, port: dp, shaper=FakeShaper)
    assert not dp.attached and not (tmp_path / "ctl.sock").exists()


def test_metrics_address_from_the_flag_or_the_config_file(tmp_path):
    assert config(tmp_path, "--global", "8mbit", "--metrics", "[::1]:9470").metrics == ("::1", 9470)
    assert config(tmp_path, "--global", "8mbit").metrics is None
    with pytest.raises(ConfigError, match=r"^--metrics: bad port in '127.0.0.1:0' \(1-65535\)$"):
        config(tmp_path, "--global", "8mbit", "--metrics", "127.0.0.1:0")
    f = tmp_path / "drl.toml"
    f.write_text('[agent]\nmetrics = "10.0.0.1:9470"\n\n[[class]]\nname = "a"\nglobal = "1mbit"\n')
    assert toml.read(str(f)).agent["metrics"] == "10.0.0.1:9470"


def test_registry_state_only_with_a_registry(tmp_path):
    with running_agent(tmp_path) as a:
        a.board.publish(a.status())
        assert "drl_registry" not in exposition(a.board)                # no --registry: no series
        st = a.status()
        st["registry"] = {"state": "unreachable", "members": ["a", "b"], "classes": ["default"]}
        a.board.publish(st)
    text = exposition(a.board)
    promtool_check(text)
    got = samples(text)
    assert got[("drl_registry_up", ())] == 0 and got[("drl_registry_members", ())] == 2
