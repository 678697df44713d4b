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


def _example_cells(clean: np.ndarray, adversarial: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """One column of the grid: (image as imshow draws it, label) for each row."""
    delta = adversarial - clean
    scale = float(np.abs(delta).max())
    magnified = 0.5 + delta / (2 * scale) if scale > 0 else np.full_like(delta, 0.5)
    return [
        (np.clip(_as_image(clean), 0, 1), "clean"),
        (np.clip(_as_image(adversarial), 0, 1), "adversarial"),
        (np.clip(_as_image(magnified), 0, 1), f"perturbation x{0.5 / max(scale, 1e-12):.0f}"),
    ]


def example_grid(
    title: str, clean: list[np.ndarray], adversarial: list[np.ndarray], captions: list[str]
) -> Plot:
    """Columns: samples; rows: clean, adversarial, and the perturbation scaled so its
    largest entry spans the whole grey range (0.5 = unchanged).

    The cells are pasted into one image and framed and labelled on one axes: an axes per
    cell (12 for 4 samples) made this figure most of a report's drawing time."""
    columns = [_example_cells(c, a) for c, a in zip(clean, adversarial, strict=True)]
    first = columns[0][0][0]
    h, w = first.shape[:2]
    gap_x, gap_y = max(2, round(0.45 * w)), max(2, round(0.4 * h))
    width = len(columns) * w + (len(columns) - 1) * gap_x
    mosaic = np.ones((3 * h + 2 * gap_y, width, *first.shape[2:]))  # white between cells
    fig, ax = _pyplot().subplots(figsize=(1.5 * len(columns) + 0.6, 4.6))
    for j, (column, caption) in enumerate(zip(columns, captions, strict=True)):
        left = j * (w + gap_x)
        centre = left + w / 2 - 0.5  # pixel centres are at integers
        ax.text(centre, -0.5 - 0.04 * h, caption, ha="center", va="bottom", fontsize=7)
        for i, (image, name) in enumerate(column):
            top = i * (h + gap_y)
            mosaic[top : top + h, left : left + w] = image
            ax.add_patch(
                _pyplot().Rectangle((left - 0.5, top - 0.5), w, h, fill=False, linewidth=0.8)
            )
            ax.text(centre, top + h - 0.5 + 0.06 * h, name, ha="center", va="top", fontsize=7)
    ax.imshow(mosaic, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_axis_off()
    fig.suptitle(title, fontsize=10)
    return Plot(title, figure_uri(fig), f"{title}: {len(columns)} samples")


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
