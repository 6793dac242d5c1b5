"""Nothing but the agent's own gossip skips the limiter, one agent
per interface, and a filter removed behind the agent's back is put back within a tick.

Datapath tests run the real bpf/limiter.c on a veth pair (h1 -> h2, conftest's ``net``);
agent tests run real ``drl-agent up`` processes on lab/topology.py's star (h1, h2 limit
their eth0, h3 is the sink, whose eth0 counts L2 bytes as the limiter does).
"""
from __future__ import annotations

import statistics
import subprocess
import time

import pytest

from drl.agent import abi
from drl.agent.classes.spec import parse_class
from drl.agent.kernel import unseen
from drl.agent.kernel.attach import FILTER_PRIO
from drl.agent.model import Mode
from drl.lab.agents import GOSSIP_PORT as PORT, drl_agent, installed, up_argv
from drl.lab.measure import sink_rate_bps, tc_show
from drl.lab.metrics import within

pytestmark = pytest.mark.kernel

MBIT = 1e6 / 8

# Sends `count` datagrams (or, with a rate, an open-loop stream for `seconds`) from
# (bind_addr, bind_port) with SO_MARK `mark` (0: none) to (dst, dport).
_SEND = """
import socket, sys, time
dst, dport, baddr, bport, mark, count, rate, seconds = sys.argv[1:9]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if int(mark, 0):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(mark, 0).to_bytes(4, sys.byteorder))
s.bind((baddr, int(bport)))
payload = bytes(1200)
if float(rate) == 0:
    for _ in range(int(count)):
        s.sendto(payload, (dst, int(dport)))
    sys.exit(0)
start, sent = time.monotonic(), 0
while (now := time.monotonic()) - start < float(seconds):
    if sent * 8 * (len(payload) + 42) < float(rate) * (now - start):
        s.sendto(payload, (dst, int(dport)))
        sent += 1
    else:
        time.sleep(0.0005)
"""


def send(host, dst: str, dport: int, *, bind: tuple[str, int] = ("0.0.0.0", 0), mark: int = 0,
         count: int = 20) -> None:
    host.run("python3", "-c", _SEND, dst, str(dport), bind[0], str(bind[1]), hex(mark), str(count), "0", "0")


def blast(host, dst: str, dport: int, rate_bps: float, seconds: float, *, bind: tuple[str, int] = ("0.0.0.0", 0),
          mark: int = 0) -> subprocess.Popen:
    """Open-loop UDP at rate_bps of L2 bytes (1200-byte payloads); .wait() it."""
    return host.popen("python3", "-c", _SEND, dst, str(dport), bind[0], str(bind[1]), hex(mark), "0",
                      str(rate_bps), str(seconds))


# -- the datapath -----------------------------------------------------------------------------

def test_only_marked_udp_from_the_gossip_port_skips_the_limiter(net, datapath):
    """Random drop at 1.0 on all UDP: what is exempt passes, everything else is dropped."""
    h1, h2 = net.hosts
    h1.run("ip", "addr", "add", "10.0.0.101/24", "dev", "eth0")      # another local address for port 7470
    dp = datapath(classes=[parse_class("proto=udp")], gossip_port=PORT)
    dp.set_class(0, Mode.DROP, drop_probability=1.0)
    cases = {  # name: (dport, bind, mark, exempt?)
        "gossip": (PORT, (h1.addr4, PORT), abi.GOSSIP_MARK, True),
        "unmarked from the port": (PORT, ("10.0.0.101", PORT), 0, False),
        "unmarked to the port": (PORT, (h1.addr4, 0), 0, False),
        "marked to the port": (PORT, (h1.addr4, 0), abi.GOSSIP_MARK, False),
        "marked from another port": (9, (h1.addr4, PORT + 1), abi.GOSSIP_MARK, False),
        "another mark from the port": (PORT, ("10.0.0.101", PORT), abi.GOSSIP_MARK + 1, False),
    }
    for name, (dport, bind, mark, exempt) in cases.items():
        before, bypass = dp.read_counters()[0], dp.read_bypass()
        send(h1, h2.addr4, dport, bind=bind, mark=mark, count=20)
        after, bypassed = dp.read_counters()[0], dp.read_bypass().passed_packets - bypass.passed_packets
        dropped = after.dropped_packets - before.dropped_packets
        if exempt:
            assert dropped == 0 and bypassed >= 20, (name, after, bypassed)
        else:
            assert dropped == 20 and after.passed_packets == before.passed_packets, (name, after)


