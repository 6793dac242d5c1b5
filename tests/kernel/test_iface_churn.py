"""The agent's interface deleted and made again under its name: the limit follows it.

An operator (or a container runtime, or an attacker with CAP_NET_ADMIN in the namespace)
deletes the veth the agent limits and creates one of the same name: a new ifindex, no
clsact, no filter.  The datapath looks the interface up by its name when it finds its
filter gone (agent/kernel/attach.py ensure_attached) and moves there: the lock, the
filters, shape mode's HTB; the program and its maps are the interface's no more than
they were before.  While no interface has the name, the status says so.
"""
from __future__ import annotations

import time

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent, drl_agent
from drl.lab.measure import sink_rate_bps, tc_show
from drl.lab.metrics import within
from drl.lab.netns import poll
from drl.lab.traffic import iperf3, iperf3_server, iperf3_start

pytestmark = pytest.mark.kernel

MBIT = 1e6 / 8
GONE = "interface eth0 is gone; waiting for it to come back"


def ifindex(host) -> int:
    return int(host.run("cat", "/sys/class/net/eth0/ifindex"))


def delete_link(lab, host) -> None:
    """Delete ``host``'s eth0 (its veth peer goes with it)."""
    lab.apply([["ip", "-n", host.ns, "link", "del", "eth0"]])


def rebuild_link(lab, host) -> None:
    """``host``'s veth made again as the Lab first built it: names, addresses, bridge port, routes."""
    plan = lab.plan
    v = next(v for v in plan.veths if v.a.host == host.name)
    cmds = [["ip", "link", "add", v.a.name, "netns", plan.ns(v.a.host),
             "type", "veth", "peer", "name", v.b.name, "netns", plan.ns(v.b.host)]]
    cmds += plan._end_commands(v.a) + plan._end_commands(v.b)      # the build's own, as for the first link
    if plan.rto_min:
        cmds += [cmd for end in (v.a, v.b) for cmd in plan._subnet_routes(end)]
    lab.apply(cmds)


def test_a_datapath_moves_to_the_new_interface_of_its_name(net, server):
    """Datapath level: gone -> failed with the real cause; back -> attached to the new index,
    its lock moved there, and the class's 10 Mbit/s holds again at once."""
    from drl.agent.kernel.datapath import Datapath
    from drl.agent.kernel.lock import InterfaceLock, LockError
    from drl.agent.model import Mode

    h1 = net.hosts[0]
    dp = Datapath("eth0", netns=h1.ns, exclusive=True)
    try:
        dp.attach()
        dp.set_class(0, Mode.BUCKET, rate_Bps=10 * MBIT, safe_rate_Bps=5 * MBIT, timeout_s=5.0)
        old = ifindex(h1)
        assert dp.attachment["ifindex"] == old and dp.attachment["recreated"] == 0
        delete_link(net, h1)
        assert not dp.ensure_attached()
        att = dp.attachment
        assert (att["state"], att["error"]) == ("failed", GONE), att
        rebuild_link(net, h1)
        new = ifindex(h1)
        assert new != old
        assert dp.ensure_attached()
        att = dp.attachment
        assert (att["state"], att["ifindex"], att["recreated"], att["error"]) == ("attached", new, 1, None), att
        assert not dp.ensure_attached()                  # and it stays there
        with pytest.raises(LockError):                   # the new index's lock is ours now...
            InterfaceLock.take("eth0", new, h1.ns)
        InterfaceLock.take("eth0", old, h1.ns).release()     # ...and the old one let go
        result = iperf3(h1, server, seconds=4, streams=4)
        assert within(result.received_bps, 10e6, 0.10), result
    finally:
        dp.close()
    assert "clsact" not in tc_show(h1, "qdisc") and tc_show(h1, "filter").strip() == ""


