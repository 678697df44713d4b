"""Matplotlib figures of a run, as self-contained PNG data URIs for the HTML report.

Matplotlib draws offline and embeds as a plain ``<img>``: the report opens with no network
and no JavaScript. The Agg backend is forced so no display is needed.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from aisafety.report.intervals import clopper_pearson


def _pyplot():
    """pyplot on the Agg backend, imported on first use (the CLI starts faster without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Plot:
    """One figure: a title, the PNG as a data URI and the text a screen reader gets."""

    title: str
    uri: str
    alt: str


@dataclass(frozen=True)
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    n: Sequence[int] | None = None  # samples per point: draws a 95% Clopper-Pearson band
    style: str = "-o"


MARKERS = "osD^vP*Xh<>"


def figure_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def line_plot(
    title: str, series: Iterable[Series], xlabel: str, ylabel: str, ylim: tuple | None = (0, 1)
) -> Plot:
    fig, ax = _pyplot().subplots(figsize=(5.6, 3.6))
    drawn = []
    for i, s in enumerate(series):
        # lines that coincide (PGD under the worst case) stay visible: each later line is
        # thinner and has its own marker, so it shows inside the earlier ones
        style = f"-{MARKERS[i % len(MARKERS)]}" if s.style == "-o" else s.style
        width, size = max(0.8, 3.6 - 1.4 * i), max(2.5, 7.0 - 2.0 * i)
        (line,) = ax.plot(s.x, s.y, style, label=s.label, markersize=size, linewidth=width)
        drawn.append(s.label)
        if s.n is not None:
            bands = [
                clopper_pearson(round(y * n), n) if n else (y, y)
                for y, n in zip(s.y, s.n, strict=True)
            ]
            ax.fill_between(
                s.x,
                [b[0] for b in bands],
                [b[1] for b in bands],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    return Plot(title, figure_uri(fig), f"{title}: {', '.join(drawn)}")


def heatmap(
    title: str,
    rows: Sequence[str],
    columns: Sequence[str],
    values: np.ndarray,
    label: str,
    xlabel: str = "",
) -> Plot:
    fig, ax = _pyplot().subplots(figsize=(1.2 + 0.7 * len(columns), 0.9 + 0.32 * len(rows)))
    image = ax.imshow(values, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_xlabel(xlabel)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax, label=label)
    ax.set_title(title, fontsize=10)
    return Plot(title, figure_uri(fig), f"{title}: {len(rows)} x {len(columns)} cells")


def _as_image(x: np.ndarray) -> np.ndarray:
    """(C, H, W) -> what imshow draws: (H, W) grey or (H, W, 3) colour."""
    return x[0] if x.shape[0] == 1 else np.transpose(x, (1, 2, 0))


def example_grid(
    title: str, clean: list[np.ndarray], adversarial: list[np.ndarray], captions: list[str]
) -> Plot:
    """Columns: samples; rows: clean, adversarial, and the perturbation scaled so its
    largest entry spans the whole grey range (0.5 = unchanged)."""
    n = len(clean)
    fig, axes = _pyplot().subplots(3, n, figsize=(1.5 * n + 0.6, 4.6), squeeze=False)
    for j, (c, a, caption) in enumerate(zip(clean, adversarial, captions, strict=True)):
        delta = a - c
        scale = float(np.abs(delta).max())
        magnified = 0.5 + delta / (2 * scale) if scale > 0 else np.full_like(delta, 0.5)
        grey = {"cmap": "gray", "vmin": 0, "vmax": 1}
        for i, (image, name) in enumerate(
            [
                (c, "clean"),
                (a, "adversarial"),
                (magnified, f"perturbation x{0.5 / max(scale, 1e-12):.0f}"),
            ]
        ):
            ax = axes[i, j]
            ax.imshow(np.clip(_as_image(image), 0, 1), **grey)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel(name, fontsize=7)
            if i == 0:
                ax.set_title(caption, fontsize=7)
    fig.suptitle(title, fontsize=10)
    return Plot(title, figure_uri(fig), f"{title}: {n} samples")


def frontier_plot(title: str, budgets: list[float], rows: np.ndarray, shown: int) -> Plot:
    """Per-sample frontiers (margin against budget) in grey, their mean in black."""
    fig, ax = _pyplot().subplots(figsize=(5.6, 3.6))
    for row in rows[:shown]:
        ax.plot(budgets, row, color="0.6", linewidth=0.6, alpha=0.6)
    ax.plot(budgets, rows.mean(0), color="black", linewidth=2, label=f"mean of {len(rows)}")
    ax.axhline(0, color="tab:red", linewidth=0.8, linestyle="--")
    ax.set_xlabel("eps")
    ax.set_ylabel("margin reached")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    return Plot(title, figure_uri(fig), f"{title}: {len(rows)} per-sample frontiers")