def test_a_datapath_without_a_gossip_port_exempts_nothing(net, datapath):
    h1, h2 = net.hosts
    dp = datapath(classes=[parse_class("proto=udp")])
    dp.set_class(0, Mode.DROP, drop_probability=1.0)
    send(h1, h2.addr4, PORT, bind=(h1.addr4, PORT), mark=abi.GOSSIP_MARK, count=20)
    assert dp.read_counters()[0].dropped_packets == 20


def test_ensure_attached_is_cheap_and_puts_back_a_removed_filter(net, datapath):
    h1 = net.hosts[0]
    dp = datapath()
    prog_id = tc_show(h1, "filter").split(" id ")[1].split()[0]
    costs = []
    for _ in range(200):
        t = time.perf_counter()
        assert dp.ensure_attached() is False
        costs.append(time.perf_counter() - t)
    assert statistics.median(costs) < 0.5e-3, costs          # measured ~15 us: one raw netlink dump
    h1.run("tc", "filter", "del", "dev", "eth0", "egress")
    assert dp.ensure_attached() is True
    assert f" id {prog_id} " in tc_show(h1, "filter") and dp.attachment["reattached"] == 1
    h1.run("tc", "qdisc", "del", "dev", "eth0", "clsact")
    assert dp.ensure_attached() is True and "clsact" in tc_show(h1, "qdisc")
    assert dp.attachment == {"state": "attached", "reattached": 2, "error": None, "ifindex": ifindex(h1), "recreated": 0,
                             "ahead": [], "pref": FILTER_PRIO, "reasserted": 0, "unseen_bps": 0,
                             "unseen": False}
    assert dp.ensure_attached() is False


def test_another_program_at_our_place_counts_as_detached(net, datapath):
    """A second (pre-lock) agent's filter replaces ours at the same prio/handle: ours goes back."""
    h1 = net.hosts[0]
    first = datapath()
    second = datapath()                     # replace-filter: its program is the one attached now
    assert first.ensure_attached() is True
    assert f" id {_prog_id(first)} " in tc_show(h1, "filter")
    second._attached = False                # (so that its close leaves ours alone)


def test_a_failed_reattach_is_reported_and_retried(net, datapath):
    h1 = net.hosts[0]
    dp = datapath()
    h1.run("ip", "link", "del", "eth0")                       # nothing left to attach to
    assert dp.ensure_attached() is False
    st = dp.attachment
    # the real cause, not the kernel-lacks-clsact hint (tests/kernel/test_iface_churn.py: it comes back)
    assert st["state"] == "failed" and st["error"] == "interface eth0 is gone; waiting for it to come back", st
    assert dp.ensure_attached() is False and dp.attachment["state"] == "failed"


