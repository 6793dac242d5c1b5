"""Link delay, jitter and loss without root: the file's fields, the commands that build a delay
line (or netem), and the delay line's release schedule (lab/delay.py's Direction)."""
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from drl.lab.delay import Direction, drops_summary, link_rows
from drl.lab.errors import LabError
from drl.lab.reader import SpecError, loads
from drl.lab.topology import pair, plan, star
from drl.lab.vagrant import dumps, export

ROOT = Path(__file__).resolve().parents[3]

FILE = """\
[experiment]
duration = "20s"
global = "10mbit"
allocators = ["fps", "ctb"]

[hosts]
l1 = "limiter"
sw = "router"
sink = "sink"

[[link]]
ends = ["l1", "sw"]
delay = "20ms"
jitter = "1ms"
loss = "0.5%"
[[link]]
ends = ["sw", "sink"]

[[traffic]]
kind = "tcp"
from = "l1"
"""


def test_link_reads_delay_jitter_and_loss_per_direction():
    exp = loads(FILE, "slow.toml")
    link = exp.links[0]
    assert (link.delay_s, link.jitter_s, link.loss_pct, link.impaired) == (0.02, 0.001, 0.5, True)
    assert not exp.links[1].impaired


@pytest.mark.parametrize("replace, by, expect", [
    ('delay = "20ms"', 'delay = "twenty"', "slow.toml:13: [[link]] #1: field 'delay': not a duration: 'twenty'"),
    ('delay = "20ms"', 'delay = "40"', "slow.toml:13: [[link]] #1: field 'delay': at most 1s one way, got '40'"),
    ('delay = "20ms"', 'delay = "-2ms"', "slow.toml:13: [[link]] #1: field 'delay': duration must not be negative"),
    ('jitter = "1ms"', 'jitter = "30ms"', "slow.toml:14: [[link]] #1: field 'jitter': must not exceed the delay (20ms)"),
    ('loss = "0.5%"', 'loss = "1"', "slow.toml:15: [[link]] #1: field 'loss': expected a percentage below 100 like '1%'"),
    ('loss = "0.5%"', 'loss = "100%"', "slow.toml:15: [[link]] #1: field 'loss': expected a percentage below 100"),
    ('loss = "0.5%"', 'loss = 0.5', "slow.toml:15: [[link]] #1: field 'loss': expected a percentage below 100"),
    ('loss = "0.5%"', 'lossy = "1%"', "slow.toml:15: [[link]] #1: field 'lossy': unknown field"),
])
def test_bad_impairment_is_one_located_line(replace, by, expect):
    with pytest.raises(SpecError) as err:
        loads(FILE.replace(replace, by), "slow.toml")
    assert str(err.value).startswith(expect)
    assert "\n" not in str(err.value)


def test_code_topologies_take_the_same_words():
    t = pair("dp0a1b", delay="20ms", loss="1%")
    assert (t.veths[0].link.delay_s, t.veths[0].link.loss_pct) == (0.02, 1.0)
    assert all(v.link.jitter_s == 0.002 for v in star(3, "st0a1b", delay="5ms", jitter="2ms").veths)
    assert pair("dp0a1b").veths[0].link is None
    with pytest.raises(LabError, match="jitter: must not exceed the delay"):
        pair("dp0a1b", jitter="1ms")


