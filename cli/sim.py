"""drl-sim: the agent's allocators over a simulated network, 10 to 10,000 limiters.

    drl-sim list
    drl-sim run scale --limiters 100 --out out/scale
    drl-sim run gdrl-graphs --out out/gdrl
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from drl.cli.params import require_extra, version_option
from drl.agent.allocators.common import ParameterError
from drl.sim import experiments
from drl.sim.progress import Progress


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def main() -> None:
    """Simulate distributed rate limiting with the agent's own allocator and gossip code.

    Each experiment reproduces a figure of a source paper and writes
    OUT/result.json (numbers, JSON rates in bits/s) and PNG plots.

    \b
    Examples:
      drl-sim list
      drl-sim run scale --limiters 100 --out out/scale
      drl-sim run dqmp-crash --out out/dqmp
    """


@main.command("list")
def list_() -> None:
    """Name and summary of every experiment."""
    for name in experiments.names():
        click.echo(f"{name:12s} {experiments.describe(name)}")


@main.command()
@click.argument("name")
@click.option("--limiters", "-n", type=click.IntRange(min=2), default=None,
              help="Largest number of limiters to simulate (default: the paper's).")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: ./sim-out/NAME).")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed; same seed, same numbers.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def run(name: str, limiters: int | None, out: Path | None, seed: int, quiet: bool) -> None:
    """Run experiment NAME and write OUT/result.json and PNG plots.

    \b
    Example:
      drl-sim run scale --limiters 490 --out out/scale
    """
    require_extra("sim", "numpy", "matplotlib")
    opts = experiments.Options(out=out or Path("sim-out") / name, limiters=limiters, seed=seed,
                               progress=Progress(enabled=not quiet))
    try:
        result = experiments.run(name, opts)
    except (experiments.ExperimentError, ParameterError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    click.echo(f"{name}: {result['wall_s']} s -> {opts.out / 'result.json'}")
