"""The design's import arrows hold: import-linter's contracts in pyproject.toml.

docs/design.md draws the layers; pyproject.toml's [tool.importlinter] states
them as contracts (the agent's layers, pure allocators, no CLI under agent/,
a simulator without kernel or sockets, a lab without the simulator).  Imports
inside functions count too.
"""
from __future__ import annotations

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
