"""drl-lab: the paper's experiments on network namespaces, one command each.

Examples:

    drl-lab list
    drl-lab demo
    drl-lab run baseline --duration 20s --repeat 5 --out results/baseline
    drl-lab run my-topology.toml --allocator fps --allocator ctb
    drl-lab up baseline --on vagrant && drl-lab ssh l1 -- sudo drlctl status && drl-lab down
    drl-lab clean
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from drl.agent.allocators import names as allocator_names
from drl.agent.units import format_rate
from drl.cli.params import DURATION, envvars_by_flag, require_extra, version_option
from drl.lab.errors import LabError

DEMO_PREFERENCE = ("fps", "grd", "gdrl", "static")  # the best distributed allocator this build has


@click.group(context_settings={"auto_envvar_prefix": "DRL_LAB", "help_option_names": ["-h", "--help"]})
@version_option
def main() -> None:
    """Run distributed-rate-limiting experiments on network namespaces (needs root)."""


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM tears the run down exactly like Ctrl-C


def _plain_signals_in_child() -> None:
    """A fork of the lab (pyroute2's NetNS forks a helper, then stops it with
    SIGTERM) must die of SIGTERM/SIGINT, not raise KeyboardInterrupt: that
    would run the lab's teardown in the child and kill the live run's agents
    and receivers (seen once in CI as a run delivering 0 bytes)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


os.register_at_fork(after_in_child=_plain_signals_in_child)


def _guarded(fn, *args, **kw):
    """Run fn with teardown on Ctrl-C/SIGTERM and one-line errors."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return fn(*args, **kw)
    except LabError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        click.echo("interrupted: the run's namespaces and processes were removed", err=True)
        sys.exit(130)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@main.command()
@click.argument("name_or_file")
@click.option("--allocator", "allocators", multiple=True, metavar="A",
              help="Allocator to run (repeatable) [default: the experiment's list].")
@click.option("--duration", type=DURATION, help="Squeeze the whole schedule into this long, e.g. 20s.")
@click.option("--repeat", type=click.IntRange(min=1), help="Runs per allocator [default: the file's].")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Output directory [default: results/NAME].")
@click.option("--on", "on", type=click.Choice(["netns", "vagrant"]), default="netns", show_default=True,
              help="Where: network namespaces, or VMs of the Vagrant twin on libvirt (vagrant/README.md).")
def run(name_or_file: str, allocators: tuple[str, ...], duration: float | None, repeat: int | None, out: Path | None,
        on: str) -> None:
    """Run a built-in experiment or an experiment file; writes DIR/result.json and PNG plots.

    \b
    Examples:
      drl-lab run baseline
      drl-lab run baseline --allocator fps --allocator ctb --duration 20s --repeat 5
      drl-lab run ./mine.toml --out /tmp/mine
      drl-lab run baseline --on vagrant --allocator fps --duration 30s
    """
    require_extra("lab", "numpy", "matplotlib")
    from drl.lab.registry import resolve
    from drl.lab.runner import run_experiment

    def go():
        exp = resolve(name_or_file)
        if duration:
            exp = exp.scaled(duration)
        if on == "vagrant":   # one run per allocator: each boots its VMs
            runs = repeat or exp.repeat
            if exp.matrix:
                raise click.UsageError(f"{exp.name} is a [matrix] of cells, each its own set of hosts: "
                                       "run it with --on netns")
            if runs > 1:
                raise click.UsageError(f"--on vagrant runs each allocator once (each run boots its VMs), "
                                       f"not {runs} times: pass --repeat 1 and run it again")
            from drl.lab.vagrant import run_on_vagrant
            summary = run_on_vagrant(exp, out or Path("results") / exp.name, list(allocators) or None, _progress)
        else:
            summary = run_experiment(exp, out or Path("results") / exp.name, list(allocators) or None, repeat,
                                     _progress)
        click.echo(render_matrix(summary) if "matrix" in summary else render(summary))
        if any(r.get("faults") for r in summary["runs"]):
            click.echo("\n" + render_faults(summary))
        if any(r.get("attacks") for r in summary["runs"]):
            click.echo("\n" + render_attacks(summary))
        click.echo(f"\nwrote {out or Path('results') / exp.name}/result.json and plots")
        failed = failed_checks(summary)
        if failed:
            click.echo(f"{len(failed)} check(s) failed: " + "; ".join(failed), err=True)
            sys.exit(1)
    _guarded(go)


TWIN_DIR_OPTION = click.option(
    "--twin-dir", type=click.Path(file_okay=False, path_type=Path), default="/var/lib/drl-lab/twin",
    show_default=True, envvar="DRL_LAB_TWIN_DIR", help="Where the twin's VMs, libvirtd and state live.")


@main.command()
@click.argument("name_or_file")
@click.option("--on", "on", type=click.Choice(["vagrant"]), default="vagrant", show_default=True,
              help="Where: VMs of the Vagrant twin on libvirt (vagrant/README.md).")
@click.option("--allocator", metavar="A", help="The allocator its agents run [default: the experiment's first].")
@TWIN_DIR_OPTION
def up(name_or_file: str, on: str, allocator: str | None, twin_dir: Path) -> None:
    """Boot an experiment's VMs (a built-in name, an experiment file, or a topology .json) and
    leave them running, every agent answering; enter them with `drl-lab ssh`.

    \b
    Examples:
      drl-lab up baseline --on vagrant --allocator fps
      drl-lab ssh l1 -- sudo drlctl status
      drl-lab down
    """
    from drl.lab import twin

    def go():
        tcg = os.environ.get("DRL_VAGRANT_TCG", "1") != "0"
        st = twin.up(name_or_file, twin_dir, allocator, tcg, 768, _progress)
        click.echo(f"{st['experiment']} ({st['allocator']}) is up in {st['up_s']} s: hosts {' '.join(st['hosts'])}, "
                   f"agents on {' '.join(st['agents'])}")
        click.echo(f"  drl-lab ssh {st['agents'][0]} -- sudo drlctl status\n  drl-lab down")
    _guarded(go)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@TWIN_DIR_OPTION
def ssh(host: str, command: tuple[str, ...], twin_dir: Path) -> None:
    """Run COMMAND on HOST of the twin (a shell without one); exits with its status.

    \b
    Examples:
      drl-lab ssh l1 -- sudo drlctl status
      drl-lab ssh sink
    """
    from drl.lab import twin

    sys.exit(_guarded(twin.ssh, twin_dir, host, list(command)))


@main.command()
@TWIN_DIR_OPTION
def down(twin_dir: Path) -> None:
    """Destroy the twin's VMs, its libvirtd and everything `drl-lab up` made."""
    from drl.lab import twin

    st = _guarded(twin.down, twin_dir)
    click.echo(f"{st['experiment']}: {' '.join(st['hosts'])} destroyed" if st else f"no twin in {twin_dir}")


