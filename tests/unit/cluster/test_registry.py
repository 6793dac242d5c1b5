"""The registry's parsing, options and layout, without an etcd (tests/kernel/test_registry_etcd.py has one)."""
from __future__ import annotations

import json
import textwrap
import time

import pytest
from click.core import ParameterSource
from click.testing import CliRunner

from drl.agent.config.build import ConfigError
from drl.agent.cluster.etcd import prefix_end
from drl.agent.cluster.registry import (Member, Registry, RegistryConfig, RegistryError, decode, parse_registry,
                                registry_config)
from drl.cli.agent import load_config, up
from drl.agent.config.toml import ConfigFileError, table_options
from drl.cli.ctl import main as ctl_main


@pytest.mark.parametrize("text,endpoints", [
    ("etcd://10.0.0.9:2379", (("10.0.0.9", 2379),)),
    ("etcd://a:2379, b:2379,[fd00::9]:2379", (("a", 2379), ("b", 2379), ("fd00::9", 2379))),
    ("etcd://a:2379,etcd://b:2379", (("a", 2379), ("b", 2379))),        # a file's list, each with its scheme
])
def test_registry_urls_parse(text, endpoints):
    assert parse_registry(text) == endpoints


@pytest.mark.parametrize("text,what", [
    ("10.0.0.9:2379", "expected etcd://HOST:PORT"),
    ("http://10.0.0.9:2379", "expected etcd://HOST:PORT"),
    ("etcd://", "empty endpoint"),
    ("etcd://a:2379,", "empty endpoint"),
    ("etcd://a", "expected HOST:PORT"),
    ("etcd://fd00::9:2379", "IPv6 address needs brackets"),
    ("etcd://a:99999", "bad port"),
    ("etcd://a:1,a:1", "listed twice: a:1"),
])
def test_bad_registry_urls_are_one_line(text, what):
    with pytest.raises(RegistryError, match=what) as e:
        parse_registry(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--registry")


@pytest.mark.parametrize("cluster,kw,what", [
    (None, {}, "--registry needs --cluster NAME"),
    ("a/b", {}, "--cluster 'a/b'"),
    ("..", {}, "--cluster '..': .*not dots alone"),
    ("prod", {"cert": "c.pem"}, "--registry-cert and --registry-key go together"),
    ("prod", {"ca": "/nonexistent/ca.pem"}, "cannot load the registry's TLS files"),
])
def test_registry_options_are_checked(cluster, kw, what):
    with pytest.raises(RegistryError, match=what):
        registry_config("etcd://127.0.0.1:2379", cluster, **kw)


def load(tmp_path, *flags: str, text: str | None = None):
    argv = ["--socket", str(tmp_path / "s"), "--iface", "lo", "--global", "10mbit", "--node-id", "a", *flags]
    if text is not None:
        (tmp_path / "drl.toml").write_text(textwrap.dedent(text))
        argv += ["--config", str(tmp_path / "drl.toml")]
    ctx = up.make_context("up", argv)
    explicit = {n for n in ctx.params if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE}
    opts = {k: v for k, v in ctx.params.items() if k != "config"}
    return load_config(ctx.params["config"], opts, explicit, check_host=False)


def test_a_registry_replaces_peers_and_needs_a_key(tmp_path):
    cfg = load(tmp_path, "--registry", "etcd://10.0.0.9:2379", "--cluster", "prod", "--listen", "10.0.0.1:7470",
               "--insecure", "--allocator", "gdrl")
    assert cfg.registry == RegistryConfig((("10.0.0.9", 2379),), "prod")
    assert cfg.peers == () and not cfg.standalone
    with pytest.raises(ConfigError, match="gossip needs a cluster key"):
        load(tmp_path, "--registry", "etcd://10.0.0.9:2379", "--cluster", "prod", "--listen", "10.0.0.1:7470")
    assert load(tmp_path).registry is None and load(tmp_path).standalone


def test_the_config_file_takes_the_registry_keys(tmp_path):
    cfg = load(tmp_path, text="""
        [agent]
        registry = ["etcd://10.0.0.9:2379", "10.0.0.10:2379"]
        cluster = "prod"
        listen = "10.0.0.1:7470"
        insecure = true
    """)
    assert cfg.registry.endpoints == (("10.0.0.9", 2379), ("10.0.0.10", 2379)) and cfg.registry.cluster == "prod"


@pytest.mark.parametrize("flags,what", [
    (["--cluster", "prod"], "--cluster needs --registry"),
    (["--registry", "etcd://10.0.0.9:2379"], "--registry needs --cluster"),
    (["--registry", "etcd://10.0.0.9:2379", "--cluster", "prod"], "--listen must be the address"),
    (["--registry", "etcd://x", "--cluster", "p", "--listen", "10.0.0.1:7470"], "--registry: expected HOST:PORT"),
    (["--registry", "etcd://x:1", "--cluster", "p", "--listen", "10.0.0.1:7470", "--node-id", "a/b"], "no '/'"),
])
def test_bad_registry_options_are_one_line(tmp_path, flags, what):
    with pytest.raises(ConfigError, match=what):
        load(tmp_path, "--insecure", *flags)


def test_the_layout_decodes_members_and_classes_and_names_bad_keys():
    p = "/drl/prod/"
    members, classes, bad, genesis, deleted = decode(p, {
        p + "members/a": b'{"addr": "10.0.0.1:7470", "incarnation": 3}',
        p + "members/b": b'{"addr": "[fd00::2]:7470"}',
        p + "members/d": b'{"addr": "10.0.0.4:7470", "left": true}',
        p + "genesis/gold": b'{"members": ["a", "b"]}',
        p + "members/c": b"not json",
        p + "classes/gold": json.dumps({"name": "gold", "global": "50mbit"}).encode(),
        p + "classes/silver": json.dumps({"name": "gold", "global": "1mbit"}).encode(),   # name != key
        p + "other/x": b"{}",
        p + "deleted/bronze": b"{}",                # a tombstone: drlctl class delete
    })
    assert members == {"a": Member("a", ("10.0.0.1", 7470), 3), "b": Member("b", ("fd00::2", 7470)),
                       "d": Member("d", ("10.0.0.4", 7470), left=True)}
    assert genesis == {"gold": ("a", "b")}
    assert classes == {"gold": {"name": "gold", "global": "50mbit"}}
    assert bad == (p + "classes/silver", p + "members/c", p + "other/x")
    assert deleted == {"bronze"}


def test_a_class_table_from_etcd_is_checked_like_the_file():
    origin = "etcd /drl/prod/classes/gold"
    opts = table_options({"name": "gold", "global": "50mbit", "match": ["dport=80"]}, origin)
    assert opts == {"name": "gold", "global_Bps": 50e6 / 8, "class_specs": ("dport=80",)}
    with pytest.raises(ConfigFileError, match=f"^{origin}: class 'gold': global: unknown rate unit"):
        table_options({"name": "gold", "global": "50mbot"}, origin)
    with pytest.raises(ConfigFileError, match=f"^{origin}: class 'gold': unknown key 'iface'"):
        table_options({"name": "gold", "global": "50mbit", "iface": "eth0"}, origin)


def test_prefix_end_covers_exactly_the_prefix():
    assert prefix_end("/drl/prod/") == "/drl/prod0"


def test_an_unreachable_etcd_is_reported_not_raised():
    """Port 1 on loopback refuses at once: start() returns, view() says why, close() is quick."""
    reg = Registry(RegistryConfig((("127.0.0.1", 1),), "t", ttl_s=1), "a", ("127.0.0.1", 7470), 1)
    assert not reg.view().reachable and reg.view().members == {}
    reg.start()
    reg.put_class({"name": "gold", "global": "1mbit"})      # kept pending, no exception
    with pytest.raises(RegistryError, match="class name"):
        reg.put_class({"name": "a/b"})
    for _ in range(100):
        if "connection refused" in reg.view().error:
            break
        time.sleep(0.02)
    assert "connection refused" in reg.view().error and not reg.view().reachable
    reg.close()


def test_import_refuses_a_bad_file_with_its_line(tmp_path):
    path = tmp_path / "drl.toml"
    path.write_text('[[class]]\nname = "gold"\nglobal = "50mbot"\n')
    result = CliRunner().invoke(ctl_main, ["import", str(path), "--registry", "etcd://127.0.0.1:1", "--cluster", "t"])
    assert result.exit_code == 1 and f"{path}:3: class 'gold': global: unknown rate unit" in result.output
    assert "Traceback" not in result.output


def test_import_refuses_rules_the_datapath_cannot_hold_before_it_writes(tmp_path):
    """9 port-only classes share the prefix "any", which holds 8 rules: every agent would refuse
    them, so import does too, before it asks etcd (none listens at :1)."""
    path = tmp_path / "drl.toml"
    path.write_text("".join(f'[[class]]\nname = "c{p}"\nglobal = "1mbit"\nmatch = ["dport={p + 1}"]\n' for p in range(9)))
    result = CliRunner().invoke(ctl_main, ["import", str(path), "--registry", "etcd://127.0.0.1:1", "--cluster", "t"])
    assert result.exit_code == 1 and "9 rules" in result.output and "at most 8" in result.output, result.output
    assert "etcd" not in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_import_of_an_unreachable_etcd_is_one_line(tmp_path):
    path = tmp_path / "drl.toml"
    path.write_text('[[class]]\nname = "gold"\nglobal = "50mbit"\n')
    result = CliRunner().invoke(ctl_main, ["import", str(path), "--registry", "etcd://127.0.0.1:1", "--cluster", "t"])
    assert result.exit_code == 1 and "etcd unreachable: http://127.0.0.1:1: connection refused" in result.output


def test_an_etcd_error_reply_is_its_message_not_a_dict():
    """A watch's error is a JSON object; its repr went into the registry line and status."""
    from drl.agent.cluster.etcd import _message
    assert _message(b'{"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader"}}') \
        == "etcdserver: no leader"
    assert _message(b'{"error": "etcdserver: request timed out", "code": 14}') == "etcdserver: request timed out"
    assert _message(b"<html>busy</html>") == "<html>busy</html>"
