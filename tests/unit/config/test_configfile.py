"""drl.toml (agent/config/toml.py): parsed by the flags' own parsers, errors at file:line, flags on top."""
from __future__ import annotations

import pytest

from drl.agent.config.build import ConfigError
from drl.agent.units import parse_rate

from daemon_harness import GOOD, load



def test_a_file_gives_named_classes_with_agent_defaults(tmp_path):
    cfg = load(tmp_path, GOOD)
    assert cfg.iface == "lo" and cfg.node_id == "a" and len(cfg.peers) == 2 and cfg.key is None
    gold, silver = cfg.classes
    assert (gold.name, gold.global_Bps, gold.allocator.name, gold.ewma) == ("gold", parse_rate("50mbit"), "static", 0.3)
    assert [str(r) for r in gold.rules] == ["dst=198.51.100.0/24", "proto=6,dport=443"]
    assert (silver.allocator.name, silver.burst_bytes, silver.rules) == ("fps", 256_000, ())


def test_flags_override_the_file_and_global_adds_the_class_default(tmp_path):
    cfg = load(tmp_path, GOOD, "--node-id", "z", "--ewma", "0.5", "--global", "10mbit", "--class", "mark=0x1")
    assert cfg.node_id == "z"
    assert [c.name for c in cfg.classes] == ["default", "gold", "silver"]
    assert all(c.ewma == 0.5 for c in cfg.classes)
    assert cfg.classes[0].global_Bps == parse_rate("10mbit") and cfg.classes[0].allocator.name == "static"


def test_etcd_classes_go_on_top_of_the_file_and_the_flags(tmp_path):
    cfg = load(tmp_path, GOOD, "--global", "10mbit", "--registry", "etcd://10.0.0.9:2379", "--cluster", "t")
    live = {"default": {"name": "default", "global": "4mbit"},                     # replaces --global
            "gold": {"name": "gold", "global": "70mbit"},                          # one key of a file class
            "new": {"name": "new", "global": "1mbit", "match": ["mark=0x2"]}}      # a class only etcd has
    confs = {c.name: c for c in cfg.live_classes(live)}
    assert list(confs) == ["default", "gold", "silver", "new"]
    assert confs["default"].global_Bps == parse_rate("4mbit") and confs["gold"].global_Bps == parse_rate("70mbit")
    assert [str(r) for r in confs["gold"].rules] == ["dst=198.51.100.0/24", "proto=6,dport=443"]   # kept
    assert confs["new"].allocator.name == "static" and confs["new"].ewma == 0.3    # [agent]'s defaults
    with pytest.raises(ConfigError, match="etcd class 'new'.*unknown key 'colour'"):
        cfg.live_classes({"new": {"name": "new", "global": "1mbit", "colour": "red"}})
    assert load(tmp_path, GOOD).live_classes is None                               # no registry


def test_etcd_classes_go_on_the_file_as_last_loaded_not_as_edited(tmp_path):
    cfg = load(tmp_path, GOOD, "--registry", "etcd://10.0.0.9:2379", "--cluster", "t")
    (tmp_path / "drl.toml").write_text(GOOD.replace('"50mbit"', '"60mbit"'))     # edited, not reloaded
    assert cfg.live_classes({})[0].global_Bps == parse_rate("50mbit")
    assert cfg.reload({})[0].global_Bps == parse_rate("60mbit")                  # now it is
    assert cfg.live_classes({})[0].global_Bps == parse_rate("60mbit")
    (tmp_path / "drl.toml").write_text("[[class]]\nname = 1\n")                  # a bad edit: refused ...
    with pytest.raises(ConfigError):
        cfg.reload({})
    assert cfg.live_classes({})[0].global_Bps == parse_rate("60mbit")            # ... and not in force


def test_reload_reads_the_file_again_with_the_flags_on_top(tmp_path):
    cfg = load(tmp_path, GOOD, "--ewma", "0.5")
    (tmp_path / "drl.toml").write_text(GOOD.replace('global = "20mbit"', 'global = "30mbit"'))
    silver = cfg.reload()[1]
    assert silver.global_Bps == parse_rate("30mbit") and silver.ewma == 0.5


@pytest.mark.parametrize("text, where, what", [
    ('[agent]\ninterval = "fast"\n', ":2:", "interval"),
    ('[agent]\nbranching = 0\n', ":2:", "branching"),
    ('[agent]\nglobal = "1mbit"\n', ":2:", "unknown key 'global'"),
    ('[[class]]\nname = "x"\nglobal = 50\n', ":3:", "needs a unit"),
    ('[[class]]\nname = "x"\nglobal = "1mbit"\n\n[[class]]\nname = "y"\nglobal = "1mbit"\nmbps = 1\n', ":8:",
     "unknown key 'mbps'"),
    ('[[class]]\nname = "x"\nglobal = "1mbit"\n[[class]]\nname = "x"\nglobal = "2mbit"\n', ":5:", "defined twice"),
    ('[[class]]\nname = "a b"\nglobal = "1mbit"\n', ":2:", "needs name"),
    ('[[class]]\nname = ".."\nglobal = "1mbit"\n', ":2:", "needs name"),
    ('[[class]]\nname = "x"\n', ":1:", "missing global"),
    ('[agent]\niface = "lo"\nnode_id = "a"\n[[class]]\nname = "x"\nglobal = "1mbit"\nmatch = ["dst=nowhere"]\n',
     "drl.toml:4: class 'x'", "not an address"),
    ('[agent]\niface = "lo"\nnode_id = "a"\n[[class]]\nname = "a"\nglobal = "1mbit"\n\n[[class]]\nname = "b"\n'
     'global = "1mbit"\nenforce = "shape"\nallocator = "grd"\n', "drl.toml:8: class 'b'", "cannot enforce random drop"),
    ('[agent]\niface = "lo"\nnode_id = "a"\n' + "".join(f'[[class]]\nname = "c{p}"\nglobal = "1mbit"\n'
                                                     f'match = ["dport={p + 1}"]\n' for p in range(9)),
     "prefix any: 9 rules", "at most 8"),
    ('[agent\n', "drl.toml", "line 1"),
    ('[tenant]\n', "drl.toml", "unknown table [tenant]"),
])
def test_a_bad_file_is_one_line_naming_file_and_line(tmp_path, text, where, what):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg and where in msg and what in msg, msg