def test_without_netem_a_link_goes_through_a_relay_namespace():
    t = pair("dp0a1b", delay="20ms", netem=False)
    [line] = t.delay_lines()
    assert (line.host, line.ports) == ("dl-0", ("dp0a1bdl0a", "dp0a1bdl0b"))
    assert t.namespaces == ["dp0a1b-h1", "dp0a1b-h2", "dp0a1b-dl-0"]
    cmds = t.build_commands()
    created = [c for c in cmds if c[:3] == ["ip", "link", "add"]]
    assert created == [["ip", "link", "add", "eth0", "netns", "dp0a1b-h1", "type", "veth", "peer", "name", "dp0a1bdl0a",
                        "netns", "dp0a1b-dl-0"],
                       ["ip", "link", "add", "eth0", "netns", "dp0a1b-h2", "type", "veth", "peer", "name", "dp0a1bdl0b",
                        "netns", "dp0a1b-dl-0"]]
    # the relay reads frames as the veth hands them: no partial checksums, no GSO skbs, on all four
    off = [c for c in cmds if "ethtool" in c]
    assert len(off) == 4 and all(c[-8:] == ["tx", "off", "tso", "off", "gso", "off", "gro", "off"] for c in off)
    # its namespace has no IPv6 (no ND/MLD of its own), set before the ports arrive
    sysctl = next(i for i, c in enumerate(cmds) if "net.ipv6.conf.default.disable_ipv6=1" in c)
    assert sysctl < cmds.index(created[0])
    assert not any(c[0] == "tc" for c in cmds)   # no qdisc: the relay delays
    argv = line.argv("/run/drl-lab/dp0a1b/delay-0.json", python="python3")
    assert argv == ["python3", "-m", "drl.lab.delay", "--ports", "dp0a1bdl0a", "dp0a1bdl0b", "--names", "h1", "h2",
                    "--stats", "/run/drl-lab/dp0a1b/delay-0.json", "--delay", "20ms"]


def test_with_netem_a_link_is_one_veth_with_netem_on_both_ends():
    t = pair("dp0a1b", delay="20ms", jitter="1ms", loss="1%", netem=True)
    assert t.delay_lines() == [] and len(t.namespaces) == 2
    tc = [c for c in t.build_commands() if c[0] == "tc"]
    assert [c[2] for c in tc] == ["dp0a1b-h1", "dp0a1b-h2"]
    assert all(c[c.index("root") + 1:] == ["netem", "delay", "20ms", "1ms", "loss", "1%"] for c in tc)


def test_experiment_links_keep_their_names_and_rate_stays_tbf_on_the_delay_line():
    exp = loads(FILE.replace('loss = "0.5%"', 'loss = "0.5%"\nrate = "50mbit"'), "slow.toml")
    p = plan(exp, run="lb0a1b")
    assert p.netem is None and [d.ports for d in p.delay_lines()] == [("lb0a1bdl0a", "lb0a1bdl0b")]
    assert p.iface("l1", "sw").name == "lb0a1bl1-0" and p.address("sink") == "10.1.1.2"
    shaping = p.shaping_commands(exp.links[0], 2e6 / 8)   # a link event: the rate changes, the relay stays
    assert all(c[c.index("root") + 1] == "tbf" for c in shaping)
    assert p.shaping_commands(exp.links[1], None) == []
    argv = p.delay_lines()[0].argv("/s")
    assert argv[argv.index("--names") + 1:argv.index("--names") + 3] == ["l1", "sw"]
    assert argv[-6:] == ["--delay", "20ms", "--jitter", "1ms", "--loss", "0.5%"]


# -- the release schedule -----------------------------------------------------------

def test_each_frame_leaves_at_arrival_plus_delay():
    d = Direction(delay_s=0.02)
    for k in range(5):
        assert d.push(bytes([k]), now=1.0 + k * 0.001)
    assert d.next_at() == pytest.approx(1.02)
    assert d.due(1.0199) == []
    assert d.due(1.0225) == [b"\x00", b"\x01", b"\x02"]
    assert d.next_at() == pytest.approx(1.023)
    assert d.due(5.0) == [b"\x03", b"\x04"] and d.next_at() is None


def test_without_jitter_frames_never_overtake():
    """Bursts, late wake-ups and equal arrival times: the order out is the order in."""
    rng = random.Random(7)
    d = Direction(delay_s=0.005, rng=rng)
    now, sent, out = 0.0, 0, []
    for _ in range(5000):
        now += rng.choice([0.0, 0.0, 1e-6, 1e-4, 0.003])
        d.push(sent.to_bytes(4, "big"), now)
        sent += 1
        if rng.random() < 0.3:
            out += d.due(now + rng.uniform(0, 0.01))
    out += d.due(now + 1)
    assert [int.from_bytes(f, "big") for f in out] == list(range(sent))


