"""PNG plots of an experiment's runs, drawn from the series in result.json.

    draw_all(json.load(open("results/baseline/result.json")), exp, Path("results/baseline"))

* ``timeseries.png``: delivered rate per limiter and in aggregate, 1-s means,
  one panel per allocator ([Raghavan07] Fig. 3, 6, 7, 9), the worst window against
  G x T + D shaded and its ratio in the title;
* ``utilization.png``: histograms of aggregate/limit over 100 ms and 1 s (Fig. 4);
* ``flows.png``: each flow's mean rate, grouped by limiter;
* ``attacks.png``: every 1-s window's bytes over G x 1 s + D, each attack shaded orange while it
  lasts and blue for the aftermath judged after it (lab/attacks.py);
* ``qq.png``: Q-Q plot of Jain's index against CTB when runs were repeated (Fig. 5).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .metrics import moving_mean, rebin  # noqa: E402
from .spec import REFERENCE, Experiment  # noqa: E402


def draw_all(summary: dict, exp: Experiment, out: Path) -> list[Path]:
    firsts = [r for r in summary["runs"] if r["repeat"] == 1]
    drawn = [timeseries(firsts, exp, out / "timeseries.png"),
             utilization(firsts, out / "utilization.png"),
             flows(firsts, out / "flows.png")]
    if any(r.get("attacks") for r in firsts):
        drawn.append(attacks(firsts, out / "attacks.png"))
    if any(row["runs"] > 1 for row in summary["comparison"]):
        drawn.append(qq(summary["runs"], out / "qq.png"))
    return [p for p in drawn if p]


def _panels(n: int, height: float = 2.6, cols: int = 1):
    fig, axes = plt.subplots(n, cols, figsize=(9, height * n), squeeze=False)
    return fig, axes


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def timeseries(runs: list[dict], exp: Experiment, path: Path) -> Path:
    fig, axes = _panels(len(runs))
    changes = sorted(({t.start_s for t in exp.traffic} | {e.at_s for e in exp.events}) - {0.0})
    for ax, run in zip(axes[:, 0], runs):
        s = run["series"]
        width = round(1.0 / s["dt_s"])
        t = np.arange(len(s["aggregate_bps"])) * s["dt_s"]
        ax.plot(t, np.array(moving_mean(s["aggregate_bps"], width)) / 1e6, color="black", lw=1.2, label="aggregate")
        for name, series in s["limiters_bps"].items():
            ax.plot(t, np.array(moving_mean(series, width)) / 1e6, lw=0.9, label=name)
        ax.axhline(run["global_limit_bps"] / 1e6, ls="--", color="grey", lw=0.8)
        for c in changes:
            ax.axvline(c, ls=":", color="grey", lw=0.6)
        ax.set_title(f"{run['experiment']}: {run['allocator']}  (Jain {run['jain_index'] or float('nan'):.3f}"
                     f"{envelope_label(run.get('envelope'))})", fontsize=9)
        _envelope(ax, run.get("envelope"))
        ax.set_ylabel("Mbit/s")
        if run.get("faults"):
            _faults(ax, run)
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))   # the labels need the top
        else:
            ax.legend(fontsize=6, ncol=6, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    return _save(fig, path)


def envelope_label(e: dict | None) -> str:
    """``; envelope 1.042 over 1.3 s at 90.1 s``: the worst window's bytes over G x T + D."""
    if not e or e.get("ratio") is None:
        return ""
    return f"; envelope {e['ratio']:.3f} over {e['window_s']:g} s at {e['at_s']:g} s"


def _envelope(ax, e: dict | None) -> None:
    """The worst envelope window shaded: red when it carried more than G x T + D."""
    if e and e.get("ratio") is not None:
        ax.axvspan(e["at_s"], e["at_s"] + e["window_s"], color="tab:red" if e["ratio"] > 1 else "tab:green",
                   alpha=0.15, lw=0, label=f"worst envelope window ({e['ratio']:.3f})")


def _faults(ax, run: dict) -> None:
    """Each fault as a red vertical line labelled with what it did; the highest worst-window
    bound of the file's checks as a dotted line."""
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.5 * run["global_limit_bps"] / 1e6))
    for f in run["faults"]:
        ax.axvline(f["at_s"], color="tab:red", lw=0.8, alpha=0.7, ls="-" if "skipped" not in f else ":")
        ax.text(f["at_s"], 0.98, " " + f["label"], rotation=90, va="top", ha="left", fontsize=6, color="tab:red",
                transform=ax.get_xaxis_transform())
    bounds = [c["bound"] for c in run.get("checks", []) if c["check"] == "max_window_ratio"]
    if bounds:
        ax.axhline(max(bounds) * run["global_limit_bps"] / 1e6, ls=":", color="tab:red", lw=0.7)


