"""``aisafety verify --instances instances.csv``: a VNN-COMP benchmark run row by row in one
process, one results line per instance, then a summary.

Read as VNN-COMP's scripts read it (``run_all_categories.sh``, 2021-2023): rows
``onnx,vnnlib,timeout`` with the paths relative to the benchmark folder, the one that holds
``instances.csv``, and each row its own limit in seconds (no scale: the scripts have none;
they kill a tool 60 s past it). A path named ``x.onnx`` that is absent beside a present
``x.onnx.gz`` is read from the ``.gz``, as the benchmark repositories' ``setup.sh`` gunzips
every file before a run, and the row's comment line says so. Nothing else is guessed: a
row whose file is missing is an ``error`` row naming the path (and, as a hint only, a file
of the benchmark folder whose name ends like it) and the run goes on.

The results file holds one line per row,
``category,onnx,vnnlib,prepare_time,result,runtime`` as VNN-COMP's ``run_single_instance.sh``
writes it (2021's results files and 2023's script alike; the category: ``category_of``),
written and flushed row by row so that an interrupted run keeps every finished row. A
``sat`` row's counterexample goes beside it, in ``<results>.counterexamples/``, named as
the 2023 scripts name them, ``<onnx>_<vnnlib>.counterexample``.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from aisafety.cli.gzipped import unpacked
from aisafety.errors import AISafetyError, ConfigError
from aisafety.files import regular_file

VERDICTS = ("sat", "unsat", "timeout", "unknown", "error")


@dataclass
class Row:
    """One line of ``instances.csv`` as written (1-based ``line``)."""

    line: int
    onnx: str
    vnnlib: str
    timeout: str


@dataclass
class Outcome:
    """What a row gave: its verdict; the wall seconds before the verifier (reading the row,
    unpacking, VNN-COMP's prepare time: outside the limit) and of the verifier (its
    runtime, -1 where it never ran, as the scripts write it), its CPU seconds; the
    counterexample; the comment for the terminal (the margin and notes, or the error)."""

    result: str
    prepare: float
    seconds: float = -1.0
    cpu: float = 0.0
    counterexample: str = ""
    comment: str = ""

    @property
    def wall(self) -> float:
        return self.prepare + max(self.seconds, 0.0)


# verify(network, spec, timeout) -> (InstanceResult, CPU seconds), paths already unpacked
Verify = Callable[[str, str, float], tuple]


def read_rows(path: str) -> list[Row]:
    """The rows of ``instances.csv``; a blank line is skipped (the 2023 scripts read a last
    line without its newline too). A file that cannot be read is one error."""
    text = regular_file(path, "instances file").read_text(encoding="utf-8", errors="replace")
    rows = []
    for number, fields in enumerate(csv.reader(text.splitlines()), start=1):
        fields = [f.strip() for f in fields]
        if not any(fields):
            continue
        fields += [""] * (3 - len(fields))
        rows.append(Row(number, fields[0], fields[1], ",".join(fields[2:])))
    if not rows:
        raise ConfigError(
            f"instances file {path!r} has no rows; a VNN-COMP benchmark's instances.csv has "
            "one line per instance: onnx,vnnlib,timeout"
        )
    return rows


def resolve(folder: Path, named: str, what: str) -> tuple[Path, str]:
    """The file a row names, relative to the benchmark folder, and a note if it was read
    from its ``.gz``; a missing one raises ``ConfigError`` naming the path and a hint."""
    if not named:
        raise ConfigError(f"no {what} path in the row (a line is onnx,vnnlib,timeout)")
    path = folder / named
    if not path.exists() and Path(f"{path}.gz").is_file():
        return Path(f"{path}.gz"), f"{named} read from {named}.gz"
    if not path.exists():
        raise ConfigError(f"{what} {str(path)!r} does not exist{hint(folder, path.name)}")
    regular_file(path, what)  # a folder or a device: named
    return path, ""


def row_files(row: Row, folder: Path) -> list[tuple[Path, str]]:
    """The row's network and property (``resolve``); both named where both are missing."""
    found, missing = [], []
    for named, what in ((row.onnx, "ONNX model"), (row.vnnlib, "VNN-LIB file")):
        try:
            found.append(resolve(folder, named, what))
        except ConfigError as exc:
            missing.append(str(exc))
    if missing:
        raise ConfigError("; and ".join(missing))
    return found


