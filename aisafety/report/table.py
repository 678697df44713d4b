"""Plain-text, CSV and JSON rendering of result rows."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from aisafety.interfaces import MetricValue


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(
            [dict(zip(columns, row, strict=True)) for row in rows], indent=2, default=str
        )
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)


def metric_rows(values: Sequence[MetricValue]) -> tuple[list[str], list[tuple]]:
    columns = ["metric", "attack", "eps", "value", "better", "n"]
    rows = [
        (v.metric, v.attack or "", v.eps, v.value, v.direction.value, v.n_samples) for v in values
    ]
    return columns, rows
