"""The experiment file format: every shipped file validates; bad files name their line and field."""
import pytest

from drl.lab.registry import builtin, resolve
from drl.lab.preflight import check
from drl.lab.reader import SpecError, load, loads

GOOD = """\
[experiment]
duration = "20s"
global = "10mbit"
allocators = ["fps", "ctb"]

[hosts]
l1 = "limiter"
l2 = "limiter"
s2 = "source"
sw = "router"
sink = "sink"

[[link]]
ends = ["l1", "sw"]
[[link]]
ends = ["l2", "sw"]
[[link]]
ends = ["s2", "l2"]
rate = "50mbit"
[[link]]
ends = ["sw", "sink"]

[[traffic]]
kind = "tcp"
from = "l1"
flows = 3

[[traffic]]
kind = "udp"
from = "s2"
rate = "1mbit"
start = "5s"
stop = "15s"

[[event]]
at = "10s"
link = ["s2", "l2"]
rate = "2mbit"
"""


@pytest.mark.parametrize("name", sorted(builtin()))
def test_every_shipped_experiment_validates(name):
    exp = resolve(name)
    assert exp.name == name
    assert exp.traffic and exp.limiters
    # faults and attacks hit agents and gossip, which CTB lacks; a matrix scores against ideal shares
    assert "ctb" in exp.allocators or exp.faults or exp.matrix or exp.attacks
    assert 0 < exp.warmup_s < exp.duration_s
    for t in exp.traffic:
        assert exp.limiter_of(t.src) in exp.limiters


def test_good_file_reads_every_field():
    exp = loads(GOOD, "good.toml")
    assert exp.name == "good"
    assert exp.global_Bps == 10e6 / 8
    assert exp.links[2].rate_Bps == 50e6 / 8
    assert [exp.limiter_of(t.src) for t in exp.traffic] == ["l1", "l2"]
    udp = exp.traffic[1]
    assert (udp.kind, udp.rate_Bps, udp.start_s, udp.stop_s) == ("udp", 1e6 / 8, 5.0, 15.0)
    assert exp.events[0].rate_Bps == 2e6 / 8


def test_scaling_moves_every_time_alike():
    exp = loads(GOOD, "good.toml").scaled(10.0)
    assert exp.duration_s == 10.0
    assert (exp.traffic[1].start_s, exp.traffic[1].stop_s, exp.events[0].at_s) == (2.5, 7.5, 5.0)


def _bad(replace: str, by: str) -> str:
    assert replace in GOOD
    with pytest.raises(SpecError) as err:
        loads(GOOD.replace(replace, by, 1), "bad.toml")
    return str(err.value)


@pytest.mark.parametrize("replace, by, expect", [
    ('global = "10mbit"', 'global = "10mbps"', "bad.toml:3: [experiment]: field 'global': ambiguous rate unit"),
    ('global = "10mbit"', 'global = "0mbit"', "bad.toml:3: [experiment]: field 'global': rate '0mbit' is below the floor"),
    ('rate = "50mbit"', 'rate = "0bit"', "bad.toml:19: [[link]] #3: field 'rate': rate '0bit' is below the floor"),
    ('rate = "1mbit"', 'rate = "0mbit"', "[[traffic]] #2: field 'rate': rate '0mbit' is below the floor"),
    ('rate = "50mbit"', 'rate = "fast"', "bad.toml:19: [[link]] #3: field 'rate': not a rate"),
    ('flows = 3', 'flows = 0', "bad.toml:26: [[traffic]] #1: field 'flows'"),
    ('flows = 3', 'flow = 3', "bad.toml:26: [[traffic]] #1: field 'flow': unknown field"),
    ('kind = "udp"', 'kind = "quic"', "bad.toml:29: [[traffic]] #2: field 'kind': expected one of tcp, udp, web"),
    ('from = "l1"', 'from = "sw"', "bad.toml:25: [[traffic]] #1: field 'from': 'sw' is not a limiter or source"),
    ('stop = "15s"', 'stop = "25s"', "bad.toml:33: [[traffic]] #2: field 'stop'"),
    ('ends = ["s2", "l2"]', 'ends = ["s2", "l9"]', "bad.toml:18: [[link]] #3: field 'ends': unknown host 'l9'"),
    ('allocators = ["fps", "ctb"]', 'allocators = ["fastest"]', "bad.toml:4: [experiment]: field 'allocators': unknown allocator"),
    ('at = "10s"', 'at = "30s"', "bad.toml:36: [[event]] #1: field 'at'"),
    ('sw = "router"', 'sw = "switch"', "bad.toml:10: [hosts]: field 'sw': expected one of limiter"),
    ('l1 = "limiter"', 'limiter1 = "limiter"', "[hosts]: field 'limiter1': host names are 1-6 characters"),
    ('global = "10mbit"', 'global = "10mbit"\nrto_min = "1s"', "bad.toml:4: [experiment]: field 'rto_min': must be between"),
    ('allocators = ["fps", "ctb"]', 'allocators = ["fps", "ctb"]\n[agent]\nenforce = "drop"',
     "bad.toml:6: [agent]: field 'enforce': expected one of police, shape, got 'drop'"),
    ('rate = "1mbit"', 'rate = "1mbit"\ncongestion_control = "bbr"',
     "[[traffic]] #2: field 'congestion_control': unknown field"),   # UDP has none
])
def test_bad_field_names_line_and_field(replace, by, expect):
    assert expect in _bad(replace, by)


