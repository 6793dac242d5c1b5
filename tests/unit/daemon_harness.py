"""The daemon without root, for the unit tests: an agent on the in-memory datapath and transport.

    cfg = config(tmp_path, "--allocator", "fps", "--peers", "b@10.0.0.2:7470")
    a = agent(cfg, FakeDatapath())
    a.tick(now)
"""
from __future__ import annotations

import textwrap

from click.core import ParameterSource

from drl.agent.config.build import build_config, class_key
from drl.agent.config.load import load_config
from drl.agent.config.schema import defaults
from drl.agent.gossip.core import CLUSTER, Outgoing
from drl.agent.gossip.memory import MemoryTransport
from drl.agent.gossip.wire import decode
from drl.agent.kernel.fake import CLASS_ID, FakeDatapath, FakeShaper
from drl.agent.service.daemon import Agent
from drl.cli.agent import up

__all__ = ["CLASS_ID", "DEFAULT", "GOOD", "TWO", "FakeDatapath", "FakeShaper", "MemoryTransport", "agent", "config", "file_agent",
           "load", "published", "rules_of", "values"]

DEFAULT = class_key("default")    # its key on the wire


def config(tmp_path, *args):
    opts = up.make_context("up", ["--iface", "lo", "--node-id", "a", "--listen", "10.0.0.1:7470", "--insecure",
                                  "--interval", "1s", "--socket", str(tmp_path / "ctl.sock"),
                                  "--state-dir", str(tmp_path / "state"), *args]).params
    return build_config(opts, check_host=False)


def values(v: dict) -> dict:
    return {key: Outgoing(x) for key, x in v.items()}


def agent(cfg, dp):
    return Agent(cfg, transport=MemoryTransport, datapath=lambda cfg, gossip_port: dp, shaper=FakeShaper)


def published(transport, key=DEFAULT) -> list[float]:
    """The values of class ``key`` this agent put on the wire, oldest first."""
    return [v.value for _, data in transport.sent for v in decode(data, None, CLUSTER).payload.values
            if v.key == key]


TWO = """\
[agent]
iface = "lo"
node_id = "a"
listen = "10.0.0.1:7470"
peers = ["b@10.0.0.2:7470"]
insecure = true
interval = "1s"
peer_timeout = "1h"
allocator = "static"

[[class]]
name = "A"
global = "8mbit"
match = ["dport=5201,proto=tcp"]

[[class]]
name = "B"
global = "4mbit"
match = ["dport=5202,proto=tcp"]
"""


def file_agent(tmp_path, text, dp):
    path = tmp_path / "drl.toml"
    path.write_text(text)
    opts = {**defaults(), "socket_path": str(tmp_path / "ctl.sock"), "state_dir": str(tmp_path / "state")}
    cfg = load_config(str(path), opts, {"socket_path", "state_dir"}, check_host=False)   # the model, no flags
    return agent(cfg, dp), path


def rules_of(dp) -> dict[str, int]:
    return {str(rule): class_id for rule, class_id in dp.rules}


# A config file of three classes, read as drl-agent up --config reads it (load).
GOOD = """\
[agent]
iface = "lo"
node_id = "a"
listen = "10.0.0.1:7470"
peers = ["b@10.0.0.2:7470", "c@10.0.0.3:7470"]
insecure = true
allocator = "static"        # default of every class
ewma = 0.3

[[class]]
name = "gold"
global = "50mbit"
match = ["dst=198.51.100.0/24", "dport=443,proto=tcp"]

[[class]]
name = "silver"
global = "20mbit"
allocator = "fps"
burst = "256KB"
"""


def load(tmp_path, text: str, *flags: str):
    path = tmp_path / "drl.toml"
    path.write_text(textwrap.dedent(text))
    ctx = up.make_context("up", ["--config", str(path), "--socket", str(tmp_path / "s"), *flags])
    explicit = {n for n in ctx.params if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE}
    opts = {k: v for k, v in ctx.params.items() if k != "config"}
    return load_config(str(path), opts, explicit, check_host=False)