def test_no_class_at_all_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no class to limit"):
        load(tmp_path, '[agent]\niface = "lo"\n')


def test_class_without_global_flag_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="give --global RATE with it"):
        load(tmp_path, GOOD, "--class", "dport=80")


def test_peers_need_a_key_but_a_lone_agent_does_not(tmp_path):
    with pytest.raises(ConfigError, match="cluster key"):
        load(tmp_path, GOOD.replace("insecure = true\n", ""))
    lone = load(tmp_path, '[agent]\niface = "lo"\n[[class]]\nname = "x"\nglobal = "1mbit"\n')
    assert lone.standalone and lone.key is None


CLIENTS = """\
[agent]
iface = "lo"
node_id = "a"
interval = "100ms"

[[class]]
name = "gold"
global = "50mbit"
client = "dst/24"
threshold = "2mbit"
exempt = ["10.0.0.0/8", "2001:db8::1"]

[[class]]
name = "api"
global = "20mbit"
client = "src/32/56"
measure = "conns"
threshold = "2000/1200s"
action = "ban"
ban_duration = "3600s"
"""


def test_client_rules_come_from_the_file_with_the_papers_keys(tmp_path):
    gold, api = load(tmp_path, CLIENTS).classes
    assert str(gold.client.key) == "dst/24/64" and gold.client.measure == "bytes"
    assert gold.client.action == "throttle" and gold.client.limit == 250_000 and gold.client.window_s == 1.0
    assert [str(n) for n in gold.client.exempt] == ["10.0.0.0/8", "2001:db8::1/128"]
    assert str(api.client.key) == "src/32/56" and api.client.measure == "conns"
    assert (api.client.limit, api.client.window_s, api.client.ban_duration_s) == (2000, 1200, 3600)


def test_client_flags_make_the_default_class_rule_and_override_the_file(tmp_path):
    assert load(tmp_path, GOOD).classes[0].client is None   # no key, no rule
    cfg = load(tmp_path, GOOD, "--global", "10mbit", "--client-key", "dst/32", "--client-threshold", "1mbit",
               "--client-action", "ban", "--ban-duration", "0s", "--client-exempt", "192.0.2.7")
    default = cfg.classes[0]
    assert default.name == "default" and default.client.action == "ban" and default.client.limit == 125_000
    assert [str(n) for n in default.client.exempt] == ["192.0.2.7/32"]
    assert all(c.client == default.client for c in cfg.classes)   # a class flag given goes into every class


@pytest.mark.parametrize("table, where, what", [
    ('client = "dst/33/64"\nthreshold = "1mbit"\n', ":6:", "at most 32"),
    ('client = "dst/32"\nthreshold = "2000"\n', ":7:", "COUNT/WINDOW"),
    ('client = "dst/32"\nmeasure = "packets"\nthreshold = "2mbit"\n', "class 'x'", "'2000/1s'"),
    ('client = "dst/32"\nthreshold = "1mbit"\nban_duration = "60s"\n', "class 'x'", "ban_duration applies"),
    ('threshold = "1mbit"\n', "class 'x'", "without a client key"),
    ('client = "dst/32"\nmeasure = "packets"\nthreshold = "100/50ms"\n', "class 'x'", "shorter than the interval"),
    ('client = "dst/32"\nthreshold = "1mbit"\nexempt = ["nowhere"]\n', ":8:", "not an address"),
    ('client = "dst/32"\nthreshold = "1mbit"\naction = "jail"\n', ":8:", "jail"),
    ('client = "dst/32"\nthreshold = "10GB/30d"\n', "class 'x'", "at most 39 h"),
])
def test_a_bad_client_rule_is_one_line(tmp_path, table, where, what):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, '[agent]\niface = "lo"\n[[class]]\nname = "x"\nglobal = "1mbit"\n' + table)
    msg = str(e.value)
    assert "\n" not in msg and where in msg and what in msg, msg


def test_a_file_of_too_many_classes_is_refused_before_they_are_parsed(tmp_path):
    """100,000 [[class]] tables took minutes to reach the class limit; now refused unread,
    and the duplicate check is linear (20,000 distinct classes read in seconds)."""
    import time
    from drl.agent.config import toml
    path = tmp_path / "drl.toml"
    path.write_text("".join(f'[[class]]\nname = "c{i}"\nglobal = "1mbit"\n' for i in range(70_000)))
    t0 = time.monotonic()
    with pytest.raises(toml.ConfigFileError, match="70000 \\[\\[class\\]\\] tables, at most 65536"):
        toml.read(str(path))
    assert time.monotonic() - t0 < 5.0
    path.write_text("".join(f'[[class]]\nname = "c{i}"\nglobal = "1mbit"\n' for i in range(20_000)) +
                    '[[class]]\nname = "c7"\nglobal = "1mbit"\n')
    with pytest.raises(toml.ConfigFileError, match=":60002: class 'c7' defined twice"):
        toml.read(str(path))
