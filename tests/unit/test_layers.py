"""The design's import arrows (docs/design.md), read from the source with ast.

Data flows one way: the datapath knows nothing of allocation or gossip,
allocators are pure (model + units + each other + stdlib), the model imports
nothing of the agent but its constants, the simulator never touches the kernel
or a socket, and the lab does not depend on the simulator.  Imports inside
functions count too.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = sys.stdlib_module_names

# (files, forbidden module prefixes, why)
FORBIDDEN = [
    ("agent/datapath.py",
     ("drl.agent.allocators", "drl.agent.gossip", "drl.agent.transport", "drl.agent.peers", "drl.agent.membership",
      "drl.agent.estimator", "drl.agent.daemon"),
     "the datapath sits below allocation and gossip"),
    ("sim/*.py", ("drl.agent.datapath", "drl.agent.daemon", "drl.agent.transport", "bcc"),
     "the simulator runs without the kernel or sockets"),
    ("lab/**/*.py", ("drl.sim",), "the lab does not depend on the simulator"),
]
# (files, the only first-party module prefixes allowed besides the stdlib, why)
ALLOWED = [
    ("agent/allocators/*.py", ("drl.agent.model", "drl.agent.units", "drl.agent.allocators"), "allocators are pure"),
    ("agent/model.py", ("drl.agent.abi", "drl.agent.units"), "the model is importable by every layer"),
]


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every module ``path`` imports, absolute, with its line; ``from pkg import mod`` names pkg.mod."""
    package = ".".join(("drl", *path.relative_to(root).with_suffix("").parts[:-1]))
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                file = root / sub.removeprefix("drl.").replace(".", "/")
                is_module = file.with_suffix(".py").exists() or file.is_dir()
                out.append((sub if is_module else module, node.lineno))
    return out


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for pattern, banned, why in FORBIDDEN:
        for path in sorted(root.glob(pattern)):
            found += [f"{path.relative_to(root)}:{line} imports {module} ({why})"
                      for module, line in imports(path, root) if _under(module, banned)]
    for pattern, allowed, why in ALLOWED:
        for path in sorted(root.glob(pattern)):
            found += [f"{path.relative_to(root)}:{line} imports {module} ({why}: only the stdlib and "
                      f"{', '.join(allowed)})"
                      for module, line in imports(path, root)
                      if module.split(".")[0] not in STDLIB and not _under(module, allowed)]
    return found


def test_the_import_arrows_hold():
    found = violations()
    assert not found, "\n".join(found)


def test_every_rule_matches_files():
    """A moved or renamed directory must not make a rule vacuous."""
    for pattern, *_ in FORBIDDEN + ALLOWED:
        assert list(ROOT.glob(pattern)), pattern


@pytest.mark.parametrize("path,source,expected", [
    ("agent/datapath.py", "from drl.agent.gossip import GossipCore\n",
     "agent/datapath.py:1 imports drl.agent.gossip (the datapath sits below"),
    ("agent/datapath.py", "def f():\n    from drl.agent import membership\n",
     "agent/datapath.py:2 imports drl.agent.membership"),
    ("agent/allocators/x.py", "from ..wire import encode\n",
     "agent/allocators/x.py:1 imports drl.agent.wire (allocators are pure"),
    ("agent/allocators/x.py", "import socket, numpy\n", "agent/allocators/x.py:1 imports numpy"),
    ("agent/model.py", "from drl.agent.allocators import create\n", "agent/model.py:1 imports drl.agent.allocators"),
    ("sim/x.py", "from bcc import BPF\n", "sim/x.py:1 imports bcc"),
    ("lab/experiments/x.py", "import drl.sim.engine\n", "lab/experiments/x.py:1 imports drl.sim.engine"),
])
def test_a_forbidden_import_is_named(tmp_path, path, source, expected):
    for package in ("agent/allocators", "sim", "lab/experiments"):
        (tmp_path / package).mkdir(parents=True)
    for module in ("agent/gossip.py", "agent/membership.py", "agent/wire.py", "agent/allocators/__init__.py"):
        (tmp_path / module).write_text("")
    (tmp_path / path).write_text(source)
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_no_two_test_files_share_a_name():
    """pytest imports tests/unit and tests/kernel by basename: a twin breaks collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_first_party_code_imports_through_the_drl_namespace():
    """A bare `agent.x` import runs from a checkout (the repository root is on sys.path) but
    loads a second copy of the module next to drl.agent.x, and fails in an installed wheel."""
    bare = {"agent", "cli", "lab", "sim", "bpf", "bench"}
    in_text = re.compile(r"(?<![\w.])(from|import) (agent|cli|lab|sim)\.")     # doctests, python -c strings
    paths = [path for top in ("agent", "cli", "lab", "sim", "bench", "tests") for path in sorted((ROOT / top).rglob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in paths for module, line in imports(path) if module.split(".")[0] in bare]
    found += [f"{path.relative_to(ROOT)}:{n} {text.strip()}" for path in paths
              for n, text in enumerate(path.read_text().splitlines(), 1) if in_text.search(text)]
    assert not found, "\n".join(found)
