"""The option model (agent/config/schema.py): one field per option, and the flags, the file
and etcd's tables all give the same value for the same text."""
from __future__ import annotations

import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from drl.agent.config import schema, toml
from drl.agent.config.schema import CLASS, CLASS_ONLY, FIELDS, OptionError
from drl.cli.agent import main, up

ROOT = Path(__file__).resolve().parents[3]

# A value for every field: the flag's text, and the same value as a TOML file writes it.
SAMPLES: dict[str, tuple[str | None, object]] = {
    "iface": ("eth9", "eth9"),
    "global_Bps": ("50mbit", "50mbit"),
    "allocator": ("gdrl", "gdrl"),
    "node_id": ("n1", "n1"),
    "listen": ("10.0.0.1:7470", "10.0.0.1:7470"),
    "peers": ("b@10.0.0.2:7470,c@10.0.0.3:7470", ["b@10.0.0.2:7470", "c@10.0.0.3:7470"]),
    "key_file": ("/etc/drl/cluster.key", "/etc/drl/cluster.key"),
    "identity_file": ("/etc/drl/node.key", "/etc/drl/node.key"),
    "peer_keys_file": ("/etc/drl/peers.pub", "/etc/drl/peers.pub"),
    "insecure": (None, True),
    "interval_s": ("50ms", "50ms"),
    "branching": ("4", 4),
    "peer_timeout_s": ("2s", "2s"),
    "burst_bytes": ("256KB", "256KB"),
    "burst_budget": ("1MB", "1MB"),
    "class_specs": ("dport=80,proto=tcp", ["dport=80,proto=tcp"]),
    "socket_path": ("/tmp/drl-test.sock", "/tmp/drl-test.sock"),
    "safe_Bps": ("5mbit", "5mbit"),
    "ewma": ("0.3", 0.3),
    "flow_ewma": ("0.5", 0.5),
    "sample_probability": ("0.2", 0.2),
    "max_flows": ("1024", 1024),
    "max_classes": ("100", 100),
    "max_clients": ("2048", 2048),
    "eta": ("0.25", 0.25),
    "quota": ("10TB/30d", "10TB/30d"),
    "lease_servers": ("a,b", "a,b"),
    "on_lease_loss": ("optimistic", "optimistic"),
    "shadow": (None, True),
    "enforce": ("shape", "shape"),
    "client_key": ("dst/24", "dst/24"),
    "client_measure": ("conns", "conns"),
    "client_threshold": ("2000/1200s", "2000/1200s"),
    "client_action": ("ban", "ban"),
    "ban_duration_s": ("60s", "60s"),
    "client_exempt": ("10.0.0.0/8", ["10.0.0.0/8"]),
    "state_dir": ("/tmp/drl-state", "/tmp/drl-state"),
    "gossip_mark": ("0x42", 0x42),
    "log_format": ("json", "json"),
    "filter_ahead": ("warn", "warn"),
    "metrics": ("10.0.0.1:9470", "10.0.0.1:9470"),
    "registry": ("etcd://10.0.0.9:2379,10.0.0.10:2379", ["etcd://10.0.0.9:2379", "10.0.0.10:2379"]),
    "cluster": ("prod", "prod"),
    "registry_ca": ("/etc/drl/ca.pem", "/etc/drl/ca.pem"),
    "registry_cert": ("/etc/drl/cert.pem", "/etc/drl/cert.pem"),
    "registry_key": ("/etc/drl/key.pem", "/etc/drl/key.pem"),
    "registry_timeout_s": ("1m", "1m"),
}


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v).replace("'", '"') if isinstance(v, str) else str(v)


def by_flag(f: schema.Field) -> object:
    text, _ = SAMPLES[f.name]
    return up.make_context("up", [f.flag] if text is None else [f.flag, text]).params[f.name]


def test_every_field_has_a_sample():
    assert set(SAMPLES) == {f.name for f in FIELDS}


def test_every_field_has_help_a_flag_and_a_key_each_its_own():
    for f in FIELDS:
        assert f.help.strip() and f.flag.startswith("--") and re.fullmatch(r"[a-z_]+", f.key), f
    for attr in ("name", "flag", "key"):
        values = [getattr(f, attr) for f in FIELDS]
        assert len(values) == len(set(values)), attr


