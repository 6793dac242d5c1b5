"""The named reproductions behind ``drl-sim run NAME``, and what every one writes.

    result = run("scale", Options(out=Path("out/scale"), limiters=100))
    # out/scale/result.json  and  out/scale/*.png

An experiment is a module in sim/ with ``SUMMARY``, ``DEFAULT_LIMITERS`` and
``run(opts) -> dict`` (the JSON body: parameters, rows, and the paper's claims
with what we measured); this registry maps names to them, importing on use.
"""
from __future__ import annotations

import importlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from .progress import Progress

_REGISTRY = {
    "scale": "drl.sim.scale",              # [Raghavan07] Fig. 8
    "gdrl-graphs": "drl.sim.gdrl_graphs",  # [Stanojevic09] Fig. 7
    "dqmp-crash": "drl.sim.dqmp_runs",     # [Behl12] Fig. 10
    "dqmp-1000": "drl.sim.dqmp_runs",      # [Behl12] §5.2, 1,000 nodes
    "churn": "drl.sim.churn",              # joins and leaves at 1,000 limiters
    "envelope": "drl.sim.envelope",        # G x T + D while 1,000 limiters go busy, idle, busy
}


class ExperimentError(Exception):
    """A request the experiments cannot honour; the message is one line for the CLI."""


@dataclass
class Options:
    out: Path
    limiters: int | None = None      # the largest N to simulate (each experiment has a default)
    seed: int = 1
    progress: Progress = field(default_factory=lambda: Progress(enabled=False))
    name: str = ""                   # set by run(): modules serving two names branch on it


def sizes(ladder: tuple[int, ...], limit: int) -> list[int]:
    """The Ns an experiment runs: its ladder's sizes up to ``limit`` (--limiters), and ``limit``."""
    return sorted({n for n in ladder if n <= limit} | {limit})


def names() -> list[str]:
    return list(_REGISTRY)


def describe(name: str) -> str:
    return _module(name).SUMMARY[name]


def _module(name: str):
    if name not in _REGISTRY:
        raise ExperimentError(f"unknown experiment {name!r} (choose from {', '.join(_REGISTRY)})")
    return importlib.import_module(_REGISTRY[name])


def run(name: str, opts: Options) -> dict:
    """Run experiment ``name``; writes ``opts.out/result.json`` and its PNGs."""
    module = _module(name)
    least = getattr(module, "MIN_LIMITERS", 2)
    if opts.limiters is not None and opts.limiters < least:
        raise ExperimentError(f"--limiters must be at least {least} for {name}, got {opts.limiters}")
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExperimentError(f"cannot create output directory {opts.out}: {e.strerror}") from None
    opts.name = name
    started = time.monotonic()
    body = module.run(opts)
    result = {"experiment": name, "seed": opts.seed,
              "limiters": opts.limiters or module.DEFAULT_LIMITERS[name],
              "wall_s": round(time.monotonic() - started, 1),
              "python": platform.python_version(), **body}
    (opts.out / "result.json").write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    return result


def _jsonable(x):
    """numpy scalars and arrays in results."""
    return x.tolist() if hasattr(x, "tolist") else str(x)
