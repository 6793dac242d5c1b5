"""Built-in experiments by name; a path to a file of your own works the same way.

    >>> from drl.lab.registry import builtin, resolve
    >>> sorted(builtin())
    ['baseline', 'bottleneck', 'demand-shift', 'faults', 'flow-join', 'web']
    >>> resolve("baseline").name
    'baseline'

A built-in experiment is just a file in lab/experiments/: drop a new
``NAME.toml`` there and ``drl-lab run NAME`` finds it.
"""
from __future__ import annotations

from pathlib import Path

from .errors import LabError
from .reader import load
from .spec import Experiment

EXPERIMENTS = Path(__file__).with_name("experiments")


def builtin() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXPERIMENTS.glob("*.toml"))}


def resolve(name_or_file: str) -> Experiment:
    """A built-in name, or a path to a TOML experiment file."""
    if name_or_file in builtin():
        return load(builtin()[name_or_file])
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.exists():
        return load(path)
    raise LabError(f"no experiment {name_or_file!r}: not a built-in ({', '.join(builtin())}) nor a file")
