"""The figures of docs/reliability.md: malformed plans, faulty models and bad data files run
through ``aisafety evaluate`` as a user would, and writes through ``aisafety query``.

    python bench/reliability.py      # AISAFETY_SHARED_DATA=folder: where mnist/ lies

The cases of issue #35 (plugins, special files, network bounds, PostgreSQL queries) are in
``bench/reliability_iii.py``; the summary counts every case as clear / unclear / traceback
/ runaway / silent / corrupted (or a valid control accepted).

Each case is classified as: a clear error (exit 2, one ``error:`` line, no traceback), a
traceback (any other exception), a silent acceptance (exit 0 for an input that is wrong), a
runaway (still running after 60 s), or accepted (a valid control). Targets: 0 tracebacks,
0 silent acceptances, 0 runaways.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from aisafety.cli import main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import absent, located  # noqa: E402

BOMB = 'a: &a ["l","l","l","l","l","l","l","l","l"]\n' + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
OK = "metrics: [ca]\n"
# (label, file suffix, content); every one of these is a mistake except the 'valid:' ones
PLANS: list[tuple[str, str, str | bytes]] = [
    ("valid: metrics only", ".yaml", OK),
    ("valid: eps 1e-3 (YAML 1.2 float)", ".yaml", "attacks: [{name: fgsm, eps: 1e-3}]\n" + OK),
    ("valid: toml", ".toml", 'metrics = ["ca"]\n'),
    ("empty yaml", ".yaml", ""),
    ("empty mapping", ".yaml", "{}"),
    ("empty toml", ".toml", ""),
    ("top-level list", ".yaml", "- ca"),
    ("top-level scalar", ".yaml", "42"),
    ("non-UTF-8", ".yaml", "model: {name: caf\xe9}\n".encode("latin-1")),
    ("binary", ".yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00"),
    ("unknown suffix", ".txt", OK),
    ("yaml syntax", ".yaml", "metrics: [ca\n"),
    ("toml syntax", ".toml", "metrics = [ca]"),
    ("tab indentation", ".yaml", "model:\n\tname: x\n"),
    ("alias bomb", ".yaml", BOMB),
    ("recursive alias", ".yaml", "a: &a [*a]\n"),
    ("duplicate key", ".yaml", "metrics: [ca]\nmetrics: [aaw]\n"),
    ("duplicate nested key", ".yaml", "attacks: [{name: fgsm, eps: 0.1, eps: 0.3}]\n" + OK),
    ("duplicate toml key", ".toml", 'seed = 1\nseed = 2\nmetrics = ["ca"]\n'),
    ("unknown top key", ".yaml", "atacks: []\n" + OK),
    ("unknown model key", ".yaml", "model: {nme: x}\n" + OK),
    ("unknown dataset key", ".yaml", "dataset: {limt: 5}\n" + OK),
    ("unknown attack", ".yaml", "attacks: [{name: fgsmm}]\n" + OK),
    ("unknown metric", ".yaml", "metrics: [cca]\n"),
    ("unknown attack setting", ".yaml", "attacks: [{name: pgd-linf, config: {stpes: 5}}]\n" + OK),
    ("attack setting wrong type", ".yaml", "attacks: [{name: pgd-linf, config: {steps: x}}]\n"),
    ("steps 1e12", ".yaml", "attacks: [{name: pgd-linf, config: {steps: 1e12}}]\n" + OK),
    ("steps -1", ".yaml", "attacks: [{name: pgd-linf, config: {steps: -1}}]\n" + OK),
    ("square queries 1e9", ".yaml", "attacks: [{name: square-linf, config: {queries: 1e9}}]\n"),
    ("apgd restarts 1e6", ".yaml", "attacks: [{name: apgd-ce, config: {n_restarts: 1000000}}]\n"),
    ("eps 8", ".yaml", "attacks: [{name: fgsm, eps: 8}]\n" + OK),
    ("eps .inf", ".yaml", "attacks: [{name: fgsm, eps: .inf}]\n" + OK),
    ("eps .nan", ".yaml", "attacks: [{name: fgsm, eps: .nan}]\n" + OK),
    ("eps true", ".yaml", "attacks: [{name: fgsm, eps: true}]\n" + OK),
    ("eps string", ".yaml", "attacks: [{name: fgsm, eps: '0.1'}]\n" + OK),
    ("eps negative", ".yaml", "attacks: [{name: fgsm, eps: -0.1}]\n" + OK),
    ("eps empty list", ".yaml", "attacks: [{name: fgsm, eps: []}]\n" + OK),
    ("eps nested list", ".yaml", "attacks: [{name: fgsm, eps: [[0.1]]}]\n" + OK),
    ("l2 eps 100 on 28x28", ".yaml", "attacks: [{name: pgd-l2, eps: 100}]\n" + OK),
    ("seed 2^63", ".yaml", "seed: 9223372036854775808\n" + OK),
    ("seed -1", ".yaml", "seed: -1\n" + OK),
    ("seed 1.5", ".yaml", "seed: 1.5\n" + OK),
    ("seed true", ".yaml", "seed: true\n" + OK),
    ("seed 5000 digits", ".yaml", "seed: " + "9" * 5000 + "\n" + OK),
    ("dataset seed 2^64", ".yaml", "dataset: {seed: 18446744073709551616}\n" + OK),
    ("limit 0", ".yaml", "dataset: {limit: 0}\n" + OK),
    ("limit -5", ".yaml", "dataset: {limit: -5}\n" + OK),
    ("limit 2.5", ".yaml", "dataset: {limit: 2.5}\n" + OK),
    ("batch_size 0", ".yaml", "batch_size: 0\n" + OK),
    ("batch_size 1e12", ".yaml", "batch_size: 1000000000000\n" + OK),
    ("device tpu", ".yaml", "device: tpu\n" + OK),
    ("split validation", ".yaml", "dataset: {split: validation}\n" + OK),
    ("unknown dataset", ".yaml", "dataset: {name: imagenet}\n" + OK),
    ("dataset path missing", ".yaml", "dataset: {name: mnist, path: /nonexistent}\n" + OK),
    ("unknown zoo model", ".yaml", "model: {name: resnet-9000}\n" + OK),
    ("zoo + mean (ignored)", ".yaml", "model: {name: mnist-cnn, mean: [0.5]}\n" + OK),
    ("zoo + path (ignored)", ".yaml", "model: {name: mnist-cnn, path: x.pt}\n" + OK),
    ("zoo + input_shape", ".yaml", "model: {name: mnist-cnn, input_shape: [1, 28, 28]}\n" + OK),
    ("zoo + num_classes", ".yaml", "model: {name: mnist-cnn, num_classes: 10}\n" + OK),
    ("zoo + gradients", ".yaml", "model: {name: mnist-cnn, gradients: true}\n" + OK),
    ("zoo + timeout", ".yaml", "model: {name: mnist-cnn, timeout: 5}\n" + OK),
    (
        "std 0",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [1,28,28], std: [0]}\n" + OK,
    ),  # fmt: skip
    (
        "std negative",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [1,28,28], std: [-1]}\n" + OK,
    ),  # fmt: skip
    (
        "mean .nan",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [1,28,28], mean: [.nan]}\n" + OK,
    ),  # fmt: skip
    (
        "mean per channel mismatch",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [3,8,8], mean: [0.1, 0.2]}\n" + OK,
    ),  # fmt: skip
    (
        "input_shape 0",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [0,28,28]}\n",
    ),
    (
        "input_shape 2-d",
        ".yaml",
        "model: {source: torchscript, path: m.pt, input_shape: [28,28]}\n",
    ),
    ("num_classes 1", ".yaml", "model: {source: onnx, path: m.onnx, num_classes: 1}\n" + OK),
    ("checkpoint without path", ".yaml", "model: {source: checkpoint}\n" + OK),
    ("remote without url", ".yaml", "model: {name: m, source: remote}\n" + OK),
    ("remote timeout 0", ".yaml", "model: {source: remote, url: 'http://x', timeout: 0}\n" + OK),
    ("remote retries 1000", ".yaml", "model: {source: remote, url: 'http://x', retries: 1000}\n"),
    (
        "remote + std (ignored)",
        ".yaml",
        "model: {name: m, source: remote, url: 'http://x', std: [1]}\n",
    ),
    (
        "remote unreachable",
        ".yaml",
        "model: {name: m, source: remote, url: 'http://127.0.0.1:9', "
        "input_shape: [1,28,28], num_classes: 10, timeout: 1, retries: 0}\n" + OK,
    ),  # fmt: skip
    ("unknown source", ".yaml", "model: {source: hub}\n" + OK),
    ("unknown defense", ".yaml", "defenses: [jpg]\n" + OK),
    ("defense bad setting", ".yaml", "defenses: [{name: jpeg, config: {quality: 500}}]\n" + OK),
    ("metric needs reference", ".yaml", "metrics: [cav]\n"),
    ("limits steps 0", ".yaml", "limits: {steps: 0}\n" + OK),
    ("attacks as mapping", ".yaml", "attacks: {fgsm: 0.1}\n" + OK),
    ("metrics as string", ".yaml", "metrics: ca\n"),
    ("int key", ".yaml", "1: 2\n" + OK),
    ("null attack", ".yaml", "attacks: [~]\n" + OK),
    ("huge plan file", ".yaml", "# " + "x" * (2 << 20) + "\n" + OK),
]


def _net(kind: str) -> torch.nn.Module:
    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = x.flatten(1)[:, :10] * 0.0
            if kind == "nan":
                return out + float("nan")
            if kind == "inf":
                return out + float("inf")
            if kind == "some-nan":  # NaN for the brighter images only
                return torch.where(x.mean((1, 2, 3))[:, None] > 0.13, float("nan"), out)
            if kind == "3-classes":
                return out[:, :3]
            if kind == "1-d":
                return out.sum(1)
            if kind == "3-d":
                return out[:, None, :]
            if kind == "fixed-batch":  # fails on any batch but the traced one
                return x.reshape(2, 784)[:, :10] * 0.0
            return out

    return Net()


def _model_files(folder: Path) -> list[tuple[str, str]]:
    """(label, model section) for each faulty model; the files are written to ``folder``."""
    cases = []
    for kind in ("valid", "nan", "inf", "some-nan", "3-classes", "1-d", "3-d", "fixed-batch"):
        path = folder / f"{kind}.ts"
        torch.jit.save(torch.jit.trace(_net(kind), torch.rand(2, 1, 28, 28)), path)
        label = "valid: zero-score TorchScript" if kind == "valid" else f"TorchScript {kind}"
        cases.append((label, f"{{source: torchscript, path: '{path}', input_shape: [1,28,28], "
                             "num_classes: 10}"))  # fmt: skip
    state = torch.load(Path(__file__).parents[1] / "database/zoo/mnist-cnn.pt", weights_only=True)
    raw = io.BytesIO()
    torch.save(state, raw)
    files = {
        "junk.pt": b"not a checkpoint",
        "empty.pt": b"",
        "truncated.pt": raw.getvalue()[: len(raw.getvalue()) // 2],
        "good.pt": raw.getvalue(),
    }
    torch.save([1, 2, 3], folder / "list.pt")
    torch.save({"weight": torch.zeros(3)}, folder / "wrong-keys.pt")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    ckpt = "{{source: checkpoint, path: '{p}', architecture: {a}, input_shape: {s}}}"
    for name in ("junk.pt", "empty.pt", "truncated.pt", "list.pt", "wrong-keys.pt"):
        shape = "[1,28,28]"
        cases.append((f"checkpoint {name}", ckpt.format(p=folder / name, a="mnist-cnn", s=shape)))
    for label, name, arch, shape in (
        ("valid: checkpoint", "good.pt", "mnist-cnn", "[1,28,28]"),
        ("checkpoint wrong architecture", "good.pt", "mnist-cnn-strided", "[1,28,28]"),
        ("checkpoint unknown architecture", "good.pt", "resnet-9000", "[1,28,28]"),
        ("checkpoint input_shape 3x32x32", "good.pt", "mnist-cnn", "[3,32,32]"),
        ("checkpoint missing file", "nope.pt", "mnist-cnn", "[1,28,28]"),
    ):
        cases.append((label, ckpt.format(p=folder / name, a=arch, s=shape)))
    (folder / "junk.ts").write_bytes(b"PK junk")
    cases.append(("TorchScript junk", f"{{source: torchscript, path: '{folder / 'junk.ts'}', "
                                      "input_shape: [1,28,28]}"))  # fmt: skip
    (folder / "junk.onnx").write_bytes(b"\x08\x01junk")
    cases.append(("ONNX junk", f"{{source: onnx, path: '{folder / 'junk.onnx'}'}}"))
    return cases


def _dataset_folders(folder: Path) -> list[tuple[str, str]]:
    """(label, dataset section) for damaged MNIST folders."""
    given = os.environ.get("AISAFETY_SHARED_DATA")
    source = Path(given) / "mnist" if given else located("mnist")
    cases = []
    if source is None or not source.is_dir():
        missing = f"{source} is absent" if given else absent("mnist")
        print(f"{missing}: the damaged-dataset cases are skipped", file=sys.stderr)
        return cases
    for label, damage in (
        ("IDX .gz truncated", lambda b: b[: len(b) // 3]),
        ("IDX .gz junk", lambda b: b"junk" * 100),
        ("IDX decompressed truncated", lambda b: gzip.compress(gzip.decompress(b)[:-500])),
    ):
        target = folder / label.replace(" ", "_")
        shutil.copytree(source, target)
        images = target / "t10k-images-idx3-ubyte.gz"
        images.write_bytes(damage(images.read_bytes()))
        cases.append((label, f"{{name: mnist, path: '{target}'}}"))
    return cases


class Runaway(Exception):
    pass


def _on_alarm(_signum, _frame):
    raise Runaway


def classify(argv: list[str], should_fail: bool) -> tuple[str, str]:
    """Run the CLI in this process: (outcome, first line of stderr)."""
    err = io.StringIO()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(60)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except Runaway:
        return "runaway", ""
    except BaseException as exc:  # noqa: BLE001 - a traceback is what this counts
        return "traceback", f"{type(exc).__name__}: {exc}"[:150]
    finally:
        signal.alarm(0)
    line = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
    if code == 0:
        return ("silent acceptance" if should_fail else "accepted"), line
    if code == 2 and "Traceback" not in err.getvalue() and "error:" in err.getvalue():
        return ("clear error" if should_fail else "error on a valid input"), line
    return "traceback", line


def run_cases(folder: Path) -> list[tuple[str, str, str, str]]:
    db = f"sqlite:///{folder / 'r.db'}"
    rows = []
    cases = [(f"plan: {label}", suffix, content) for label, suffix, content in PLANS]
    cases += [(f"model: {label}", ".yaml", f"model: {section}\n" + OK)
              for label, section in _model_files(folder)]  # fmt: skip
    cases += [(f"data: {label}", ".yaml", f"dataset: {section}\n" + OK)
              for label, section in _dataset_folders(folder)]  # fmt: skip
    for i, (label, suffix, content) in enumerate(cases):
        path = folder / f"plan{i}{suffix}"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        argv = ["evaluate", str(path), "--db", db, "--quiet", "--device", "cpu"]
        if "dataset:" not in str(content)[:200] and "limit" not in str(content):
            argv += ["--limit", "10"]
        outcome, line = classify(argv, should_fail="valid:" not in label)
        rows.append((label.split(":")[0], label, outcome, line))
    for flag in ("-5", "0"):
        outcome, line = classify(["evaluate", "--limit", flag, "--db", db], True)
        rows.append(("cli", f"cli: --limit {flag}", outcome, line))
    return rows


def query_cases(folder: Path) -> list[tuple[str, str, str, str]]:
    db = folder / "r.db"
    statements = [
        "DROP TABLE sample_outcomes", "DELETE FROM metric_values", "UPDATE runs SET status='x'",
        "INSERT INTO runs (id) VALUES (99)", "CREATE TABLE t (x)", "CREATE TEMP TABLE t (x)",
        "DROP VIEW results", "ALTER TABLE runs ADD COLUMN y", f"ATTACH '{folder}/a.db' AS a",
        f"VACUUM INTO '{folder}/copy.db'", "VACUUM", "PRAGMA journal_mode=DELETE",
        "PRAGMA user_version=5", "BEGIN", "REINDEX",
    ]  # fmt: skip
    rows = []
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM metric_values").fetchone()
    for sql in statements:
        outcome, line = classify(["query", "--db", f"sqlite:///{db}", sql], True)
        rows.append(("query", f"query: {sql}", outcome, line))
    after = sqlite3.connect(db).execute("SELECT COUNT(*) FROM metric_values").fetchone()
    files = [p for p in ("a.db", "copy.db") if (folder / p).exists()]
    assert before == after and not files, (before, after, files)
    outcome, line = classify(["query", "--db", f"sqlite:///{folder}/typo.db", "SELECT 1"], True)
    rows.append(("query", "query: --db to a missing file", outcome, line))
    return rows


# The outcomes of the cases above in the categories of issue #35 (Reliability III).
CATEGORY = {
    "clear error": "clear", "accepted": "valid ok", "silent acceptance": "silent",
    "error on a valid input": "unclear", "traceback": "traceback", "runaway": "runaway",
}  # fmt: skip
COLUMNS = ("clear", "unclear", "traceback", "runaway", "silent", "corrupted", "valid ok")


def main_() -> None:
    from reliability_iii import all_cases  # beside this file

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = [(g, label, CATEGORY[o], line) for g, label, o, line in run_cases(folder)]
        rows += [(g, label, CATEGORY[o], line) for g, label, o, line in query_cases(folder)]
        rows += all_cases(folder)
    width = max(len(r[1]) for r in rows)
    for _group, label, outcome, line in rows:
        print(f"{label[:width]:<{width}}  {outcome:<10} {line[:110]}")
    print(f"\n{'group':<8}{'cases':>6}" + "".join(f"{c:>11}" for c in COLUMNS))
    for group in [*dict.fromkeys(r[0] for r in rows), None]:
        outcomes = [r[2] for r in rows if group is None or r[0] == group]
        counts = "".join(f"{outcomes.count(c):>11}" for c in COLUMNS)
        print(f"{group or 'all':<8}{len(outcomes):>6}{counts}")
    bad = [r for r in rows if r[2] not in ("clear", "valid ok")]
    print(f"\nunclear, tracebacks, runaways, silent acceptances, corrupted: {len(bad)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main_()