def test_ours_moves_ahead_of_a_foreign_filter_and_never_removes_it(net, datapath):
    """u32 at pref 5: ours to 4.  A cls_bpf at pref 1 (added after ours): ours joins pref 1,
    added after it, so that it runs first.  u32 at pref 1: nothing can run before it; it is
    reported and stays.  Every foreign filter is still there at the end."""
    h1 = net.hosts[0]
    dp = datapath()
    tc = lambda *a: h1.run("tc", "filter", "add", "dev", "eth0", "egress", *a)     # noqa: E731
    tc("prio", "5", "protocol", "all", "u32", "match", "u32", "0", "0", "classid", "1:1")
    costs = []
    t = time.perf_counter()
    assert dp.ensure_attached() is False
    moved_s = time.perf_counter() - t
    assert dp.attachment["pref"] == 4 and dp.attachment["ahead"] == [] and dp.attachment["reasserted"] == 1
    for _ in range(200):          # the dump with the foreign filter behind ours, and the once-a-second compare
        if len(costs) % 2:
            dp._unseen._last = None    # due again: this call also reads tx bytes and the counters
        t = time.perf_counter()
        dp.ensure_attached()
        costs.append(time.perf_counter() - t)
    tc("prio", "1", "handle", "7", "protocol", "all", "bpf", "bytecode", "1,6 0 0 4294967295,")
    assert dp.ensure_attached() is False and dp.attachment["pref"] == 1 and dp.attachment["ahead"] == []
    shown = tc_show(h1, "filter")
    assert shown.index("drl_egress") < shown.index("handle 0x7 "), shown      # dump order is run order
    dp.close(detach=False)        # killed: a restart replaces its filter where it is, and keeps the place
    dp = datapath()
    shown = tc_show(h1, "filter")
    assert dp.attachment["pref"] == 1 and shown.count("handle 0xd1 ") == 1, shown
    assert shown.index("drl_egress") < shown.index("handle 0x7 ") and dp.ensure_attached() is False, shown
    h1.run("tc", "filter", "del", "dev", "eth0", "egress", "prio", "1", "handle", "7", "bpf")
    h1.run("tc", "filter", "del", "dev", "eth0", "egress", "prio", "5")
    dp.detach()
    tc("prio", "1", "protocol", "all", "u32", "match", "u32", "0", "0", "classid", "1:1")
    dp.attach()
    assert dp.ensure_attached() is False
    assert dp.attachment["pref"] == FILTER_PRIO and dp.attachment["ahead"] == [1], dp.attachment
    assert "u32" in tc_show(h1, "filter")
    steady, sampled = statistics.median(costs[0::2]), statistics.median(costs[1::2])
    print(f"reassert {moved_s * 1e3:.2f} ms; ensure_attached {steady * 1e6:.0f} us, "
          f"with the unseen compare {sampled * 1e6:.0f} us")
    assert steady < 0.5e-3 and sampled < 2e-3, (steady, sampled)


def attached(datapath: dict) -> dict:
    """An agent's datapath status without unseen_bps, checked to be under the warning's floor
    (the moment a removed filter is missing, and a few stray packets, count)."""
    rest = dict(datapath)
    assert rest.pop("unseen_bps") < unseen.FLOOR_Bps * 8 and rest.pop("unseen") is False, datapath
    return rest


def ifindex(host) -> int:
    return int(host.run("cat", "/sys/class/net/eth0/ifindex"))


def _prog_id(dp) -> int:
    from drl.agent.kernel.datapath import _prog_id
    return _prog_id(dp.prog_fd)


def test_a_second_exclusive_datapath_on_the_interface_is_refused(net, datapath):
    from drl.agent.kernel.datapath import Datapath, DatapathError
    h1, h2 = net.hosts
    first = datapath(exclusive=True)
    with pytest.raises(DatapathError, match="already runs on eth0.*one agent per interface"):
        Datapath("eth0", netns=h1.ns, exclusive=True)
    other = Datapath("eth0", netns=h2.ns, exclusive=True)     # another namespace's eth0 is another interface
    other.close()
    first.close()
    again = Datapath("eth0", netns=h1.ns, exclusive=True)     # released on close
    again.close()


# -- real agents ------------------------------------------------------------------------------

def test_udp_on_the_gossip_port_is_policed_while_gossip_flows(net3, agents):
    """20 Mbit/s of UDP to port 7470 went out unpoliced.  Now 10 Mbit/s to the
    port and 10 Mbit/s from it (another address, unmarked) through h1's 10 Mbit/s share
    are cut to it, and the agents' own gossip crosses the same limiter untouched."""
    h1, h2, h3 = net3.hosts
    h1.run("ip", "addr", "add", "10.0.0.101/24", "dev", "eth0")
    # policed, so that what exceeds is dropped and counted (shaped, it would be queued)
    a1 = agents.start(h1, [h2], "static", "20mbit", "--interval", "50ms", "--enforce", "police")
    a2 = agents.start(h2, [h1], "static", "20mbit", "--interval", "50ms", "--enforce", "police")
    assert a1.wait_for(lambda s: s["peers"][0]["state"] == "alive", 5)["peers"][0]["state"] == "alive"
    before = [a1.status(), a2.status()]
    senders = [blast(h1, h3.addr4, PORT, 10e6, 6),
               blast(h1, h3.addr4, 9, 10e6, 6, bind=("10.0.0.101", PORT))]
    time.sleep(1.5)                                           # past the initial full bucket
    rate = sink_rate_bps(h3, 4)
    for s in senders:
        s.wait()
    # alive: a peer silent for 0.15 s (3 intervals; a busy machine's stall) is stale for a moment
    after = [a.wait_for(lambda s: s["peers"][0]["state"] == "alive", 2) for a in (a1, a2)]
    assert within(rate, 10e6, 0.10), rate
    assert after[0]["local_limit_bps"] == 10e6 and after[0]["dropped_packets"] > 1000, after[0]
    for b, a in zip(before, after):
        assert a["peers"][0]["state"] == "alive" and a["peers"][0]["lost"] == b["peers"][0]["lost"] == 0, a["peers"]
        assert a["gossip"]["received"] > b["gossip"]["received"] + 50, a["gossip"]   # 4 s at 50 ms


