"""`drl-agent up` / `down` and `drlctl status`: every mistake a user can make is one line
and a non-zero exit, found before anything touches the kernel.

No root needed: the capability check is exercised by faking CapEff, and the cases
that must get past it fake root's capabilities and use `lo`, failing inside build_config
(agent.daemon.run is replaced, so nothing is ever attached).
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import drl.agent.kernel.caps
import drl.agent.service.daemon
from drl.cli.agent import main as agent_main
from drl.cli.ctl import main as ctl_main


@pytest.fixture
def as_root(monkeypatch):
    monkeypatch.setattr(drl.agent.kernel.caps, "effective", lambda: (1 << 41) - 1)     # what root's CapEff holds


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "cluster.key"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def started(monkeypatch):
    """agent.daemon.run replaced: the Config it would have run with."""
    seen = []
    monkeypatch.setattr(drl.agent.service.daemon, "run", lambda config: seen.append(config) or 0)
    return seen


def up(*args: str):
    return CliRunner().invoke(agent_main, ["up", *args])


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], result.output


@pytest.mark.parametrize("rate, needle", [("50mbps", "50mbps"), ("-3mbit", "-3mbit"), ("fast", "fast")])
def test_bad_rates_are_usage_errors(rate, needle):
    result = up("--iface", "lo", "--global", rate, "--insecure")
    assert result.exit_code == 2
    one_line_error(result, "--global", needle)


def test_unknown_allocator_is_a_usage_error():
    result = up("--iface", "lo", "--global", "10mbit", "--allocator", "magic", "--insecure")
    assert result.exit_code == 2
    one_line_error(result, "magic")


@pytest.mark.parametrize("held, named", [
    (0, "CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),                     # an ordinary user
    (1 << drl.agent.kernel.caps.CAP_BPF | 1 << drl.agent.kernel.caps.CAP_PERFMON, "CAP_NET_ADMIN"),
])
def test_missing_capabilities_are_refused_first_by_name(monkeypatch, started, held, named):
    monkeypatch.setattr(drl.agent.kernel.caps, "effective", lambda: held)
    result = up("--iface", "drlnope0", "--global", "10mbit", "--insecure")     # a bad iface too: caps come first
    one_line_error(result, f"missing capabilities {named} (", "docs/service.md")
    assert result.exit_code == 1 and started == []


@pytest.mark.parametrize("args, needle", [
    (["--iface", "drlnope0"], "no interface named 'drlnope0'"),
    (["--peers", "10.0.0.2"], "HOST:PORT"),
    (["--peers", "10.0.0.2:99999"], "bad port"),
    (["--peers", "@10.0.0.2:7470"], "empty node id"),
    (["--peers", "10.0.0.2:7470,10.0.0.2:7470"], "listed twice"),
    (["--listen", "::1:7470"], "brackets"),
    (["--allocator", "gdrl", "--peers", "10.0.0.2:7470"], "ID@HOST:PORT"),
    (["--allocator", "lease", "--peers", "b@10.0.0.2:7470", "--lease-servers", "zz"], "not members"),
    (["--allocator", "gdrl", "--peers", "b@10.0.0.2:7470", "--eta", "5"], "eta"),
    (["--class", "dport=99999"], "dport"),
    (["--class", "colour=red"], "unknown key"),
    (["--node-id", "b", "--peers", "b@10.0.0.2:7470"], "node id"),
])
def test_config_mistakes_are_one_line_and_exit_1(as_root, started, args, needle):
    argv = ["--iface", "lo", "--global", "10mbit", "--insecure", *args]
    if "--iface" in args:
        argv = argv[2:]
    result = up(*argv)
    one_line_error(result, needle)
    assert result.exit_code == 1 and started == []


def test_a_key_or_insecure_is_required_with_peers_but_not_alone(as_root, started):
    one_line_error(up("--iface", "lo", "--global", "10mbit", "--peers", "10.0.0.2:7470"), "--key-file", "--insecure")
    assert started == []
    assert up("--iface", "lo", "--global", "10mbit").exit_code == 0      # the design card's own command
    assert started[0].standalone and started[0].key is None


def test_environment_variables_are_named_after_the_long_flags(as_root, started, tmp_path, monkeypatch):
    """docs/config.md: DRL_UP_* named after the flag (click named them after the parameter:
    DRL_UP_GLOBAL_BPS, which still works); drlctl --help: DRL_SOCKET."""
    monkeypatch.setenv("DRL_UP_GLOBAL", "7mbit")
    monkeypatch.setenv("DRL_UP_SOCKET", str(tmp_path / "a.sock"))
    monkeypatch.setenv("DRL_UP_INTERVAL", "50ms")
    assert up("--iface", "lo").exit_code == 0
    cfg = started[0]
    assert cfg.classes[0].global_Bps == 875_000 and cfg.socket_path == str(tmp_path / "a.sock")
    assert cfg.interval_s == 0.05
    monkeypatch.delenv("DRL_UP_GLOBAL")
    monkeypatch.setenv("DRL_UP_GLOBAL_BPS", "9mbit")
    assert up("--iface", "lo").exit_code == 0 and started[1].classes[0].global_Bps == 1_125_000
    monkeypatch.setenv("DRL_SOCKET", "/nonexistent/env.sock")
    one_line_error(CliRunner().invoke(ctl_main, ["status"]), "/nonexistent/env.sock")


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("", "is empty"),
    ("short", "at least 16"),
    (IsADirectoryError, "is a directory"),   # refused by the option itself, even for root
])
def test_bad_key_files(as_root, started, tmp_path, content, needle):
    path = tmp_path / "k"
    if content is IsADirectoryError:
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    result = up("--iface", "lo", "--global", "10mbit", "--key-file", str(path))
    one_line_error(result, needle)
    assert started == []


def test_a_valid_command_line_becomes_a_config_in_internal_units(as_root, started, key_file):
    result = up("--iface", "lo", "--global", "50mbit", "--allocator", "grd", "--node-id", "a",
                "--listen", "127.0.0.1:7470", "--peers", "b@127.0.0.2:7470,127.0.0.3:7470",
                "--key-file", key_file, "--interval", "50ms")
    assert result.exit_code == 0, result.output
    (cfg,) = started
    (default,) = cfg.classes
    assert default.name == "default" and default.global_Bps == 50e6 / 8 and cfg.interval_s == 0.05
    assert default.safe_Bps is None                           # global / N, of the limit in force
    assert cfg.peer_timeout_s == pytest.approx(0.05 * 3)      # full mesh: 3 missed intervals
    assert [(p.node_id, p.addr) for p in cfg.peers] == [("b", ("127.0.0.2", 7470)), (None, ("127.0.0.3", 7470))]
    assert cfg.sample_probability == 1.0 and default.allocator.name == "grd"
    assert cfg.key == b"0123456789abcdef0123456789abcdef"


def test_fps_samples_flows_at_its_own_default(as_root, started):
    assert up("--iface", "lo", "--global", "1gbit", "--insecure").exit_code == 0
    assert started[0].sample_probability == 0.1 and started[0].classes[0].allocator.name == "fps"


@pytest.mark.parametrize("cli, args", [(agent_main, ["down", "--socket", "/nonexistent/drl.sock"]),
                                       (ctl_main, ["--socket", "/nonexistent/drl.sock", "status"])])
def test_clients_without_an_agent_say_so_in_one_line(cli, args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    one_line_error(result, "/nonexistent/drl.sock")


def test_drlctl_classes_is_a_table_with_one_row_per_class():
    from drl.cli.ctl import render_classes
    row = {"name": "gold", "allocator": "fps", "global_limit_bps": 5e7, "effective_limit_bps": 5e7,
           "local_limit_bps": 2.5e7, "demand_bps": 3e7, "drop_probability": 0.0, "passed_bytes": 1.5e9,
           "dropped_bytes": 0, "limit_version": 2}
    lines = render_classes([row, {**row, "name": "silver-long-name"}]).splitlines()
    assert lines[0].split()[:3] == ["CLASS", "ALLOCATOR", "GLOBAL"] and len(lines) == 3
    assert lines[1].startswith("gold ") and "50 Mbit/s" in lines[1] and "1.5 GB" in lines[1]
    assert lines[1].index("fps") == lines[2].index("fps")           # aligned columns
    shaped = render_classes([{**row, "enforce": "shape", "shaped": True}, {**row, "enforce": "shape", "shaped": False},
                             {**row, "enforce": "police", "shaped": False}]).splitlines()
    assert [line.split()[-1] for line in shaped] == ["ENFORCE", "shape", "shape!", "police"]


def test_drlctl_set_checks_the_rate_before_asking_the_agent():
    result = CliRunner().invoke(ctl_main, ["--socket", "/nonexistent/drl.sock", "set", "gold", "--global", "5mbps"])
    assert result.exit_code == 2 and "ambiguous" in result.output
    result = CliRunner().invoke(ctl_main, ["--socket", "/nonexistent/drl.sock", "set", "gold", "--global", "5mbit"])
    one_line_error(result, "/nonexistent/drl.sock")
