"""PNG figures for the reproductions (matplotlib, Agg backend: no display needed).

    save(out / "fig8.png", "Scaling ([Raghavan07] Fig. 8)", [
        Panel("delivered", "limiters", "Mbit/s", [Line("FPS br=3", xs, ys)], hline=50.0),
    ])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


@dataclass
class Line:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "-o"


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line] = field(default_factory=list)
    hline: float | None = None       # a reference level (the global limit)
    logx: bool = False


def save(path: Path, title: str, panels: list[Panel]) -> Path:
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for line in panel.lines:
            ax.plot(line.x, line.y, line.style, label=line.label, markersize=3, linewidth=1.2)
        if panel.hline is not None:
            ax.axhline(panel.hline, color="grey", linestyle=":", linewidth=1)
        if panel.logx:
            ax.set_xscale("log")
        ax.set_title(panel.title)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if panel.lines:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