def test_a_second_agent_on_the_interface_is_refused_and_the_first_keeps_limiting(net3, agents, tmp_path):
    h1, h2, h3 = net3.hosts
    a1 = agents.start(h1, [], "static", "10mbit")
    filters = tc_show(h1, "filter")
    argv = up_argv(drl_agent(), iface="eth0", global_="10mbit", allocator="static", node_id="h1b",
                   socket=str(tmp_path / "second.sock"), listen=f"{h1.addr4}:{PORT + 1}",
                   peers=[f"h2@{h2.addr4}:{PORT}"], key_file=agents.key_file,
                   options=["--state-dir", str(tmp_path)])
    t = time.monotonic()
    out = subprocess.run(h1.argv(*argv), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "already runs on eth0" in lines[0] and f"pid {a1.proc.pid}" in lines[0], out.stderr
    assert time.monotonic() - t < 10                          # refused before the BPF compile
    assert tc_show(h1, "filter") == filters                   # the very same program, untouched
    st = a1.status()
    assert attached(st["datapath"]) == {"state": "attached", "reattached": 0, "error": None, "ifindex": ifindex(h1),
                                        "recreated": 0, "ahead": [], "pref": FILTER_PRIO, "reasserted": 0}, st["datapath"]
    sender = blast(h1, h3.addr4, 9, 20e6, 5)
    time.sleep(1.5)
    rate = sink_rate_bps(h3, 3)
    sender.wait()
    assert within(rate, 10e6, 0.10), rate


def test_a_filter_removed_behind_the_agents_back_is_back_within_a_tick(net3, agents):
    h1, _, h3 = net3.hosts
    a1 = agents.start(h1, [], "static", "10mbit", "--interval", "100ms")
    for what in (["filter", "del", "dev", "eth0", "egress"], ["qdisc", "del", "dev", "eth0", "clsact"]):
        done = a1.status()["datapath"]["reattached"]
        h1.run("tc", *what)
        removed = time.monotonic()
        st = a1.wait_for(lambda s: s["datapath"]["reattached"] > done, 3)
        # one interval until the next tick, plus the status poll (0.2 s) and a request, with room
        # for a busy machine's stall; never re-attached would time out at 3 s
        assert attached(st["datapath"]) == {"state": "attached", "reattached": done + 1, "error": None,
                                            "ifindex": ifindex(h1), "recreated": 0, "ahead": [], "pref": FILTER_PRIO,
                                            "reasserted": 0}, st["datapath"]
        assert time.monotonic() - removed < 1.0, time.monotonic() - removed
        assert "drl_egress" in tc_show(h1, "filter")
    sender = blast(h1, h3.addr4, 9, 20e6, 5)
    time.sleep(1.5)
    rate = sink_rate_bps(h3, 3)
    sender.wait()
    assert within(rate, 10e6, 0.10), rate
    assert a1.log.read_text().count("event=reattached") == 2


def test_a_foreign_filter_ahead_of_ours_is_reported_within_a_tick_and_its_removal_too(net3, agents):
    """A u32 filter at pref 1 that classifies everything (what CNI plugins and other tools add)
    takes the traffic before drl's program sees it.  With --filter-ahead warn (and at pref 1
    with a u32 nothing can run first anyway) the agent says so instead of passing it silently:
    the filter (status ahead, log, metric), and the bytes the interface sent that the program
    never counted (status unseen_bps, unseen, the log's unseen_traffic)."""
    h1, _, h3 = net3.hosts
    a1 = agents.start(h1, [], "static", "10mbit", "--interval", "100ms", "--filter-ahead", "warn")
    assert a1.status()["datapath"]["ahead"] == []
    h1.run("tc", "filter", "add", "dev", "eth0", "egress", "prio", "1", "protocol", "all",
           "u32", "match", "u32", "0", "0", "classid", "1:1")
    added = time.monotonic()
    st = a1.wait_for(lambda s: s["datapath"]["ahead"] == [1], 3)
    assert time.monotonic() - added < 1.0, time.monotonic() - added
    assert st["datapath"]["state"] == "attached"
    sender = blast(h1, h3.addr4, 9, 20e6, 4)     # what the warning is about: the limit does not hold
    time.sleep(1.0)
    bypass = sink_rate_bps(h3, 1.5)
    st = a1.wait_for(lambda s: s["datapath"]["unseen"], 3)
    sender.wait()
    text = subprocess.run([installed("drlctl"), "--socket", a1.socket, "status"], capture_output=True,
                          text=True, check=True).stdout
    assert "warning     tc filters at pref 1 run before drl's" in text, text
    assert "that drl's program never counted" in text, text
    unseen_bps = st["datapath"]["unseen_bps"]
    h1.run("tc", "filter", "del", "dev", "eth0", "egress", "prio", "1")
    a1.wait_for(lambda s: s["datapath"]["ahead"] == [], 3)
    sender = blast(h1, h3.addr4, 9, 20e6, 4)
    time.sleep(1.5)
    held = sink_rate_bps(h3, 2)
    st = a1.status()
    sender.wait()
    log = a1.log.read_text()
    assert log.count("event=filter_ahead ") == 1 and log.count("event=filter_ahead_gone") == 1, log[-2000:]
    assert log.count("event=unseen_traffic ") == 1 and log.count("event=unseen_traffic_gone") == 1, log[-2000:]
    assert "event=filter_reasserted" not in log
    print(f"with the filter ahead {bypass / 1e6:.1f} Mbit/s through a 10 Mbit/s limit, {unseen_bps / 1e6:.1f} "
          f"unseen; without {held / 1e6:.1f}, {st['datapath']['unseen_bps'] / 1e3:.0f} kbit/s unseen")
    assert bypass > 1.5 * 10e6, bypass
    assert within(unseen_bps, bypass, 0.15), (unseen_bps, bypass)
    assert within(held, 10e6, 0.10), held
    # the warning's own rule (agent/kernel/unseen.py): gone, and what is left of the last
    # second's comparison (a CI run measured 0.19 Mbit/s) far below the 5 % it warns at
    assert not st["datapath"]["unseen"] and st["datapath"]["unseen_bps"] < 0.05 * held, st["datapath"]


def test_the_agent_moves_its_filter_ahead_of_a_foreign_one_and_holds_the_limit_again(net3, agents):
    """The default, --filter-ahead reassert: a u32 filter at pref 10 that classifies everything
    takes the traffic; within a tick drl's filter is added again at pref 9, ahead of it (which
    stays), and the 1-s windows are back at the limit within 10 s (measured: the first one)."""
    h1, _, h3 = net3.hosts
    a1 = agents.start(h1, [], "static", "10mbit", "--interval", "100ms")
    sender = blast(h1, h3.addr4, 9, 20e6, 9)
    time.sleep(1.5)
    before = sink_rate_bps(h3, 1)
    h1.run("tc", "filter", "add", "dev", "eth0", "egress", "prio", "10", "protocol", "all",
           "u32", "match", "u32", "0", "0", "classid", "1:1")
    added = time.monotonic()
    windows = []
    while time.monotonic() - added < 5:
        windows.append(sink_rate_bps(h3, 1))
    sender.wait()
    st = a1.status()["datapath"]
    first_held = next(i for i, w in enumerate(windows) if within(w, 10e6, 0.10))
    print(f"before {before / 1e6:.1f} Mbit/s; 1-s windows after the filter: "
          f"{', '.join(f'{w / 1e6:.1f}' for w in windows)}")
    assert within(before, 10e6, 0.10), before
    assert first_held + 1 <= 10 and all(within(w, 10e6, 0.10) for w in windows[first_held:]), windows
    assert st["pref"] == 9 and st["ahead"] == [] and st["reasserted"] == 1 and not st["unseen"], st
    assert "pref 10 u32" in tc_show(h1, "filter")
    log = a1.log.read_text()
    assert log.count("event=filter_reasserted") == 1 and "event=filter_ahead " not in log, log[-2000:]
