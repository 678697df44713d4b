"""Compare the stored results of two result databases, value for value.

    python -m aisafety.store.compare sqlite:///before.db sqlite:///after.db

Rows are keyed by what they measure, not by their ids: a metric value by (model, dataset,
metric label, attack label, eps), an attack run by (model, dataset, attack label, eps), a
per-sample outcome by its attack run's key and sample index; rows with the same key are
compared in order. Numbers must be bit-identical (floats compared by their IEEE bits, NaN
equal to NaN); timings, ids and timestamps are not compared (``--no-details``: nor the
free-form ``details`` of metric values). Exit status 0 when the two
databases hold the same values, 1 when any differs (each difference is printed).

The runs on the two sides must have been counted by the same rules (their results semantics
versions, ``store/semantics.py``): otherwise part of a difference is the code's, and the
comparison is refused (exit 2) unless ``--across-versions`` asks for it, flagged.
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

from sqlalchemy import create_engine, inspect, text

from aisafety.errors import ConfigError
from aisafety.store import semantics
from aisafety.store.engine import shown_url, sqlite_file

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


# the runs whose rows each table compares (sample outcomes: those of their attack runs)
RUNS_OF = {
    "metric_values": "SELECT run_id FROM metric_values",
    "attack_runs": "SELECT run_id FROM attack_runs",
    "sample_outcomes": "SELECT a.run_id FROM attack_runs a WHERE EXISTS "
    "(SELECT 1 FROM sample_outcomes s WHERE s.attack_run_id = a.id)",  # its index, no scan
}


class NotLikeForLike(ConfigError):
    """The two databases' runs were counted by different rules; the message says which."""


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


def versions(url: str, tables: Iterable[str] = TABLES) -> set[int | None]:
    """The stored results semantics versions of the runs whose rows ``tables`` hold (NULL for
    a run stored before versions were kept, and for every run of a database older than
    revision 0005, which has no such column: it is read, never migrated)."""
    runs = " UNION ".join(RUNS_OF[table] for table in tables)
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            found = inspect(connection)
            if "runs" not in found.get_table_names():
                raise ConfigError(
                    f"{shown_url(url)} holds no aisafety results (no runs table): give the "
                    "database a run was stored in (aisafety evaluate --db)"
                )
            columns = {c["name"] for c in found.get_columns("runs")}
            column = "semantics_version" if "semantics_version" in columns else "NULL"
            query = f"SELECT DISTINCT {column} FROM runs WHERE id IN ({runs})"
            return {row[0] for row in connection.execute(text(query))}
    finally:
        engine.dispose()


def sides(before: str, after: str, tables: Iterable[str] = TABLES) -> dict[str, set]:
    """Each database's stored versions, by side (``semantics.unlike`` reads them)."""
    tables = list(tables)
    return {"before": versions(before, tables), "after": versions(after, tables)}


def compare(
    before: str,
    after: str,
    tables: Iterable[str] = TABLES,
    details: bool = True,
    across_versions: bool = False,
) -> tuple[dict, list]:
    """(rows compared per table, differences) between the databases at two URLs;
    ``details=False`` leaves out ``metric_values.details`` (free-form extras a newer version
    may have added to). Runs counted by different rules are refused (``NotLikeForLike``)
    unless ``across_versions``: a difference would be the code's as much as the model's."""
    tables = list(tables)
    found = semantics.unlike(sides(before, after, tables))
    if found and not across_versions:
        raise NotLikeForLike(
            f"{found}\ncompare databases made by one results semantics version, or give "
            "--across-versions (from Python: across_versions=True) to compare them anyway"
        )
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
    mistyped path must not be read as an empty database (nor end in a traceback), nor a
    mistyped ``sqlite:///`` URL make an empty file (as it did before session 21)."""
    if "://" in text:
        path = sqlite_file(text) if text.startswith("sqlite") else None
        if path is not None and not path.is_file():
            raise argparse.ArgumentTypeError(
                f"no database file {str(path)!r} (from {text}); give an existing SQLite file"
            )
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
    parser.add_argument(
        "--across-versions",
        action="store_true",
        help="compare runs counted by different results semantics versions (flagged)",
    )
    args = parser.parse_args(argv)
    try:
        stored = sides(args.before, args.after, args.tables)
        counts, differences = compare(
            args.before, args.after, args.tables, not args.no_details, args.across_versions
        )
    except ConfigError as error:  # not a results database; or not like for like
        print(f"error: {error}", file=sys.stderr)
        return 2
    flag = semantics.unlike(stored)
    if flag:
        print(f"not like for like: {flag}")
    for difference in differences:
        print(difference)
    summary = ", ".join(f"{n} {table}" for table, n in counts.items())
    rules = (
        " (not like for like: see above)"
        if flag
        else f"; results semantics version {semantics.sides_shown(stored)}"
    )
    if differences:
        print(f"{len(differences)} difference(s); compared {summary}{rules}")
        return 1
    print(f"identical: {summary}, every value bit for bit{rules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
