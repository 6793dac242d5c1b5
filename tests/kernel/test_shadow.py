"""Shadow mode in a real agent: a limit that counts what it would drop and drops nothing,
then, reloaded with ``shadow = false``, the same limit enforced.

Topology (lab/topology.py's pair): one agent alone on h1 limits its eth0 egress
towards h2.  The class's bytes are its counters (L2 bytes, what the limit
counts); the traffic on the wire is what h2's eth0 receives.  A second test
drives the datapath alone with open-loop UDP, which does not back off, to
compare what shadow mode refuses with what enforcement drops.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent, drl_agent
from drl.agent.model import Mode
from drl.lab.measure import rx_bytes
from drl.lab.metrics import within
from drl.lab.traffic import iperf3_server, iperf3_start, udp_blast

pytestmark = pytest.mark.kernel

LIMIT_BPS = 10e6
OFFERED_BPS = 40e6      # TCP paced at 4x the limit: 2 streams x 20 Mbit/s
CONFIG = '[agent]\niface = "eth0"\nnode_id = "h1"\n\n[[class]]\nname = "trial"\nglobal = "10mbit"\nshadow = {}\n'


def window(agent: Agent, sink, seconds: float) -> dict:
    """Over ``seconds``: bits/s on the wire at the sink, and the class's counted bytes."""
    def read():
        c = agent.status()["classes"][0]
        return time.monotonic(), rx_bytes(sink), c["passed_bytes"], c["dropped_bytes"]
    t0, rx0, p0, d0 = read()
    time.sleep(seconds)
    t1, rx1, p1, d1 = read()
    dt = t1 - t0
    return {"wire_bps": (rx1 - rx0) * 8 / dt, "arrived_bps": (p1 - p0 + d1 - d0) * 8 / dt,
            "dropped_bytes": d1 - d0, "seconds": dt}


def retransmitted(host) -> int:
    """TCP segments host has retransmitted since its namespace was made."""
    out = host.run("nstat", "-az", "TcpRetransSegs")
    return int(next(line.split()[1] for line in out.splitlines() if line.startswith("TcpRetransSegs")))


def test_shadow_counts_would_be_drops_and_drops_nothing_until_reloaded_off(net, tmp_path):
    h1, h2 = net.hosts
    conf, sock, log = tmp_path / "drl.toml", str(tmp_path / "a.sock"), tmp_path / "agent.log"
    conf.write_text(CONFIG.format("true"))
    proc = h1.popen(drl_agent(), "up", "--config", str(conf), "--socket", sock, "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, sock, proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    assert agent.status()["classes"][0]["shadow"] is True
    with iperf3_server(h2) as srv:
        client = iperf3_start(h1, srv, seconds=26, streams=2, bitrate_bps=OFFERED_BPS / 2)
        time.sleep(3)
        retrans = retransmitted(h1)
        shadow = window(agent, h2, 8)
        retrans = retransmitted(h1) - retrans
        st = agent.status()["classes"][0]

        conf.write_text(CONFIG.format("false"))
        reload = subprocess.run([drl_agent(), "reload", "--socket", sock], capture_output=True, text=True)
        assert reload.returncode == 0 and "changed trial" in reload.stdout, reload.stdout + reload.stderr
        time.sleep(3)
        enforced = window(agent, h2, 8)
        after = agent.status()["classes"][0]
        client.stop()                   # it ran through both windows
    agent.kill(15)

    # in shadow everything passes at the offered rate, and the kernel counted what it would have dropped
    assert shadow["wire_bps"] >= 3 * LIMIT_BPS, shadow
    assert shadow["wire_bps"] >= 0.9 * shadow["arrived_bps"], shadow      # counted arrivals all reached h2
    assert retrans == 0, retrans                                          # no loss: TCP never retransmitted
    over = (shadow["arrived_bps"] - LIMIT_BPS) / 8 * shadow["seconds"]
    assert shadow["dropped_bytes"] >= 0.5 * over, (shadow, over)
    assert st["mode"] == "bucket" and st["local_limit_bps"] == LIMIT_BPS, st
    # reloaded with shadow = false, the same class is held to its limit
    assert after["shadow"] is False
    assert within(enforced["wire_bps"], LIMIT_BPS, 0.10), enforced


def test_would_be_drops_are_what_enforcement_drops_of_open_loop_traffic(net, datapath):
    """UDP at 3x a bucket's rate, shadow then enforced on the same bucket: would-be drops take
    no tokens, so the limit passes the same share and refuses the same share either way."""
    h1, h2 = net.hosts
    dp = datapath()
    blast = udp_blast(h1, h2.addr4, 3 * LIMIT_BPS, 11)
    shares = {}
    for shadow in (True, False):
        dp.set_class(0, Mode.BUCKET, rate_Bps=LIMIT_BPS / 8, shadow=shadow)
        time.sleep(1)                  # past the bucket's depth (300 ms at the rate)
        c0, rx0, t0 = dp.read_counters()[0], rx_bytes(h2), time.monotonic()
        time.sleep(4)
        c1, rx1, dt = dp.read_counters()[0], rx_bytes(h2), time.monotonic() - t0
        arrived = c1.passed_bytes + c1.dropped_bytes - c0.passed_bytes - c0.dropped_bytes
        shares[shadow] = {"passed_bps": (c1.passed_bytes - c0.passed_bytes) * 8 / dt,
                          "refused": (c1.dropped_bytes - c0.dropped_bytes) / arrived,
                          "wire_bps": (rx1 - rx0) * 8 / dt}
    blast.wait()
    shadow, enforced = shares[True], shares[False]
    assert within(shadow["passed_bps"], LIMIT_BPS, 0.05) and within(enforced["passed_bps"], LIMIT_BPS, 0.05), shares
    assert abs(shadow["refused"] - enforced["refused"]) <= 0.03 and shadow["refused"] >= 0.6, shares
    assert shadow["wire_bps"] >= 2.7 * LIMIT_BPS and within(enforced["wire_bps"], LIMIT_BPS, 0.10), shares


def test_a_silent_agent_leaves_a_shadow_class_in_shadow(net, datapath):
    """After the agent's timeout the fail-safe rate is counted, not enforced: a crash never
    starts enforcing a limit that was only being tried (docs/config.md)."""
    h1, h2 = net.hosts
    dp = datapath()
    dp.set_class(0, Mode.BUCKET, rate_Bps=LIMIT_BPS / 8, safe_rate_Bps=LIMIT_BPS / 16, timeout_s=0.5, shadow=True)
    blast = udp_blast(h1, h2.addr4, 3 * LIMIT_BPS, 5)
    time.sleep(1.5)                    # the agent has been silent 1.5 s: the fail-safe is in force
    c0, rx0, t0 = dp.read_counters()[0], rx_bytes(h2), time.monotonic()
    time.sleep(3)
    c1, rx1, dt = dp.read_counters()[0], rx_bytes(h2), time.monotonic() - t0
    blast.wait()
    passed_bps = (c1.passed_bytes - c0.passed_bytes) * 8 / dt
    assert within(passed_bps, LIMIT_BPS / 2, 0.10), passed_bps          # the safe rate, counted
    assert (rx1 - rx0) * 8 / dt >= 2.7 * LIMIT_BPS                      # and nothing dropped
