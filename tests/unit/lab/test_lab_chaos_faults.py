"""The faults of `drl-lab run chaos`: recreate, one-way gossip loss, replay and kill-loop, read and
validated with file:line errors; their nftables rules, the link's commands and the capture's
packet filter (pure, no root)."""
import socket
import struct

import pytest

from drl.lab.faults import one_way_rules
from drl.lab.reader import SpecError, loads
from drl.lab.registry import resolve
from drl.lab.replay import gossip_source, with_udp_checksum
from drl.lab.topology import plan

BASE = """\
[experiment]
duration = "30s"
global = "30mbit"
allocators = ["fps"]

[hosts]
l1 = "limiter"
l2 = "limiter"
l3 = "limiter"
sw = "router"
sink = "sink"

[[link]]
ends = ["l1", "sw"]
[[link]]
ends = ["l2", "sw"]
[[link]]
ends = ["l3", "sw"]
[[link]]
ends = ["sw", "sink"]

[[traffic]]
kind = "tcp"
from = "l3"
flows = 6
"""
N = BASE.count("\n")  # the first line of an appended fault is N + 1


def _bad(extra: str) -> str:
    with pytest.raises(SpecError) as err:
        loads(BASE + extra, "bad.toml")
    return str(err.value)


CHAOS = """
[[fault]]
at = "3s"
action = "recreate"
agent = "l3"

[[fault]]
at = "5s"
action = "loss"
direction = "in"
agent = "l3"

[[fault]]
at = "7s"
action = "loss"
direction = "out"
agent = "l2"
percent = 40

[[fault]]
at = "9s"
action = "heal"

[[fault]]
at = "10s"
action = "kill-loop"
agent = "l3"
every = "2s"
for = "10s"

[[fault]]
at = "22s"
action = "replay"
agent = "l3"
count = 20
"""


def test_the_new_faults_are_read_with_their_defaults():
    exp = loads(BASE + CHAOS, "c.toml")
    recreate, loss_in, loss_out, heal, loop, replay = exp.faults
    assert (recreate.action, recreate.agent) == ("recreate", "l3")
    assert (loss_in.on, loss_in.percent, loss_in.direction, loss_in.agent) == ("gossip", 100, "in", "l3")
    assert (loss_out.percent, loss_out.direction, loss_out.agent) == (40, "out", "l2")
    assert (loop.every_s, loop.for_s, loop.horizon_s) == (2.0, 10.0, 15.0)   # the loop and 5 s after it
    assert (replay.count, replay.horizon_s) == (20, 5.0)
    assert [f.label for f in exp.faults] == ["recreate l3", "loss 100% gossip in (l3)", "loss 40% gossip out (l2)",
                                             "heal", "kill-loop l3 every 2s for 10s", "replay l3"]
    assert loads(BASE + CHAOS.replace("count = 20\n", ""), "c.toml").faults[-1].count == 100


def test_scaling_shortens_a_kill_loop_but_not_its_period():
    loop = loads(BASE + CHAOS, "c.toml").scaled(15.0).faults[4]
    assert (loop.at_s, loop.every_s, loop.for_s) == (5.0, 2.0, 5.0)


L = "\n[[fault]]\nat = \"4s\"\n"   # the fault's 'at' is line N + 3


