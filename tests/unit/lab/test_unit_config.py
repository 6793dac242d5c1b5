"""A VM's drl.toml (lab/agents.py unit_config) makes the agent the command line would: the
shipped unit's ``--config`` file and flags give the same Config as the lab's ``drl-agent up``."""
import dataclasses
import json

import pytest
from click.core import ParameterSource

from drl.agent.config.load import load_config
from drl.cli.agent import up
from drl.lab.agents import unit_config
from drl.lab.vagrant import TOPOLOGIES, VM_KEY

UNIT_FLAGS = ["--socket", "/run/drl/agent.sock", "--state-dir", "/var/lib/drl"]   # systemd/drl-agent.service


def config_of(args: list[str]):
    ctx = up.make_context("up", args)
    opts = dict(ctx.params)
    path = opts.pop("config")
    explicit = {n for n in opts
                if ctx.get_parameter_source(n) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    cfg = load_config(path, opts, explicit, check_host=False)
    return dataclasses.replace(cfg, reload=None, live_classes=None)


SHIPPED = [(path.stem, alloc, host) for path in sorted(TOPOLOGIES.glob("*.json"))
           for alloc, agents in json.loads(path.read_text())["agents"].items() for host in agents]


@pytest.mark.parametrize("name,alloc,host", SHIPPED)
def test_the_units_file_and_flags_make_the_agent_of_the_command_line(tmp_path, name, alloc, host):
    key = tmp_path / "cluster.key"
    key.write_text("ab" * 32 + "\n")
    agent = json.loads((TOPOLOGIES / f"{name}.json").read_text())["agents"][alloc][host]
    argv = [str(key) if a == VM_KEY else "eth0" if a == "{iface}" else a for a in agent["argv"]]
    conf = tmp_path / "drl.toml"
    conf.write_text(agent["config"].replace(VM_KEY, str(key)).replace("{iface}", "eth0"))
    assert config_of(["--config", str(conf), *UNIT_FLAGS]) == config_of([*argv[2:], "--state-dir", "/var/lib/drl"])


def test_a_flag_the_agent_does_not_have_is_refused():
    with pytest.raises(ValueError, match="--no-such"):
        unit_config(["drl-agent", "up", "--iface", "eth0", "--no-such", "1"])
