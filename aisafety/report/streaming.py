"""Rows written as they arrive (``aisafety query``): CSV and JSON line by line, the table
with column widths taken from its first rows, so memory stays bounded however many rows."""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from aisafety.report.table import cell_text

WIDTH_ROWS = 200  # a table's column widths come from this many first rows


def write_rows(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], fmt: str, out: TextIO
) -> None:
    """Write ``rows`` to ``out`` in ``fmt`` (table, csv, json) as they come."""
    writer = {"json": _json, "csv": _csv}.get(fmt, _table)
    writer(columns, iter(rows), out)


def _json(columns: Sequence[str], rows: Iterator[Sequence[Any]], out: TextIO) -> None:
    separator = "\n  "
    out.write("[")
    for row in rows:
        out.write(separator + json.dumps(dict(zip(columns, row, strict=True)), default=str))
        separator = ",\n  "
    out.write("\n]\n" if separator != "\n  " else "]\n")


def _csv(columns: Sequence[str], rows: Iterator[Sequence[Any]], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(row)


def _table(columns: Sequence[str], rows: Iterator[Sequence[Any]], out: TextIO) -> None:
    first = [[cell_text(v) for v in row] for row in itertools.islice(rows, WIDTH_ROWS)]
    widths = [max([len(c), *(len(r[i]) for r in first)]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for cells in itertools.chain(first, ([cell_text(v) for v in row] for row in rows)):
        out.write("  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True)) + "\n")