@pytest.mark.parametrize("extra, expect", [
    (L + 'action = "recreate"\nagent = "sw"\n', f"bad.toml:{N + 5}: [[fault]] #1: field 'agent': 'sw' is not a limiter"),
    (L + 'action = "recreate"\n', f"bad.toml:{N + 2}: [[fault]] #1: missing field 'agent'"),
    (L + 'action = "loss"\ndirection = "sideways"\nagent = "l1"\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'direction': expected one of in, out, got 'sideways'"),
    (L + 'action = "loss"\ndirection = "in"\nagent = "sink"\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'agent': 'sink' is not a limiter"),
    (L + 'action = "loss"\ndirection = "in"\n', f"bad.toml:{N + 2}: [[fault]] #1: missing field 'agent'"),
    (L + 'action = "loss"\ndirection = "in"\nagent = "l1"\non = "data"\n',
     f"bad.toml:{N + 5}: [[fault]] #1: field 'direction': only gossip loss has a direction"),
    (L + 'action = "loss"\ndirection = "out"\nagent = "l1"\nhosts = ["l2"]\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'hosts': a one-way loss names one `agent`, not hosts"),
    (L + 'action = "loss"\ndirection = "out"\nagent = "l1"\npercent = 0\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'percent': a whole percentage 1..100, got 0"),
    (L + 'action = "loss"\npercent = 30\non = "gossip"\nagent = "l1"\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'agent': unknown field"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "2s"\n', f"bad.toml:{N + 2}: [[fault]] #1: missing field 'for'"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "0s"\nfor = "10s"\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'every': must be positive"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "5s"\nfor = "2s"\n',
     f"bad.toml:{N + 6}: [[fault]] #1: field 'every': 5 s is longer than the loop ('for' = 2 s)"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "2s"\nfor = "30s"\n',
     f"bad.toml:{N + 7}: [[fault]] #1: field 'for': the loop must end within the experiment (4 + 30 s > 30 s)"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "2s"\nfor = "soon"\n', f"bad.toml:{N + 7}: [[fault]] #1: field 'for'"),
    (L + 'action = "replay"\nagent = "l1"\ncount = 0\n', f"bad.toml:{N + 6}: [[fault]] #1: field 'count': 0 is out of range"),
    (L + 'action = "replay"\nagent = "l1"\nevery = "2s"\n', f"bad.toml:{N + 6}: [[fault]] #1: field 'every': unknown field"),
    (L + 'action = "kill"\nagent = "l1"\n' + L.replace("4s", "6s") + 'action = "replay"\nagent = "l1"\n',
     f"bad.toml:{N + 9}: [[fault]] #2: field 'action': cannot replay l1 at 6 s: it is dead then"),
    (L + 'action = "stop"\nagent = "l1"\n' + L.replace("4s", "6s") + 'action = "kill-loop"\nagent = "l1"\n'
     'every = "1s"\nfor = "3s"\n', f"bad.toml:{N + 9}: [[fault]] #2: field 'action': cannot kill-loop l1 at 6 s: it is stopped"),
    (L + 'action = "kill-loop"\nagent = "l1"\nevery = "2s"\nfor = "10s"\n' + L.replace("4s", "9s")
     + 'action = "kill"\nagent = "l1"\n',
     f"bad.toml:{N + 11}: [[fault]] #2: field 'action': cannot kill l1 at 9 s: its kill-loop runs until 14 s"),
])
def test_bad_new_fault_names_line_and_field(extra, expect):
    assert expect in _bad(extra)


def test_recreate_follows_any_state_and_other_agents_may_act_during_a_loop():
    exp = loads(BASE + L + 'action = "kill"\nagent = "l1"\n' + L.replace("4s", "5s") + 'action = "recreate"\nagent = "l1"\n'
                + L.replace("4s", "6s") + 'action = "kill-loop"\nagent = "l2"\nevery = "1s"\nfor = "9s"\n'
                + L.replace("4s", "8s") + 'action = "restart"\nagent = "l1"\n', "ok.toml")
    assert [f.label for f in exp.faults] == ["kill l1", "recreate l1", "kill-loop l2 every 1s for 9s", "restart l1"]


def test_one_way_rules_match_one_port_one_way():
    assert one_way_rules("lbl3-b", "in", 100) == [
        'oifname "lbl3-b" udp dport 7470 counter drop',
        'oifname "lbl3-b" udp sport 7470 udp dport != 7470 counter drop']
    assert one_way_rules("lbl3-b", "out", 30) == [
        'iifname "lbl3-b" udp dport 7470 numgen random mod 100 < 30 counter drop',
        'iifname "lbl3-b" udp sport 7470 udp dport != 7470 numgen random mod 100 < 30 counter drop']


def test_recreate_commands_make_both_ends_and_the_routes_through_the_link_again():
    p = plan(resolve("chaos"), run="lb00aa")
    l3 = p.agent_ifaces()["l3"]
    veth = next(v for v in p.veths if l3 in (v.a, v.b))
    build, again = p.build_commands(), p.recreate_commands(veth)
    assert again[0] == ["ip", "-n", "lb00aa-l3", "link", "del", "lb00aal3-0"]
    made = [c for c in build if "lb00aal3-0" in c or "lb00aasw-2" in c]
    assert made and all(c in again for c in made)      # the pair, addresses, ethtool, up, subnet routes
    through = [c for c in build if "route" in c and "add" in c and c[2] in ("lb00aa-l3", "lb00aa-sw")
               and c[c.index("via") + 1] in (veth.a.addr, veth.b.addr)]
    assert through and all(c in again for c in through)   # l3's routes to the other subnets, via sw
    assert all(c[:2] == ["ip", "-n"] or c[:3] == ["ip", "netns", "exec"] or c[:3] == ["ip", "link", "add"]
               for c in again)
    assert not any(c[2] == "lb00aa-l1" for c in again if len(c) > 2)   # nothing of the other links


def test_recreate_refuses_a_delay_lined_link():
    from drl.lab.errors import LabError
    p = plan(resolve("baseline"), run="lb00aa")
    p = type(p)(**{**p.__dict__, "netem": False})
    lined = next(v for v in p.veths if v.link and v.link.impaired)
    with pytest.raises(LabError, match="has a delay line"):
        p.recreate_commands(lined)


def _udp(src: str, dst: str, sport: int, dport: int, payload: bytes = b"x" * 20, frag: int = 0, proto: int = 17) -> bytes:
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, frag, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + udp


def test_the_capture_keeps_gossip_to_the_agent_only():
    assert gossip_source(_udp("10.254.0.1", "10.254.0.3", 7470, 7470), "10.254.0.3") == "10.254.0.1"
    assert gossip_source(_udp("10.254.0.1", "10.254.0.2", 7470, 7470), "10.254.0.3") is None   # to another agent
    assert gossip_source(_udp("10.254.0.1", "10.254.0.3", 7470, 53), "10.254.0.3") is None     # another port
    assert gossip_source(_udp("10.254.0.1", "10.254.0.3", 7470, 7470, proto=6), "10.254.0.3") is None
    assert gossip_source(_udp("10.254.0.1", "10.254.0.3", 7470, 7470, frag=0x0010), "10.254.0.3") is None
    assert gossip_source(b"\x60" + bytes(40), "10.254.0.3") is None                             # IPv6
    assert gossip_source(_udp("10.254.0.1", "10.254.0.3", 7470, 7470)[:24], "10.254.0.3") is None


def test_a_replayed_datagram_gets_a_valid_udp_checksum():
    """What the capture saw of a datagram from an offloading veth has a partial checksum; the
    replay's must verify: the one's-complement sum over pseudo-header and datagram is 0xFFFF."""
    sent = _udp("10.254.0.1", "10.254.0.3", 7470, 7470, payload=b"gossip!")   # odd length, checksum 0
    fixed = with_udp_checksum(sent)
    assert fixed[:26] == sent[:26] and fixed[28:] == sent[28:]       # only the checksum changed
    udp = fixed[20:]
    pseudo = fixed[12:20] + struct.pack("!BBH", 0, 17, len(udp))
    data = pseudo + udp + b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    assert total == 0xFFFF and fixed[26:28] != b"\0\0"
    assert with_udp_checksum(fixed) == fixed


def test_shipped_chaos_experiment():
    exp = resolve("chaos")
    assert exp.allocators == ("fps",) and exp.global_Bps == 30e6 / 8 and exp.duration_s <= 120
    assert exp.agent["enforce"] == "police"
    assert [t.flows for t in exp.traffic] == [1, 3, 6]
    assert [f.action for f in exp.faults] == ["recreate", "loss", "heal", "loss", "heal", "kill-loop", "replay"]
    assert [f.direction for f in exp.faults if f.action == "loss"] == ["in", "out"]
    assert {f.agent for f in exp.faults if f.agent} == {"l3"}     # the agent with the most flows
    assert all("max_window_ratio" in f.checks for f in exp.faults)
    # every fault's window reaches the next fault: none is left unmeasured
    for f, nxt in zip(exp.faults, exp.faults[1:]):
        assert f.at_s + f.horizon_s >= nxt.at_s, f.label


def test_the_documented_chaos_example_is_valid():
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "lab.md").read_text()
    example = next(b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if 'action = "recreate"' in b)
    exp = loads(BASE.replace('duration = "30s"', 'duration = "90s"') + example, "docs/lab.md")
    assert [f.label for f in exp.faults] == ["recreate l3", "loss 100% gossip in (l3)", "kill-loop l3 every 2s for 20s",
                                             "replay l3"]


def test_recreate_of_a_delay_lined_link_is_refused_before_the_run(monkeypatch, tmp_path):
    from drl.lab.preflight import check
    from drl.lab.reader import load
    path = tmp_path / "r.toml"
    path.write_text(BASE.replace('ends = ["l3", "sw"]', 'ends = ["l3", "sw"]\ndelay = "5ms"')
                    + L + 'action = "recreate"\nagent = "l3"\n')
    exp = load(path)
    monkeypatch.setattr("drl.lab.preflight.netem_available", lambda: True)
    check(exp)                                        # netem impairs it: the commands make it again
    monkeypatch.setattr("drl.lab.preflight.netem_available", lambda: False)
    with pytest.raises(SpecError) as err:
        check(exp)
    assert f"r.toml:{N + 5}: [[fault]] #1: field 'action': recreate cannot make link l3-sw again" in str(err.value)
