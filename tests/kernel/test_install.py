"""A non-editable install works: the wheel, in a fresh venv outside the checkout, limits one host.

The module builds the wheel once from a copy of the working tree
(lab/wheels.py: no ``build/`` is left in the checkout and no stale file there
reaches the wheel), makes a venv from Debian's /usr/bin/python3 with
``--system-site-packages`` (bcc comes from python3-bpfcc) and installs the
wheel into it with no extra.  Every command runs from a directory outside the
checkout with PYTHONPATH unset, so nothing can import the source tree; the
agent then compiles the ``drl/bpf/limiter.c`` it finds in site-packages.

pip fetches the dependencies the system lacks (click, protobuf ...) through
its cache; the whole module takes ~20 s.

Run: sudo .venv/bin/python -m pytest tests/kernel/test_install.py
"""
from __future__ import annotations

import email.parser
import os
import re
import subprocess
import time
import tomllib
import types
import zipfile
from pathlib import Path

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent
from drl.lab.measure import tc_show, tcp_rate_at_sink
from drl.lab.metrics import within
from drl.lab.wheels import build_wheelhouse

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"          # Debian's, the one python3-bpfcc installs bcc for
SCRIPTS = ("drl-agent", "drlctl", "drl-lab", "drl-sim")


def clean_env() -> dict[str, str]:
    """This process's environment without anything that would point Python at the checkout
    or at the test runner's venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return env


def run(argv: list, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=clean_env(), capture_output=True, text=True, **kw)


def must(argv: list, cwd: Path, timeout: float = 300) -> str:
    out = run(argv, cwd, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, argv))} exited {out.returncode}:\n{out.stderr[-2000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    """The built wheel and a fresh venv holding it (no extras): ``wheel``, ``bin``, ``site``, ``python``, ``cwd``."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs Debian's {SYSTEM_PYTHON}")
    top = tmp_path_factory.mktemp("install")
    assert not top.resolve().is_relative_to(ROOT), top
    wheels, venv = top / "wheels", top / "venv"
    (wheel,) = build_wheelhouse(ROOT, wheels, deps=False)
    elsewhere = top / "elsewhere"          # an empty working directory: nothing to import from
    elsewhere.mkdir()
    must([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv], top)
    python = venv / "bin" / "python"
    must([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel], top)
    site = Path(must([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], top).strip())
    return types.SimpleNamespace(wheel=wheel, bin=venv / "bin", site=site, python=python, cwd=elsewhere)


def test_the_wheel_carries_the_bpf_sources_and_the_schema(install):
    names = set(zipfile.ZipFile(install.wheel).namelist())
    for path in ("drl/bpf/limiter.c", "drl/bpf/limiter.h", "drl/agent/gossip/drl.proto", "drl/agent/gossip/drl_pb2.py"):
        assert path in names, path
    assert not any(n.startswith(("tests/", "drl/tests/", "bench/", "vagrant/")) for n in names), sorted(names)


def test_the_core_install_requires_neither_numpy_nor_matplotlib(install):
    with zipfile.ZipFile(install.wheel) as whl:
        (meta,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        requires = email.parser.Parser().parsestr(whl.read(meta).decode()).get_all("Requires-Dist")
    core = {re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower() for r in requires if "extra ==" not in r}
    assert core and not core & {"numpy", "matplotlib"}, core
    assert not (install.site / "numpy").exists() and not (install.site / "matplotlib").exists()


def test_the_installed_package_is_imported_from_the_venv_not_the_checkout(install):
    where = must([install.python, "-c", "import drl.agent, drl.cli, drl.bpf; "
                                        "print(drl.agent.__file__); print(list(drl.bpf.__path__)[0])"], install.cwd)
    agent_init, bpf_dir = (Path(line) for line in where.splitlines())
    assert agent_init.is_relative_to(install.site), agent_init
    assert (bpf_dir / "limiter.c").is_file() and bpf_dir.is_relative_to(install.site), bpf_dir


def test_every_script_reports_the_pyproject_version(install):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for script in SCRIPTS:
        assert must([install.bin / script, "--version"], install.cwd).strip() == f"{script} {version}"


def test_drl_sim_without_its_extra_says_how_to_install_it(install):
    has_numpy = run([install.python, "-c", "import numpy"], install.cwd).returncode == 0
    if has_numpy:
        pytest.skip("numpy is installed system-wide, so the venv sees it; the metadata test covers the core")
    out = run([install.bin / "drl-sim", "run", "scale", "--out", install.cwd / "sim"], install.cwd, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    (line,) = out.stderr.strip().splitlines()
    assert "numpy" in line and "pip install 'drl[sim]'" in line, line


def test_the_installed_agent_limits_one_host(install, net, tmp_path, monkeypatch):
    """README's first command, run by the installed drl-agent: 10 Mbit/s on h1's egress
    (as tests/kernel/test_agent_classes.py's lone agent, from the checkout)."""
    monkeypatch.chdir(install.cwd)              # the agent inherits cwd and environment
    monkeypatch.delenv("PYTHONPATH", raising=False)
    h1, h2 = net.hosts
    log, sock = tmp_path / "agent.log", str(tmp_path / "a.sock")
    proc = h1.popen(str(install.bin / "drl-agent"), "up", "--iface", "eth0", "--global", "10mbit",
                    "--socket", sock, "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, sock, proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    st = run([install.bin / "drlctl", "--socket", sock, "status", "--json"], install.cwd, timeout=30)
    assert st.returncode == 0 and '"standalone": true' in st.stdout, st
    rate = tcp_rate_at_sink(h1, h2, seconds=10, streams=4, settle_s=3, measure_s=5)
    assert within(rate, 10e6, 0.05), rate
    assert agent.kill(15) == 0
    assert "clsact" not in tc_show(h1, "qdisc")