def hint(folder: Path, name: str) -> str:
    """Files of the benchmark folder whose names end like the missing one's (a repackaged
    benchmark: folders flattened, names prefixed), named as a hint and never used."""
    found = sorted(str(p.relative_to(folder)) for p in files_under(folder) if p.name.endswith(name))
    if not found:
        return "; paths are relative to the folder of instances.csv"
    shown = ", ".join(found[:2]) + (f" and {len(found) - 2} more" if len(found) > 2 else "")
    return (
        f"; the benchmark folder has {shown}: was it laid out otherwise than its "
        "instances.csv says? Correct the row's path (it is not guessed)"
    )


@lru_cache(maxsize=4)
def files_under(folder: Path, most: int = 100_000) -> tuple[Path, ...]:
    """The files under ``folder``, listed once per run (a benchmark's rows often miss the
    same way) and at most ``most`` of them: an instances.csv in a home folder must not
    walk the whole disk for a hint."""
    found: list[Path] = []
    for root, _, names in os.walk(folder):
        found += (Path(root) / n for n in names)
        if len(found) >= most:
            break
    return tuple(found)


def row_timeout(text: str) -> float:
    """The row's limit: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"timeout {text!r} is not a positive, finite number of seconds")
    return value


class Unpacker:
    """Each ``.gz`` source unpacked once per run, each into its own folder: two sources of
    one name must not overwrite each other (the networks are cached by path)."""

    def __init__(self, folder: str):
        self.folder, self.done = Path(folder), {}

    def __call__(self, path: Path) -> str:
        if path not in self.done:  # a fresh folder each time: a failed unpack leaves its own
            self.done[path] = unpacked(str(path), tempfile.mkdtemp(dir=self.folder))
        return self.done[path]


def run_row(row: Row, folder: Path, verify: Verify, unpack: Unpacker) -> Outcome:
    """One row: its files found and its verdict, or ``error`` with the reason (the run goes
    on). Ctrl-C is not caught here: the caller keeps the rows already written."""
    began = time.perf_counter()
    try:
        timeout = row_timeout(row.timeout)
        (network, n_note), (spec, s_note) = row_files(row, folder)
        network, spec = unpack(network), unpack(spec)
    except AISafetyError as exc:
        return Outcome("error", time.perf_counter() - began, comment=str(exc))
    except (OSError, EOFError) as exc:  # a truncated or corrupt .gz, a full scratch disk
        comment = f"cannot unpack the row's .gz file: {type(exc).__name__}: {exc}"
        return Outcome("error", time.perf_counter() - began, comment=comment)
    prepare = time.perf_counter() - began
    try:
        result, cpu = verify(network, spec, timeout)
    except AISafetyError as exc:
        return Outcome("error", prepare, time.perf_counter() - began - prepare, comment=str(exc))
    except Exception as exc:  # a bug, or a file no check foresaw: this row only
        comment = f"{type(exc).__name__}: {exc} (unexpected: please report it)"
        return Outcome("error", prepare, time.perf_counter() - began - prepare, comment=comment)
    notes = [n for n in (n_note, s_note, result.note) if n]
    comment = f"margin bound {result.margin:.4g}" + "".join(f"; {n}" for n in notes)
    seconds = time.perf_counter() - began - prepare
    return Outcome(result.status, prepare, seconds, cpu, result.counterexample, comment)


def counterexample_name(row: Row) -> str:
    """``<onnx>_<vnnlib>.counterexample``, the file names' stems as the 2023 scripts take
    them (``.gz`` dropped too)."""
    stem = (
        Path(named).name.removesuffix(".gz").removesuffix(suffix)
        for named, suffix in ((row.onnx, ".onnx"), (row.vnnlib, ".vnnlib"))
    )
    return "_".join(stem) + ".counterexample"


def counterexample_folder(out: str) -> Path:
    """Beside the results file: ``results.csv`` -> ``results.counterexamples/``."""
    path = Path(out)
    return path.with_name(path.name.removesuffix(".csv") + ".counterexamples")


@dataclass
class Sink:
    """Where results go: stdout always, the results file with ``--out``, and the sat rows'
    counterexamples beside it."""

    file: TextIO | None
    folder: Path | None
    written: set[str]

    def add(self, line: str, row: Row, outcome: Outcome) -> str:
        print(line, flush=True)
        if self.file is None:
            return ""
        self.file.write(line + "\n")
        self.file.flush()
        if not outcome.counterexample:
            return ""
        name = counterexample_name(row)
        if name in self.written:  # two rows of one name: the later keeps its line number
            name = name.replace(".counterexample", f"_line{row.line}.counterexample")
        self.written.add(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / name).write_text(outcome.counterexample + "\n", encoding="utf-8")
        return str(self.folder / name)


def run_benchmark(instances: str, verify: Verify, out: str | None, clock: str) -> int:
    """Every row of ``instances``, each line printed (and written with ``out``) as it is
    answered, then the summary; 130 when interrupted, the finished rows kept."""
    rows = read_rows(instances)
    if out and Path(out).resolve() == Path(instances).resolve():
        raise ConfigError(
            f"--out {out!r} is the instances file itself: writing the results would empty "
            "it; give another path (results.csv)"
        )
    folder = Path(instances).parent
    category = category_of(Path(instances))
    file = open_results(out) if out else None
    sink = Sink(file, counterexample_folder(out) if out else None, set())
    counts: Counter[str] = Counter()
    totals = [0.0, 0.0]
    try:
        with tempfile.TemporaryDirectory(prefix="aisafety-verify-") as scratch:
            unpack = Unpacker(scratch)
            for k, row in enumerate(rows, start=1):
                outcome = run_row(row, folder, verify, unpack)
                fields = [category, str(folder / row.onnx), str(folder / row.vnnlib)]
                times = (f"{outcome.prepare:.3f}", f"{outcome.seconds:.3f}")
                line = csv_line([*fields, times[0], outcome.result, times[1]])
                kept = sink.add(line, row, outcome)
                counts[outcome.result] += 1
                totals[0] += outcome.wall
                totals[1] += outcome.cpu
                print(comment_line(k, len(rows), row, outcome, kept), flush=True)
    except KeyboardInterrupt:
        done = sum(counts.values())
        kept = f": they are in {out}" if out else ""
        print(f"# {summary(counts, totals, clock)}", flush=True)
        print(
            f"interrupted: {done} of {len(rows)} rows answered{kept}; the rest were not run",
            file=sys.stderr,
        )
        return 130
    finally:
        if file is not None:
            file.close()
    print(f"# {summary(counts, totals, clock)}")
    if out:
        print(f"# written to {out}" + counterexamples_said(sink))
    elif counts["sat"]:
        print("# the sat rows' counterexamples were not kept: --out results.csv writes them")
    return 0


def category_of(instances: Path) -> str:
    """The results lines' first column: ``X`` of ``X_instances.csv`` (VNN-COMP 2021's name,
    ``benchmarks/X/X_instances.csv``), else the benchmark folder's name (2022 on:
    ``benchmarks/X/instances.csv``)."""
    name = instances.name
    if name.endswith("_instances.csv"):
        return name.removesuffix("_instances.csv")
    return instances.resolve().parent.name


def open_results(out: str) -> TextIO:
    """The results file, emptied (as the scripts' ``echo -n "" > $RESULT_CSV_FILE``), or
    one error naming it before any row runs."""
    from aisafety.cli.common import write_output

    write_output(out, "", "--out")  # a folder or a read-only place: named now
    return open(out, "w", encoding="utf-8", newline="")


def csv_line(fields: list[str]) -> str:
    """One results line (fields quoted only where they hold a comma or a quote)."""
    return ",".join(f'"{f.replace(chr(34), chr(34) * 2)}"' if set(f) & {",", '"'} else f
                    for f in fields)  # fmt: skip


def comment_line(k: int, n: int, row: Row, outcome: Outcome, kept: str) -> str:
    """``# row k/n (line L): <verdict>, seconds, then the margin or the error``."""
    times = f"{outcome.wall:.2f} s wall, {outcome.cpu:.2f} s CPU"
    text = f"# {k}/{n} (line {row.line}) {outcome.result}: {times}; {outcome.comment}"
    return text + (f"; counterexample in {kept}" if kept else "")


def summary(counts: Counter, totals: list[float], clock: str) -> str:
    """``N instances: a sat, b unsat, ...; W s wall, C s CPU (limits on the wall clock)``."""
    n = sum(counts.values())
    parts = ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
    return (
        f"{n} instance{'s' * (n != 1)}: {parts}; {totals[0]:.1f} s wall, {totals[1]:.1f} s CPU "
        f"(each row's limit on the {clock} clock, --clock {clock})"
    )


def counterexamples_said(sink: Sink) -> str:
    if not sink.written:
        return ""
    return f"; {len(sink.written)} counterexample(s) in {sink.folder}/"