def test_jitter_spreads_delays_within_bounds_and_may_reorder():
    d = Direction(delay_s=0.02, jitter_s=0.005, rng=random.Random(1))
    for k in range(2000):
        d.push(k.to_bytes(4, "big"), now=k * 1e-4)
    release = sorted(d.heap)
    delays = [at - int.from_bytes(f, "big") * 1e-4 for at, _, f in release]
    assert 0.015 <= min(delays) < 0.0155 and 0.0245 < max(delays) <= 0.025
    order = [int.from_bytes(f, "big") for f in d.due(1.0)]
    assert sorted(order) == list(range(2000)) and order != list(range(2000))


def test_loss_is_an_independent_draw_and_counted():
    n = 100_000
    d = Direction(delay_s=0.0, loss_pct=1.0, limit=n, rng=random.Random(3))
    kept = sum(d.push(b"x", now=0.0) for _ in range(n))
    sigma = (n * 0.01 * 0.99) ** 0.5
    assert abs(d.lost - n * 0.01) < 4 * sigma
    assert kept + d.lost == n == d.received


def test_a_full_queue_drops_and_counts_overflow():
    d = Direction(delay_s=1.0, limit=3)
    assert [d.push(b"x", now=0.0) for _ in range(5)] == [True, True, True, False, False]
    assert (d.overflow, len(d)) == (2, 3)
    assert d.stats()["overflow"] == 2


def test_result_rows_list_every_link_with_its_relays_drops():
    exp = loads(FILE, "slow.toml")
    p = plan(exp, run="lb0a1b", central=False)
    stats = [{"link": 0, "ends": ["l1", "sw"], "cpu_s": 1.5, "uptime_s": 20.0, "directions": {
        "l1->sw": {"received": 1000, "sent": 990, "queued": 0, "lost": 5, "overflow": 3, "socket_drops": 2,
                   "send_errors": 0},
        "sw->l1": {"received": 500, "sent": 498, "queued": 0, "lost": 2, "overflow": 0, "socket_drops": 0,
                   "send_errors": 0}}}]
    rows = link_rows(p, stats)
    assert [r["ends"] for r in rows] == [["l1", "sw"], ["sw", "sink"]]
    assert (rows[0]["delay_ms"], rows[0]["jitter_ms"], rows[0]["loss_pct"], rows[0]["impaired_by"]) == \
        (20.0, 1.0, 0.5, "delay line")
    assert rows[0]["delay_line"]["directions"]["l1->sw"]["overflow"] == 3
    assert rows[1]["impaired_by"] is None and "delay_line" not in rows[1]
    # the loss asked for is not the relay's fault; overflow and socket drops are
    assert drops_summary(rows) == ["delay line l1->sw: overflow 3, socket_drops 2 of 1000 frames"]


def test_vagrant_twin_carries_delay_as_netem(tmp_path):
    """VMs have sch_netem: the export names the link's delay, jitter and loss; links without
    them export as before (the shipped topologies did not change)."""
    doc = export(loads(FILE, "slow.toml"))
    links = {h["name"]: h["links"] for h in doc["hosts"]}
    assert links["l1"][0] == {"net": "link0", "addr": "10.1.0.1", "prefix": 24, "rate_bps": None,
                              "delay_ms": 20.0, "jitter_ms": 1.0, "loss_pct": 0.5}
    assert "delay_ms" not in links["sink"][0]
    if not shutil.which("ruby"):
        pytest.skip("needs ruby to run vagrant/topology.rb")
    (tmp_path / "slow.json").write_text(dumps(doc))
    vms = json.loads(subprocess.run(["ruby", str(ROOT / "vagrant" / "topology.rb"), str(tmp_path / "slow.json"), "fps"],
                                    check=True, capture_output=True, text=True).stdout)
    assert {vm["name"]: vm["shaping"] for vm in vms} == {
        "l1": ["10.1.0.1,0,20.0,1.0,0.5"], "sw": ["10.1.0.2,0,20.0,1.0,0.5"], "sink": []}