@main.command("list")
def list_() -> None:
    """List the built-in experiments."""
    from drl.lab.registry import builtin
    from drl.lab.reader import load

    for name, path in builtin().items():
        exp = load(path)
        click.echo(f"{name:<14} {exp.description}  [{', '.join(exp.allocators)}; {exp.duration_s:g} s]")


@main.command()
def clean() -> None:
    """Remove namespaces, processes and state left by lab, test and bench runs that died."""
    from drl.lab.netns import clean as clean_leftovers
    from drl.lab.preflight import require_root

    def go():
        require_root()
        removed, running = clean_leftovers()
        for run_ in removed:
            click.echo(f"removed {run_}")
        for run_ in running:
            click.echo(f"kept {run_}: its drl-lab is still running")
        if not removed and not running:
            click.echo("nothing to clean")
    _guarded(go)


@main.command()
@click.option("--duration", type=DURATION, default="20s", show_default=True, help="Length of each run.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results/demo"), show_default=True)
def demo(duration: float, out: Path) -> None:
    """Run a short baseline (2 limiters, 10 Mbit/s, 3:7 flows) with FPS and CTB, side by side.

    \b
    Example:
      sudo drl-lab demo --duration 30s
    """
    require_extra("lab", "numpy", "matplotlib")
    from drl.lab.registry import resolve
    from drl.lab.runner import run_experiment

    have = allocator_names()
    best = next((a for a in DEMO_PREFERENCE if a in have), None)
    if best is None or "ctb" not in have:
        raise click.ClickException("the demo needs the ctb allocator and one of " + ", ".join(DEMO_PREFERENCE))

    def go():
        summary = run_experiment(resolve("baseline").scaled(duration), out, [best, "ctb"], 1, _progress)
        click.echo(render(summary))
    _guarded(go)


def failed_checks(summary: dict) -> list[str]:
    """Every failed check of every run, as ``fps-1: kill l3 max_window_ratio 1.21 > 1.05`` (a
    lower bound, ``op`` "<", as ``min_jain 0.83 < 0.9``)."""
    return [f"{r['allocator']}-{r['repeat']}: {c['fault']} {c['check']} "
            f"{'never' if c['value'] is None else c['value']} {c.get('op', '>')} {_bound(c['bound'])}"
            for r in summary["runs"] for c in r.get("checks", []) if c["result"] == "fail"]


def _bound(b) -> str:
    return f"{b:g}" if isinstance(b, (int, float)) and not isinstance(b, bool) else str(b)