def attacks(runs: list[dict], path: Path) -> Path:
    fig, axes = _panels(len(runs))
    for ax, run in zip(axes[:, 0], runs):
        s = run["series"]
        width, dt = round(1.0 / s["dt_s"]), s["dt_s"]
        one_s = run["global_limit_bps"] / 8 + run["envelope"]["budget_bytes"]     # G x 1 s + D, bytes
        sums = np.convolve(np.array(s["aggregate_bps"]) / 8 * dt, np.ones(width), "valid")
        ax.plot(np.arange(len(sums)) * dt, sums / one_s, color="black", lw=1.0, label="1-s window / (G·1 s + D)")
        ax.axhline(1.0, ls="--", color="tab:red", lw=0.8)
        for a in run["attacks"]:
            start = a.get("started_at_s", a["at_s"])
            ax.axvspan(start, start + a["duration_s"], color="tab:orange", alpha=0.25, lw=0)
            ax.axvspan(start + a["duration_s"], start + a["duration_s"] + a["after_s"], color="tab:blue", alpha=0.08,
                       lw=0)
            ax.text(start, 0.02, " " + a["kind"], rotation=90, va="bottom", ha="left", fontsize=6,
                    transform=ax.get_xaxis_transform())
        ax.set_ylim(0, max(1.2, ax.get_ylim()[1]))
        ax.set_title(f"{run['experiment']}: {run['allocator']}, attacks (orange) and their aftermath (blue)", fontsize=9)
        ax.set_ylabel("window / envelope")
        ax.legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    return _save(fig, path)


def utilization(runs: list[dict], path: Path) -> Path:
    fig, axes = _panels(len(runs), height=2.0, cols=2)
    for row, run in zip(axes, runs):
        s, limit = run["series"], run["global_limit_bps"]
        lo = round(run["warmup_s"] / s["dt_s"])
        fine = np.array(s["aggregate_bps"][lo:]) / limit
        coarse = np.array(rebin(s["aggregate_bps"][lo:], round(1.0 / s["dt_s"]))) / limit
        for ax, data, scale in ((row[0], fine, "100 ms"), (row[1], coarse, "1 s")):
            ax.hist(data, bins=np.linspace(0, 1.6, 33), color="tab:blue")
            ax.axvline(1.0, ls="--", color="grey", lw=0.8)
            ax.set_title(f"{run['allocator']}: aggregate / limit over {scale}", fontsize=9)
    return _save(fig, path)


def flows(runs: list[dict], path: Path) -> Path:
    fig, axes = _panels(len(runs), height=2.2)
    for ax, run in zip(axes[:, 0], runs):
        names = [l["name"] for l in run["limiters"]]
        colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
        fl = sorted(run["flows"], key=lambda f: names.index(f["limiter"]))
        ax.bar(range(len(fl)), [f["mean_bps"] / 1e6 for f in fl], color=[colors[f["limiter"]] for f in fl])
        ax.set_title(f"{run['allocator']}: mean rate per flow (colour = limiter)", fontsize=9)
        ax.set_ylabel("Mbit/s")
    return _save(fig, path)


def qq(runs: list[dict], path: Path) -> Path | None:
    """Quantiles of each allocator's Jain index against CTB's, with the x = y line (Fig. 5)."""
    ref = sorted(r["jain_index"] for r in runs if r["allocator"] == REFERENCE and r["jain_index"] is not None)
    if len(ref) < 2:
        return None
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    probs = np.linspace(0, 1, len(ref))
    for alloc in dict.fromkeys(r["allocator"] for r in runs if r["allocator"] != REFERENCE):
        mine = [r["jain_index"] for r in runs if r["allocator"] == alloc and r["jain_index"] is not None]
        if mine:
            ax.plot(ref, np.quantile(mine, probs), "o-", ms=4, label=alloc)
    lo = min(ref + [0.8])
    ax.plot([lo, 1], [lo, 1], ls="--", color="grey", lw=0.8)
    ax.set_xlabel("Jain's index, CTB (quantiles)")
    ax.set_ylabel("Jain's index, allocator (quantiles)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def matrix(rows: list[dict], path: Path) -> Path:
    """A fairness matrix (lab/matrix.py): per cell and allocator, Jain's index over the flows
    and the largest share error, side by side."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 0.6 * len(rows) + 2), 5.5), sharex=True)
    x = np.arange(len(rows))
    top.bar(x, [r["jain_index"] or 0.0 for r in rows], color="C0")
    top.set_ylim(0.5, 1.0)
    top.set_ylabel("Jain over flows")
    bottom.bar(x, [r["max_share_error"] for r in rows], color="C3")
    bottom.set_ylabel("max |share - ideal|")
    bottom.set_xticks(x, [f"{r['allocator']} {r['cell']}" for r in rows], rotation=60, ha="right", fontsize=7)
    for ax, key in ((top, "min_jain"), (bottom, "max_share_error")):
        bounds = {c["bound"] for r in rows for c in r["checks"] if c["check"] == key}
        for b in bounds:
            ax.axhline(b, ls="--", color="grey", lw=0.8)
    return _save(fig, path)