@pytest.mark.parametrize("enforce", ["police", "shape"])
def test_a_standalone_agent_limits_the_interface_made_again(net, tmp_path, enforce):
    """The whole agent: its status says the interface is gone while it is, and within a tick of
    its return the sink again gets the 10 Mbit/s limit (+10 %), shaped classes in HTB again."""
    h1, h2 = net.hosts
    log = tmp_path / "agent.log"
    proc = h1.popen(drl_agent(), "up", "--iface", "eth0", "--global", "10mbit", "--enforce", enforce,
                    "--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, str(tmp_path / "a.sock"), proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    with iperf3_server(h2) as srv:
        iperf3(h1, srv, seconds=2, streams=2)           # shape mode makes its HTB on the first tick with traffic
        old = ifindex(h1)
        delete_link(net, h1)
        st = agent.wait_for(lambda s: s["datapath"]["state"] == "failed", 2.0)
        assert (st["datapath"]["state"], st["datapath"]["error"]) == ("failed", GONE), st["datapath"]
        rebuild_link(net, h1)
        back = time.monotonic()
        client = iperf3_start(h1, srv, seconds=6, streams=4)
        st = agent.wait_for(lambda s: s["datapath"]["state"] == "attached", 1.0)
        followed = time.monotonic() - back
        time.sleep(max(0.0, 1.0 - (time.monotonic() - back)))
        rate = sink_rate_bps(h2, 4)                     # from 1 s after the interface's return
        client.wait()
    assert st["datapath"]["state"] == "attached" and followed < 1.0, (st["datapath"], followed)
    assert st["datapath"]["ifindex"] == ifindex(h1) != old and st["datapath"]["recreated"] == 1, st["datapath"]
    assert within(rate, 10e6, 0.10), rate
    assert "event=iface_recreated" in log.read_text() and f"old_ifindex={old}" in log.read_text()
    if enforce == "shape":
        assert "htb" in tc_show(h1, "qdisc")
    assert proc.poll() is None
    agent.kill(15)
    assert "clsact" not in tc_show(h1, "qdisc")


def test_a_cluster_keeps_the_global_limit_when_a_member_s_interface_is_made_again(net3, agents):
    """Two agents share 10 Mbit/s towards h3; h1's veth is deleted and made again while both
    send: the sink gets the global limit (+10 %) from a second after its return."""
    h1, h2, h3 = net3.hosts
    a1 = agents.start(h1, [h2], "fps", "10mbit", "--interval", "50ms", "--enforce", "police")
    a2 = agents.start(h2, [h1], "fps", "10mbit", "--interval", "50ms", "--enforce", "police")
    with iperf3_server(h3) as s1, iperf3_server(h3) as s2:
        c2 = iperf3_start(h2, s2, seconds=14, streams=4)
        time.sleep(2)
        old = ifindex(h1)
        delete_link(net3, h1)
        assert poll(lambda: a1.status()["datapath"]["error"] == GONE, 2.0)
        rebuild_link(net3, h1)
        back = time.monotonic()
        c1 = iperf3_start(h1, s1, seconds=8, streams=4)
        st = a1.wait_for(lambda s: s["datapath"]["state"] == "attached", 1.0)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - back)))
        rate = sink_rate_bps(h3, 5)
        c1.stop(), c2.stop()            # both sent through the measurement
    assert st["datapath"]["ifindex"] == ifindex(h1) != old and st["datapath"]["recreated"] == 1, st["datapath"]
    assert rate <= 10e6 * 1.10 and rate >= 10e6 * 0.8, rate
    assert a1.exit_note() is None and a2.exit_note() is None


def test_an_interface_made_again_gets_our_filter_from_its_link_event_not_the_tick(net, tmp_path):
    """With a 10 s interval the tick cannot explain it: the filter is on the new eth0 within
    0.5 s of `ip link add`, before the interface is up or has an address, so whoever makes it
    again cannot add routes that send through it unpoliced first (drl-lab run chaos's recreate
    measured 1.68 x the limit in a 1-s window when the tick alone, every 50 ms, found it)."""
    h1, h2 = net.hosts
    log = tmp_path / "agent.log"
    proc = h1.popen(drl_agent(), "up", "--iface", "eth0", "--global", "10mbit", "--enforce", "police",
                    "--interval", "10s", "--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, str(tmp_path / "a.sock"), proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    assert "drl_egress" in tc_show(h1, "filter")
    old = ifindex(h1)
    delete_link(net, h1)
    v = next(v for v in net.plan.veths if v.a.host == h1.name)
    made = time.monotonic()
    net.apply([["ip", "link", "add", v.a.name, "netns", net.plan.ns(v.a.host),
                "type", "veth", "peer", "name", v.b.name, "netns", net.plan.ns(v.b.host)]])
    assert poll(lambda: "drl_egress" in tc_show(h1, "filter"), 0.5), (time.monotonic() - made, log.read_text())
    took = time.monotonic() - made
    assert ifindex(h1) != old and "state DOWN" in h1.run("ip", "link", "show", "eth0"), took
    net.apply(net.plan._end_commands(v.a) + net.plan._end_commands(v.b))
    assert f"event=iface_recreated iface=eth0 old_ifindex={old}" in log.read_text()
    assert proc.poll() is None
    agent.kill(15)