def _refused_by_preflight(tmp_path, replace: str, by: str) -> str:
    """Reading is machine-independent; the run's preflight refuses what this machine lacks."""
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace(replace, by, 1))
    exp = load(path)
    with pytest.raises(SpecError) as err:
        check(exp)
    return str(err.value).replace(str(tmp_path) + "/", "")


def test_delay_runs_without_netem_on_the_delay_line(monkeypatch, tmp_path):
    """No sch_netem is no reason to refuse: the lab's delay line (lab/delay.py) takes over."""
    monkeypatch.setattr("drl.lab.preflight.netem_available", lambda: False)
    path = tmp_path / "slow.toml"
    path.write_text(GOOD.replace('rate = "50mbit"', 'rate = "50mbit"\ndelay = "20ms"\nloss = "1%"', 1))
    check(load(path))


def test_unknown_congestion_control_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr("drl.lab.preflight.available_cc", lambda: ["reno", "cubic"])
    msg = _refused_by_preflight(tmp_path, 'global = "10mbit"', 'global = "10mbit"\ncongestion_control = "fastest"')
    assert "bad.toml:4: [experiment]: field 'congestion_control': expected one of reno, cubic, got 'fastest'" in msg


def test_a_groups_unknown_congestion_control_is_refused_at_its_line(monkeypatch, tmp_path):
    monkeypatch.setattr("drl.lab.preflight.available_cc", lambda: ["reno", "cubic"])
    msg = _refused_by_preflight(tmp_path, 'kind = "tcp"', 'kind = "tcp"\ncongestion_control = "bbr"')
    assert "[[traffic]] #1: field 'congestion_control': expected one of reno, cubic, got 'bbr'" in msg


def test_flow_must_cross_exactly_one_limiter():
    msg = _bad('ends = ["s2", "l2"]', 'ends = ["s2", "sw"]')
    assert "field 'from': the path s2 -> sink must cross exactly one limiter, it crosses 0" in msg


def test_sink_needs_a_single_link():
    assert "the sink needs exactly one link" in _bad('ends = ["l1", "sw"]', 'ends = ["l1", "sink"]')


def test_syntax_error_keeps_tomllibs_line():
    with pytest.raises(SpecError, match=r"bad.toml: .*line 2"):
        loads("[experiment]\nduration = = 1\n", "bad.toml")


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(SpecError, match="cannot read experiment file"):
        load(tmp_path / "nope.toml")


def test_the_documented_example_is_a_valid_file():
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "lab.md").read_text()
    example = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    exp = loads(example, "docs/lab.md")
    assert [t.kind for t in exp.traffic] == ["tcp", "udp", "web"] and exp.events
