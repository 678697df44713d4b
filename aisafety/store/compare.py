"""Compare the stored results of two result databases, value for value.

    python -m aisafety.store.compare sqlite:///before.db sqlite:///after.db

Rows are keyed by what they measure, not by their ids: a metric value by (model, dataset,
metric label, attack label, eps), an attack run by (model, dataset, attack label, eps), a
per-sample outcome by its attack run's key and sample index; rows with the same key are
compared in order. Numbers must be bit-identical (floats compared by their IEEE bits, NaN
equal to NaN); timings, ids and timestamps are not compared (``--no-details``: nor the
free-form ``details`` of metric values). Exit status 0 when the two
databases hold the same values, 1 when any differs (each difference is printed).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

# What identifies a row, and what must be equal, per table. ``m``: models, ``d``: datasets.
METRIC_VALUES = """
    SELECT m.name, m.fingerprint, d.name, d.fingerprint, v.metric, v.attack, v.eps,
           v.value, v.n_samples, v.direction, v.unit, v.details
    FROM metric_values v JOIN models m ON v.model_id = m.id JOIN datasets d ON v.dataset_id = d.id
    ORDER BY v.id"""
ATTACK_RUNS = """
    SELECT m.name, m.fingerprint, d.name, d.fingerprint, a.attack, a.eps,
           a.family, a.norm, a.n_samples, a.success_rate, a.robust_accuracy
    FROM attack_runs a JOIN models m ON a.model_id = m.id JOIN datasets d ON a.dataset_id = d.id
    ORDER BY a.id"""
SAMPLE_OUTCOMES = """
    SELECT m.name, m.fingerprint, d.name, d.fingerprint, a.attack, a.eps, s.sample_index,
           s.label, s.clean_pred, s.adv_pred, s.success, s.steps, s.l0, s.l1, s.l2, s.linf
    FROM sample_outcomes s JOIN attack_runs a ON s.attack_run_id = a.id
    JOIN models m ON a.model_id = m.id JOIN datasets d ON a.dataset_id = d.id
    ORDER BY a.id, s.sample_index"""
TABLES = {  # name: (query, number of key columns)
    "metric_values": (METRIC_VALUES, 7),
    "attack_runs": (ATTACK_RUNS, 6),
    "sample_outcomes": (SAMPLE_OUTCOMES, 7),
}


@dataclass(frozen=True)
class Difference:
    table: str
    key: tuple
    before: tuple | None
    after: tuple | None

    def __str__(self) -> str:
        where = ", ".join(str(part) for part in self.key if part is not None)
        return f"{self.table} [{where}]: {self.before} -> {self.after}"


def exact(value: Any) -> Any:
    """A form of a stored value that is equal only for bit-identical numbers."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else struct.pack("<d", value).hex()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)  # floats written by repr: exact
    if isinstance(value, str) and value[:1] in "{[":
        try:  # JSON columns read back as text by some drivers
            return json.dumps(json.loads(value), sort_keys=True)
        except ValueError:
            return value
    return value


def _rows(url: str, query: str, n_key: int) -> dict[tuple, list[tuple]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(query)).all()
    finally:
        engine.dispose()
    grouped: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        grouped[tuple(exact(v) for v in row[:n_key])].append(tuple(row[n_key:]))
    return grouped


def compare(
    before: str, after: str, tables: Iterable[str] = TABLES, details: bool = True
) -> tuple[dict, list]:
    """(rows compared per table, differences) between the databases at two URLs;
    ``details=False`` leaves out ``metric_values.details`` (free-form extras a newer version
    may have added to)."""
    counts, differences = {}, []
    for table in tables:
        query, n_key = TABLES[table]
        if table == "metric_values" and not details:
            query = query.replace(", v.details", "")
        a, b = _rows(before, query, n_key), _rows(after, query, n_key)
        counts[table] = sum(map(len, a.values()))
        for key in sorted(a.keys() | b.keys(), key=repr):
            rows_a, rows_b = a.get(key, []), b.get(key, [])
            for i in range(max(len(rows_a), len(rows_b))):
                row_a = rows_a[i] if i < len(rows_a) else None
                row_b = rows_b[i] if i < len(rows_b) else None
                same = (
                    row_a is not None
                    and row_b is not None
                    and [exact(v) for v in row_a] == [exact(v) for v in row_b]
                )
                if not same:
                    differences.append(Difference(table, key, row_a, row_b))
    return counts, differences


def database_url(text: str) -> str:
    """A SQLAlchemy URL as given, or an existing SQLite file's path turned into one: a
    mistyped path must not be read as an empty database (nor end in a traceback)."""
    if "://" in text:
        return text
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"no database file {text!r}; give an existing SQLite file or a URL such as "
            "sqlite:///results.db"
        )
    return f"sqlite:///{path.resolve()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aisafety.store.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("before", type=database_url, help="database URL or SQLite file")
    parser.add_argument("after", type=database_url, help="database URL or SQLite file")
    parser.add_argument(
        "--tables", nargs="+", choices=list(TABLES), default=list(TABLES), help="what to compare"
    )
    parser.add_argument(
        "--no-details",
        action="store_true",
        help="leave metric_values.details out (the values and sample counts are still compared)",
    )
    args = parser.parse_args(argv)
    counts, differences = compare(args.before, args.after, args.tables, not args.no_details)
    for difference in differences:
        print(difference)
    summary = ", ".join(f"{n} {table}" for table, n in counts.items())
    if differences:
        print(f"{len(differences)} difference(s); compared {summary}")
        return 1
    print(f"identical: {summary}, every value bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
