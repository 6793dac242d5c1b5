"""The design's import arrows hold: import-linter's contracts in pyproject.toml.

docs/design.md draws the layers; pyproject.toml's [tool.importlinter] states
them as contracts (the agent's layers, pure allocators, no CLI under agent/,
a simulator without kernel or sockets, a lab without the simulator).  Imports
inside functions count too.  docs/design.md's module table, the one module map,
names every module of agent/.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    run = subprocess.run([exe, "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def test_every_import_contract_is_kept():
    out = lint_imports()
    assert "0 broken" in out and " kept" in out


def test_the_contracts_cover_every_agent_package():
    """A new package under agent/ must be placed in the layers, or nothing checks it."""
    text = (ROOT / "pyproject.toml").read_text()
    packages = sorted(p.parent.name for p in (ROOT / "agent").glob("*/__init__.py"))
    modules = sorted(p.stem for p in (ROOT / "agent").glob("*.py") if p.stem != "__init__")
    missing = [name for name in packages + modules if f'"drl.agent.{name}' not in text
               and f"| drl.agent.{name}" not in text and f"drl.agent.{name} |" not in text]
    assert not missing, f"agent parts in no layer of pyproject.toml: {missing}"


def test_the_design_module_map_names_every_agent_module():
    """docs/design.md's table is the one module map: a module it does not name is one a
    newcomer cannot find."""
    design = (ROOT / "docs" / "design.md").read_text()
    start = design.index("## Modules and the allowed imports")
    named = set(re.findall(r"`([^`]+)`", design[start:design.index("\n## ", start + 1)]))
    missing = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "agent").rglob("*.py"))
               if p.name not in ("__init__.py", "drl_pb2.py")
               and p.stem not in named and p.relative_to(ROOT).as_posix() not in named]
    assert not missing, f"agent modules docs/design.md's module table does not name: {missing}"