def test_class_options_are_exactly_the_per_class_fields():
    per_class = {f.name for f in FIELDS if f.scope in (CLASS, CLASS_ONLY)}
    assert set(schema.CLASS_OPTIONS) == per_class
    assert set(schema.PER_CLASS_ONLY) == {f.name for f in FIELDS if f.scope == CLASS_ONLY} == {"global_Bps",
                                                                                               "class_specs"}
    for f in FIELDS:       # an etcd class table takes exactly the class keys
        table = {"name": "c", "global": "1mbit", f.key: SAMPLES[f.name][1]}
        if f.per_class:
            assert toml.table_options(table, "etcd")[f.name] == by_flag(f)
        else:
            with pytest.raises(toml.ConfigFileError, match=f"unknown key '{f.key}'"):
                toml.table_options(table, "etcd")


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_a_value_by_flag_and_by_file_key_is_the_same(tmp_path, f):
    path = tmp_path / "drl.toml"
    line = f"{f.key} = {toml_value(SAMPLES[f.name][1])}\n"
    if f.scope == CLASS_ONLY:
        extra = "" if f.name == "global_Bps" else 'global = "1mbit"\n'
        path.write_text(f'[[class]]\nname = "c"\n{extra}{line}')
        got = toml.read(str(path)).classes[0][f.name]
    else:
        path.write_text(f"[agent]\n{line}")
        got = toml.read(str(path)).agent[f.name]
    assert got == by_flag(f)
    if f.scope == CLASS:
        path.write_text(f'[[class]]\nname = "c"\nglobal = "1mbit"\n{line}')
        assert toml.read(str(path)).classes[0][f.name] == got


def test_the_defaults_are_the_flags_given_nothing(monkeypatch):
    for var in [v for v in os.environ if v.startswith("DRL_")]:
        monkeypatch.delenv(var)
    params = up.make_context("up", []).params
    assert params.pop("config") is None
    assert params == schema.defaults()


def test_the_flags_are_generated_from_the_fields_in_order():
    options = [p for p in up.params if isinstance(p, click.Option) and p.name != "config"]
    assert [(p.opts[0], p.name, p.help) for p in options] == [(f.flag, f.name, f.help) for f in FIELDS]
    envvars = {p.name: p.envvar for p in options}
    assert envvars["global_Bps"] == ["DRL_UP_GLOBAL", "DRL_UP_GLOBAL_BPS"] and envvars["iface"] == "DRL_UP_IFACE"


@pytest.mark.parametrize("name, bad, needle", [
    ("global_Bps", "50mbps", "ambiguous"), ("global_Bps", "1e400mbit", "ceiling of 1 Tbit/s"),
    ("interval_s", "0s", "outside 10ms .. 10s"), ("interval_s", "1us", "burns a core"), ("branching", "0", "x>=1"),
    ("ewma", "1", "0<=x<1"), ("allocator", "magic", "'magic' is not one of"), ("gossip_mark", "0", "0x1-0xffffffff"),
    ("client_key", "dst/33/64", "at most 32"), ("sample_probability", "2", "0..1"), ("eta", "fast", "not a valid float"),
])
def test_a_bad_value_is_one_line_by_flag_and_by_file(tmp_path, name, bad, needle):
    f = schema.field(name)
    with pytest.raises(OptionError, match=re.escape(needle)):
        f.parse(bad)
    result = CliRunner().invoke(main, ["up", f.flag, bad])
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2 and len(errors) == 1 and f.flag in errors[0] and needle in errors[0], result.output
    path = tmp_path / "drl.toml"
    if name == "global_Bps":
        path.write_text(f'[[class]]\nname = "c"\nglobal = "{bad}"\n')
    else:
        header = '[[class]]\nname = "c"\nglobal = "1mbit"\n' if f.per_class else "[agent]\n"
        path.write_text(f'{header}{f.key} = "{bad}"\n')
    with pytest.raises(toml.ConfigFileError) as e:
        toml.read(str(path))
    assert "\n" not in str(e.value) and f"drl.toml:{path.read_text().count(chr(10))}:" in str(e.value)
    assert f"{f.key}: " in str(e.value) and needle in str(e.value)


def test_docs_config_lists_the_keys_of_the_model():
    """docs/config.md's "Keys" table: [agent] only, [[class]] only, and class keys [agent] may default."""
    rows = {}
    for line in (ROOT / "docs" / "config.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) == 4 and "`" in cells[1]:
            rows[cells[1].strip()] = set(re.findall(r"`([a-z_]+)`", cells[2]))
    agent_only, class_only, class_opts = rows.values()
    assert agent_only == {f.key for f in FIELDS if f.scope == schema.AGENT}
    assert class_only == {"name"} | {f.key for f in FIELDS if f.scope == CLASS_ONLY}
    assert class_opts == {f.key for f in FIELDS if f.scope == CLASS}
