"""Many classes in real agents: a config file, a live `drlctl set`, a reload, and a lone agent.

Topology (lab/topology.py's star): agents on h1..h3 limit their eth0 egress
towards the sink h4.  Class A is TCP to ports 5201-5203 on the sink, class B
TCP to ports 5204-5206; every agent sends one flow of each class.  A class's
aggregate is the sum of what its counters passed on the three agents (L2
bytes, what the limit counts).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent, drl_agent, installed
from drl.lab.measure import sink_rate_bps, tc_show, tcp_rate_at_sink
from drl.lab.metrics import within
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

A_PORTS, B_PORTS = (5201, 5202, 5203), (5204, 5205, 5206)
# a class's rate from its counters (exact bytes) over this long: a shorter mean moves more, not less
MEASURE_S = 6


def config(classes: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    text = '[agent]\nallocator = "fps"\ninterval = "100ms"\n'
    for name, (rate, ports) in classes.items():
        match = ", ".join(f'"dport={p},proto=tcp"' for p in ports)
        text += f'\n[[class]]\nname = "{name}"\nglobal = "{rate}"\nmatch = [{match}]\n'
    return text


def by_class(status: dict) -> dict[str, dict]:
    return {c["name"]: c for c in status["classes"]}


def passed(agents, name: str) -> int:
    return sum(by_class(a.status()).get(name, {}).get("passed_bytes", 0) for a in agents)


def class_rates_bps(agents, names, seconds: float) -> dict[str, float]:
    """Each class's aggregate over the agents, from their counters, over ``seconds``."""
    before = {n: passed(agents, n) for n in names}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {n: passed(agents, n) for n in names}
    return {n: (after[n] - before[n]) * 8 / (time.monotonic() - t0) for n in names}


@pytest.mark.slow
def test_two_classes_hold_their_limits_follow_a_live_set_and_survive_a_reload(net4, cluster, tmp_path):
    h1, h2, h3, sink = net4.hosts
    senders = (h1, h2, h3)
    conf = tmp_path / "drl.toml"
    conf.write_text(config({"A": ("8mbit", A_PORTS), "B": ("4mbit", B_PORTS)}))
    agents = cluster(net4).start_mesh(senders, None, None, "--config", str(conf))
    servers = [iperf3_server(sink, port) for port in A_PORTS + B_PORTS]
    try:
        # A's senders ask 5 Mbit/s each (15 for an 8 Mbit/s class), so that A unlimited
        # after the reload is measurable without loading the machine; B's are greedy.  Long enough
        # for any machine: stopped after the last measurement
        clients = [iperf3_start(h, servers[i], seconds=90, bitrate_bps=5e6) for i, h in enumerate(senders)]
        clients += [iperf3_start(h, servers[3 + i], seconds=90) for i, h in enumerate(senders)]
        time.sleep(5)
        rates = class_rates_bps(agents, "AB", MEASURE_S)
        assert within(rates["A"], 8e6, 0.10) and within(rates["B"], 4e6, 0.10), rates

        ctl = subprocess.run([installed("drlctl"), "--socket", agents[0].socket,
                              "set", "B", "--global", "8mbit"], capture_output=True, text=True)
        assert ctl.returncode == 0, ctl.stderr
        t_set = time.monotonic()
        versions = set()
        for a in agents:
            st = a.wait_for(lambda s: by_class(s)["B"]["global_limit_bps"] == 8e6, 2.0)
            assert by_class(st)["B"]["global_limit_bps"] == 8e6, a.host
            versions.add(by_class(st)["B"]["limit_version"])
        # a set's version is when it was set, in ms since the epoch (agent/cluster/limits.py)
        assert len(versions) == 1 and versions.pop() >= (time.time() - 60) * 1000, versions
        assert time.monotonic() - t_set <= 2.5      # the last status read may wait for a tick
        time.sleep(3)
        rates = class_rates_bps(agents, "B", MEASURE_S)
        assert within(rates["B"], 8e6, 0.10), rates

        conf.write_text(config({"B": ("4mbit", B_PORTS)}))        # A removed; B's file value unchanged
        for a in agents[:2]:
            reload = subprocess.run([drl_agent(), "reload", "--socket", a.socket], capture_output=True, text=True)
            assert reload.returncode == 0 and "removed A" in reload.stdout, reload.stdout + reload.stderr
        os.kill(agents[2].proc.pid, signal.SIGHUP)                 # what systemd's ExecReload sends
        st = agents[2].wait_for(lambda s: "A" not in by_class(s), 2.0)
        assert "A" not in by_class(st) and "event=reloaded" in agents[2].log.read_text()
        rates = class_rates_bps(agents, "B", MEASURE_S)
        a_unlimited = sum(by_class(a.status()).get("A") is None for a in agents)
        sink_bps = sink_rate_bps(sink, 5)
        # B keeps the live 8 Mbit/s (its file value did not change); A's 15 Mbit/s pass unpoliced
        assert within(rates["B"], 8e6, 0.10), rates
        assert a_unlimited == 3 and sink_bps >= 8e6 + 13e6, sink_bps
        for c in clients:
            c.stop()
    finally:
        for s in servers:
            s.__exit__()


def test_the_design_cards_command_limits_alone_without_a_key(net, tmp_path):
    h1, h2 = net.hosts
    log = tmp_path / "agent.log"
    proc = h1.popen(drl_agent(), "up", "--iface", "eth0", "--global", "10mbit",
                    "--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, str(tmp_path / "a.sock"), proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    st = agent.status()
    assert st["standalone"] and st["listen"] is None and st["peers"] == [] and not st["authenticated"]
    assert "event=standalone" in log.read_text()
    rate = tcp_rate_at_sink(h1, h2, seconds=12, streams=4, settle_s=4, measure_s=6)
    assert within(rate, 10e6, 0.05), rate
    agent.kill(15)
    assert "clsact" not in tc_show(h1, "qdisc")