def _verdicts(run: dict, form: str) -> dict[tuple, list[str]]:
    """A run's checks as ``form`` lines, by the (time, fault or attack) they judged."""
    verdicts: dict[tuple, list[str]] = {}
    for c in run.get("checks", []):
        verdicts.setdefault((c["at_s"], c["fault"]), []).append(form.format(**c))
    return verdicts


def render_attacks(summary: dict) -> str:
    """Per run: each attack, its worst window over G x T + D during and after it, the time
    back within the envelope, and its checks."""
    lines = []
    for r in summary["runs"]:
        lines.append(f"attacks, {r['allocator']} run {r['repeat']} (worst window / (G x T + D) during, after; "
                     f"seconds until back within):")
        verdicts = _verdicts(r, "{check} {value} {result}")
        for a in r.get("attacks", []):
            back = "never" if a["back_s"] is None else f"{a['back_s']:.1f}"
            lines.append(f"  t={a['at_s']:5.1f}s  {a['label']:<20} {_envelope(a['during'])} {_envelope(a['after'])} "
                         f"back {back}: " + ", ".join(verdicts.get((a["at_s"], a["label"]), [])))
    return "\n".join(lines)


def render_faults(summary: dict) -> str:
    """Per run: each fault, its worst 1-s window over the limit, its recovery time and checks."""
    lines = []
    for r in summary["runs"]:
        lines.append(f"faults, {r['allocator']} run {r['repeat']} (worst 1-s window / limit, "
                     f"seconds until >= 95 % again):")
        verdicts = _verdicts(r, "{check} {result}")
        for f in r.get("faults", []):
            worst = "-" if f["worst_window_ratio"] is None else f"{f['worst_window_ratio']:.3f}"
            rec = "-" if f["recovery_s"] is None else f"{f['recovery_s']:.1f}"
            note = f"  skipped: {f['skipped']}" if "skipped" in f else \
                "  " + ", ".join(verdicts.get((f["at_s"], f["label"]), []))
            lines.append(f"  t={f['at_s']:5.1f}s  {f['label']:<24} worst {worst:>6}  recovery {rec:>4}{note}")
    return "\n".join(lines)


def _envelope(e: dict | None) -> str:
    """The worst window's bytes over G x T + D, and its length: ``0.412 (1.0 s)``."""
    return "-" if not e or e["ratio"] is None else f"{e['ratio']:.3f} ({e['window_s']:g} s)"


def render_matrix(summary: dict) -> str:
    """A fairness matrix (lab/matrix.py): one line a cell and allocator."""
    lines = [f"{'cell':<22} {'allocator':<9} {'shares (ideal)':<34} {'error':>6} {'Jain':>6} {'to share':>8}"]
    for r in summary["matrix"]:
        shares = " ".join(f"{s:.2f}({i:.2f})" for s, i in zip(r["shares"], r["ideal"]))
        jain = "-" if r["jain_index"] is None else f"{r['jain_index']:.3f}"
        when = "never" if r["time_to_share_s"] is None else f"{r['time_to_share_s']:.1f} s"
        lines.append(f"{r['cell']:<22} {r['allocator']:<9} {shares:<34} {r['max_share_error']:>6.3f} {jain:>6} {when:>8}")
    return "\n".join(lines)


def render(summary: dict) -> str:
    """The comparison table: one column per allocator (its first run, so headed when there are
    more; the last row averages Jain's index over all of them)."""
    runs = [r for r in summary["runs"] if r["repeat"] == 1]
    repeated = any(c["runs"] > 1 for c in summary["comparison"])
    rows = [("global limit", [format_rate(r["global_limit_bps"] / 8) for r in runs]),
            ("delivered", [format_rate(r["aggregate_bps"] / 8) for r in runs]),
            ("utilization", [f"{r['utilization']:.3f}" for r in runs])]
    for i, lim in enumerate(runs[0]["limiters"]):
        rows.append((f"{lim['name']} share (flows)",
                     [f"{r['limiters'][i]['share']:.3f} ({r['limiters'][i]['flows']})" for r in runs]))
    rows.append(("Jain's index", [f"{r['jain_index']:.3f}" if r["jain_index"] is not None else "-" for r in runs]))
    rows.append(("envelope (G T + D)", [_envelope(r.get("envelope")) for r in runs]))
    if repeated:
        rows.append(("Jain's index, all runs", [f"{c['jain_index']:.3f} mean of {c['runs']}" if c["jain_index"] else "-"
                                                 for c in summary["comparison"]]))
    width = max(len(label) for label, _ in rows) + 2
    head = f"{summary['experiment']:<{width}}" + "".join(f"{r['allocator'] + (' run 1' if repeated else ''):>18}"
                                                         for r in runs)
    return "\n".join([head] + [f"{label:<{width}}" + "".join(f"{v:>18}" for v in vals) for label, vals in rows])


envvars_by_flag(main, "DRL_LAB")
