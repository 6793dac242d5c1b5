"""drl's wheel (and its dependencies'), built from a clean copy of a checkout, for hosts
that install offline: the systemd container (lab/nspawn.py) and the Vagrant twin's VMs
(lab/vagrant.py).

    build_wheelhouse(checkout, out)               # drl and every dependency (needs the index)
    build_wheelhouse(checkout, out, deps=False)   # drl alone: the VMs' box has the rest

The copy leaves out what is not the source: a ``build/`` of an earlier build would carry
files the tree no longer has into the wheel.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import LabError

NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", ".ruff_cache", ".vagrant", "results", "out", "sim-out")


def build_wheelhouse(checkout: Path, out: Path, python: str = sys.executable, deps: bool = True) -> list[Path]:
    """``pip wheel`` of a copy of ``checkout`` into ``out``: what an offline host installs
    from (``pip install --no-index --find-links``).  Needs the index for setuptools (the
    build backend) and the dependencies; bcc is Debian's, not a wheel."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="drl-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(checkout, src, ignore=NOT_COPIED)
        res = subprocess.run([python, "-m", "pip", "wheel", "-q", *([] if deps else ["--no-deps"]),
                              "--wheel-dir", str(out), str(src)], capture_output=True, text=True)
    if res.returncode:
        raise LabError("pip wheel failed: " + " | ".join(res.stderr.strip().splitlines()[-3:]))
    return sorted(out.glob("*.whl"))
