"""agent/config/load.py: a Config from the model alone, no command line in the way."""
from __future__ import annotations

import pytest

from drl.agent.config.build import ConfigError
from drl.agent.config.load import import_tables, load_config
from drl.agent.config.schema import defaults
from daemon_harness import GOOD, load


def test_the_model_alone_builds_what_the_command_line_builds(tmp_path):
    path = tmp_path / "drl.toml"
    path.write_text(GOOD)
    opts = {**defaults(), "socket_path": str(tmp_path / "s")}
    cfg = load_config(str(path), opts, {"socket_path"}, check_host=False)
    by_cli = load(tmp_path, GOOD)
    assert cfg.classes == by_cli.classes and cfg.peers == by_cli.peers and cfg.node_id == by_cli.node_id
    path.write_text(GOOD.replace('global = "20mbit"', 'global = "30mbit"'))
    assert cfg.reload()[1].global_Bps == 30e6 / 8


def test_drlctl_imports_tables_with_the_agents_defaults_folded_in(tmp_path):
    path = tmp_path / "drl.toml"
    path.write_text(GOOD)
    gold, silver = import_tables(str(path))
    assert gold == {"allocator": "static", "ewma": 0.3, "name": "gold", "global": "50mbit",
                    "match": ["dst=198.51.100.0/24", "dport=443,proto=tcp"]}
    assert silver["allocator"] == "fps" and silver["burst"] == "256KB"
    path.write_text('[[class]]\nname = "x"\nglobal = "1mbit"\nenforce = "shape"\nallocator = "grd"\n')
    with pytest.raises(ConfigError, match=r"drl.toml:1: class 'x': enforce = shape"):
        import_tables(str(path))
    path.write_text('[agent]\niface = "lo"\n')
    with pytest.raises(ConfigError, match="no class"):
        import_tables(str(path))
