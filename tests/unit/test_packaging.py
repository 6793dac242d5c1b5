"""The installed distribution: one `drl` namespace, --version everywhere, extras said in one line."""
from __future__ import annotations

import collections
import importlib.metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from drl.cli import agent, ctl, lab, sim
from drl.cli.params import require_extra


@pytest.mark.parametrize("cli,prog", [(agent.main, "drl-agent"), (ctl.main, "drlctl"),
                                      (lab.main, "drl-lab"), (sim.main, "drl-sim")])
def test_every_cli_has_version(cli, prog):
    out = CliRunner().invoke(cli, ["--version"], prog_name=prog)
    assert out.exit_code == 0
    assert out.output.strip() == f"{prog} {importlib.metadata.version('drl')}"


def test_a_missing_extra_is_one_line_naming_the_extra():
    with pytest.raises(click.ClickException, match=r"needs no_such_module_x: pip install 'drl\[sim\]'"):
        require_extra("sim", "json", "no_such_module_x")
    require_extra("sim", "json")


def test_the_agent_needs_no_lab_or_sim_dependency():
    requires = importlib.metadata.requires("drl")
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if r.split(">")[0].split("<")[0].split("=")[0].strip() in ("numpy", "matplotlib")]


def test_every_test_module_has_its_own_basename():
    """The tests have no __init__.py, so pytest imports each by its basename: two files of one
    name in two folders stop the whole run at collection ("import file mismatch")."""
    names = collections.Counter(p.name for p in (Path(__file__).resolve().parents[1]).rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]
