"""A class whose spec matches nothing while the interface carries traffic gets a hint
(agent/service/unmatched.py): in its status, in drlctl status, and logged once."""
from __future__ import annotations

import logging

from drl.agent import logs
from drl.agent.service.unmatched import MIN_OTHER_BYTES, WINDOW_S, gossip_wire_bytes
from drl.cli.ctl import render

from daemon_harness import FakeDatapath, agent, config

EVENT = "class_matches_nothing"


def hinted(caplog) -> list[dict]:
    return [r.msg.fields for r in caplog.records if isinstance(r.msg, logs.Event) and r.msg.name == EVENT]


def run_quiet(a, dp, t0, seconds, other_per_s):
    """One tick a second for ``seconds``, the interface carrying ``other_per_s`` bytes a second
    outside every class; returns the time of the last tick."""
    for k in range(seconds + 1):
        if k:
            dp.bypass_send(other_per_s)
        a.tick(t0 + k)
    return t0 + seconds


def test_a_server_port_written_as_dport_gets_a_sport_hint_once_until_it_matches(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="drl.agent")
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit", "--class", "dport=8080,proto=tcp", "--peers", ""), dp) as a:
        t = run_quiet(a, dp, 1000.0, int(WINDOW_S) - 1, 100_000)
        assert a.status()["classes"][0]["hint"] is None and not hinted(caplog)     # not yet WINDOW_S
        dp.bypass_send(100_000)
        a.tick(t + 1)
        hint = a.status()["classes"][0]["hint"]
        assert "sport=8080" in hint and "30 s" in hint, hint
        assert f"hint        default: {hint}" in render(a.status()).splitlines()
        for k in range(2, 12):        # still nothing matched: the status keeps it, the log said it once
            dp.bypass_send(100_000)
            a.tick(t + k)
        assert a.status()["classes"][0]["hint"] == hint
        [line] = hinted(caplog)
        assert (line["class"], line["seconds"], line["match"], line["hint"]) == (
            "default", 30, ["proto=6,dport=8080"], hint)
        assert line["other_bytes"] >= WINDOW_S * 100_000
        dp.send(1500)                 # it matches again: the hint goes
        a.tick(t + 12)
        assert a.status()["classes"][0]["hint"] is None
        assert "hint " not in render(a.status())


def test_a_sport_spec_is_told_about_dport(tmp_path, caplog):
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit", "--class", "sport=5201,proto=tcp", "--peers", ""), dp) as a:
        run_quiet(a, dp, 1000.0, int(WINDOW_S), 100_000)
        assert "write dport=5201" in a.status()["classes"][0]["hint"]


def test_no_hint_on_a_quiet_interface_or_for_a_class_without_a_spec(tmp_path):
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit", "--class", "dport=8080", "--peers", ""), dp) as a:
        run_quiet(a, dp, 1000.0, 3 * int(WINDOW_S), (MIN_OTHER_BYTES - 1) // (WINDOW_S + 1))
        assert a.status()["classes"][0]["hint"] is None
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit", "--peers", ""), dp) as a:     # every IP packet
        run_quiet(a, dp, 1000.0, 2 * int(WINDOW_S), 100_000)
        assert a.status()["classes"][0]["hint"] is None


def test_the_agents_own_gossip_is_not_traffic(tmp_path):
    """The bypass counter holds our gossip; on an otherwise idle host that is no reason to hint."""
    dp = FakeDatapath()
    cfg = config(tmp_path, "--global", "10mbit", "--class", "dport=8080", "--peers",
                 ",".join(f"p{i}@10.0.1.{i}:7470" for i in range(1, 40)), "--peer-timeout", "1h",
                 "--branching", "40")
    with agent(cfg, dp) as a:
        for k in range(3 * int(WINDOW_S)):
            a.tick(1000.0 + k)
            own = gossip_wire_bytes(a.transport.stats)
            dp.bypass_send(own - dp.bypass.passed_bytes)      # what the program counted of it
        assert own > 3 * MIN_OTHER_BYTES        # enough to hint, were it counted
        assert a.status()["classes"][0]["hint"] is None
        for k in range(3 * int(WINDOW_S), 4 * int(WINDOW_S) + 1):     # the same with real traffic beside it
            a.tick(1000.0 + k)
            dp.bypass_send(gossip_wire_bytes(a.transport.stats) - dp.bypass.passed_bytes + 100_000)
        assert "sport=8080" in a.status()["classes"][0]["hint"]
