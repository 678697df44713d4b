"""The cases of issue #35 (Reliability III) for bench/reliability.py: plugins that tamper
with or crash a run, special files, silent acceptances, network bounds and, where
PostgreSQL is installed, ``aisafety query`` on a real server; the last finding-7 cases
(coverage without its profile data, damaged archives, a metric's +inf or negative count, a
random model) and, where Ray is installed, a driver refused for authentication.

Each case returns (group, label, outcome, line) with outcome one of: clear, unclear (an
error, but its message misses what it should name), traceback, runaway (past its limit
plus 10 %), silent (accepted although wrong), corrupted (another unit's stored numbers
changed), or accepted (a valid control).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sqlite3
import struct
import sys
import threading
import time
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import aisafety.cli as cli
import aisafety.runner as runner
from aisafety.attack.fgsm import FGSM
from aisafety.cli import common
from aisafety.evaluation.base import CleanMetric
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import Direction, MetricValue
from aisafety.plugins import build_registry
from aisafety.prediction.remote import RemotePredictor
from aisafety.prediction.server import make_server
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.prediction.watch import model_tensors

Row = tuple[str, str, str, str]
OK = "metrics: [ca]\n"
# (label, plan, what the error must name)
PLANS = [
    ("steps '3'", "attacks: [{name: pgd-linf, config: {steps: '3'}}]\n" + OK, "string '3'"),
    ("steps true", "attacks: [{name: pgd-linf, config: {steps: true}}]\n" + OK, "not true"),
    ("step_size .nan", "attacks: [{name: pgd-linf, config: {step_size: .nan}}]\n" + OK, "NaN"),
    ("attack seed -1", "attacks: [{name: fgsm, config: {seed: -1}}]\n" + OK, "seed"),
    ("apgd-t 50 targets on 10 classes",
     "attacks: [{name: apgd-t, config: {n_target_classes: 50}}]\n" + OK, "10 classes"),
    ("seed beside seeds", "seed: 3\nseeds: [0, 1]\n" + OK, "both seed"),
    ("metrics [ca, ca]", "metrics: [ca, ca]\n", "listed twice"),
    ("'fgsm '", "attacks: ['fgsm ']\n" + OK, "spaces around it"),
    ("eps 1.0000001", "attacks: [{name: fgsm, eps: 1.0000001}]\n" + OK, "eps=1.0000001"),
    ("remote file:// url", "model: {name: m, source: remote, url: 'file:///etc/passwd', "
     "input_shape: [1,28,28], num_classes: 10}\n" + OK, "scheme 'file'"),
    ("5,000 seeds", f"seeds: {list(range(5000))}\n" + OK, "limits: {seeds: 5000}"),
    ("smoothing n 1e12",
     "metrics: [{name: smoothed-certified-accuracy, config: {n: 1000000000000}}]\n", "samples"),
    ("eot_samples 1e9", "defenses: [{name: jpeg, config: {eot_samples: 1000000000}}]\n" + OK,
     "eot_samples"),
    ("nattack population 1e9",
     "attacks: [{name: nattack, config: {population: 1000000000}}]\n" + OK, "population"),
    ("nattack population 1e9 with its limit raised",
     "attacks: [{name: nattack, config: {population: 1000000000}}]\n"
     "limits: {population: 1000000000}\n" + OK, "GiB"),
]  # fmt: skip


class WeightScaler(FGSM):
    name = "weight-scaler"

    def perturb(self, predictor, x, y, eps, call):
        for tensor in model_tensors(predictor).values():
            tensor.data.mul_(0)
        return super().perturb(predictor, x, y, eps, call)


class ContextWriter(CleanMetric):
    name = "ctx-writer"

    def compute(self, ctx):
        ctx.x[:] = 0
        ctx.y[:] = 0
        ctx.clean_logits.zero_()
        return MetricValue(metric=self.name, value=1.0, direction="higher", n_samples=1)


class Crashing(FGSM):
    name = "crashing"

    def perturb(self, predictor, x, y, eps, call):
        return 1 / 0


def _plugin(name: str, **hooks) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(module, hook, hookimpl(function))
    return module


@contextlib.contextmanager
def _registry(*plugins: tuple[str, types.ModuleType]):
    registry = build_registry(list(plugins))
    saved = common.default_registry, runner.default_registry
    common.default_registry = runner.default_registry = lambda: registry
    try:
        yield registry
    finally:
        common.default_registry, runner.default_registry = saved


def _run(argv: list[str], limit_s: float = 120.0) -> tuple[int | None, str, float]:
    err = io.StringIO()
    start = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except BaseException as exc:  # noqa: BLE001 - a traceback is what this counts
        return None, f"{type(exc).__name__}: {exc}"[:150], time.monotonic() - start
    lines = err.getvalue().strip().splitlines()
    return code, (lines[-1] if lines else ""), time.monotonic() - start


def _judge(code: int | None, line: str, expect: str, elapsed: float = 0, limit: float = 0) -> str:
    if limit and elapsed > limit * 1.1:
        return "runaway"
    if code is None:
        return "traceback"
    if code == 0:
        return "silent"
    if code != 2 or "Traceback" in line:
        return "traceback"
    return "clear" if expect in line else "unclear"


def plan_cases(folder: Path, db: str) -> list[Row]:
    rows = []
    for i, (label, content, expect) in enumerate(PLANS):
        path = folder / f"iii-{i}.yaml"
        path.write_text(content)
        code, line, _ = _run(["evaluate", str(path), "--db", db, "--quiet", "--limit", "8",
                              "--device", "cpu"])  # fmt: skip
        rows.append(("plan", f"plan: {label}", _judge(code, line, expect), line))
    return rows


def file_cases(folder: Path, db: str) -> list[Row]:
    """Special files as plan, checkpoint and npz dataset, and an empty npz."""
    fifo, directory = folder / "fifo.yaml", folder / "dir.yaml"
    os.mkfifo(fifo)
    directory.mkdir()
    np.savez(folder / "empty.npz", x=np.zeros((0, 1, 28, 28), np.float32), y=np.zeros(0, int))
    rows = []
    for label, path, expect in (("FIFO", fifo, "FIFO"), ("folder", directory, "folder"),
                                ("/dev/zero", Path("/dev/zero"), "character device")):  # fmt: skip
        code, line, elapsed = _run(["evaluate", str(path), "--db", db])
        rows.append(("files", f"plan: {label}", _judge(code, line, expect, elapsed, 10), line))
        for what, section in (
            ("checkpoint", f"model: {{source: checkpoint, path: '{path}', architecture: "
                           "mnist-cnn, input_shape: [1,28,28], num_classes: 10}"),
            ("npz", f"dataset: {{name: npz, path: '{path}'}}"),
        ):  # fmt: skip
            expect_here = "folder without" if what == "npz" and label == "folder" else expect
            plan = folder / f"file-{what}-{label.strip('/').replace('/', '-')}.yaml"
            plan.write_text(section + "\n" + OK)
            code, line, elapsed = _run(["evaluate", str(plan), "--db", db, "--device", "cpu"])
            judged = _judge(code, line, expect_here, elapsed, 10)
            rows.append(("files", f"{what}: {label}", judged, line))
    plan = folder / "empty-npz.yaml"
    plan.write_text(f"dataset: {{name: npz, path: '{folder / 'empty.npz'}'}}\n" + OK)
    code, line, _ = _run(["evaluate", str(plan), "--db", db, "--device", "cpu"])
    rows.append(("files", "npz: no samples", _judge(code, line, "no samples"), line))
    huge = folder / "huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(2 << 30)
    code, line, elapsed = _run(["evaluate", str(huge), "--db", db])
    rows.append(("files", "plan: 2 GiB (sparse)", _judge(code, line, "bytes", elapsed, 5), line))
    return rows


def _stored(path: Path) -> dict:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT metric, attack, eps, value FROM results").fetchall()
    return {(m, a, e): v for m, a, e, v in rows if a in ("fgsm", "pgd-linf")}


def plugin_cases(folder: Path) -> list[Row]:
    """Careless plugins beside fgsm and pgd: they must fail alone, not change the others."""
    base = ("dataset: {{limit: 24}}\ndevice: cpu\nmetrics: [ca, aaw{extra}]\n"
            "attacks: [{{name: fgsm, eps: [0.1]}}, {attack}{{name: pgd-linf, "
            "config: {{steps: 3}}, eps: [0.1]}}]\n")  # fmt: skip
    reference = folder / "plugins-reference.db"
    (folder / "reference.yaml").write_text(base.format(extra="", attack=""))
    _run(["evaluate", str(folder / "reference.yaml"), "--db", f"sqlite:///{reference}"])
    expected = _stored(reference)
    module = _plugin("careless", aisafety_attacks=lambda: [WeightScaler, Crashing],
                     aisafety_metrics=lambda: [ContextWriter])  # fmt: skip
    rows = []
    for label, extra, attack, code_ok in (
        ("attack scaling the weights by 0", "", "{name: weight-scaler, eps: [0.1]}, ", 1),
        ("metric writing ctx.x, ctx.y, clean logits", ", ctx-writer", "", 1),
        ("attack raising ZeroDivisionError", "", "{name: crashing, eps: [0.1]}, ", 2),
    ):
        plan, db = folder / f"plugin-{len(rows)}.yaml", folder / f"plugin-{len(rows)}.db"
        plan.write_text(base.format(extra=extra, attack=attack))
        with _registry(("careless", module)):
            code, line, _ = _run(["evaluate", str(plan), "--db", f"sqlite:///{db}"])
        stored = _stored(db)
        if code is None:
            outcome = "traceback"
        elif any(stored[k] != v for k, v in expected.items() if k in stored):
            outcome = "corrupted"
        elif code == 0:
            outcome = "silent"
        else:
            outcome = "clear" if code == code_ok else "unclear"
        rows.append(("plugin", f"plugin: {label}", outcome, line))
    (folder / "exits.py").write_text("import sys\nsys.exit(3)\n")
    for label, plugin in (
        ("SystemExit in a hook", _plugin("exits", aisafety_attacks=lambda: sys.exit(3))),
        ("hook returning [42, 'not-a-class']",
         _plugin("junk", aisafety_attacks=lambda: [42, "not-a-class"])),
    ):  # fmt: skip
        try:
            with _registry((label, plugin)) as registry:
                db = f"sqlite:///{folder / 'p.db'}"
                code, line, _ = _run(["evaluate", "--limit", "8", "--db", db, "--device", "cpu"])
            failed = [f.name for f in registry.failures] == [label]
            outcome = "clear" if code == 0 and failed else "unclear"
        except BaseException as exc:  # noqa: BLE001
            outcome, line = "traceback", f"{type(exc).__name__}: {exc}"
        rows.append(("plugin", f"plugin: {label}", outcome, line))
    return rows


def _one_shot(behaviour: Callable[[socket.socket], None]) -> str:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run() -> None:
        connection, _ = listener.accept()
        with connection, listener, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            behaviour(connection)

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def network_cases() -> list[Row]:
    rows = []
    model = TorchPredictor(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)),
                           (1, 2, 2), 3, name="m")  # fmt: skip
    with make_server(model, port=0, max_batch_size=8) as server:
        server.request_timeout = 2.0
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 1500000000\r\n\r\n")
            answer = sock.recv(65536).decode(errors="replace")
        outcome = "clear" if " 413 " in answer.splitlines()[0] else "unclear"
        rows.append(("network", "serve: 1.5 GB body announced", outcome, answer.splitlines()[0]))
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\n")
            start = time.monotonic()
            closed = sock.recv(65536) == b""
            elapsed = time.monotonic() - start
        outcome = "clear" if closed and elapsed <= 2.2 else "runaway"
        rows.append(("network", "serve: silent client (2 s timeout)", outcome, f"{elapsed:.2f} s"))

    def trickle(connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            connection.sendall(b" ")
            time.sleep(0.2)

    def flood(connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for _ in range(3 * 1024):
            connection.sendall(b"0" * (1 << 20))

    remotes = (
        ("remote trickling 5 bytes/s (2 s timeout)", trickle, "did not finish"),
        ("remote answering 3 GB", flood, "answered more than"),
    )
    for label, behaviour, expect in remotes:
        remote = RemotePredictor(_one_shot(behaviour), "m", (1, 2, 2), 3, input_name="x",
                                 timeout=2.0, retries=0)  # fmt: skip
        start = time.monotonic()
        try:
            remote.logits(torch.rand(1, 1, 2, 2))
            outcome, line = "silent", ""
        except Exception as exc:  # noqa: BLE001
            line = str(exc)
            outcome = "clear" if expect in line else "unclear"
        if time.monotonic() - start > 2.2:
            outcome = "runaway"
        rows.append(("network", label, outcome, line))
    return rows


def postgres_cases() -> list[Row]:
    """``aisafety query`` against a real PostgreSQL server (skipped where none is installed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
    from postgres_server import find_bindir, start_postgres

    if find_bindir() is None:
        print("PostgreSQL is not installed: the query cases on PostgreSQL are skipped",
              file=sys.stderr)  # fmt: skip
        return []
    from sqlalchemy import text

    from aisafety.store.results import ResultStore

    server = start_postgres()
    try:
        url = server.create_database()
        _run(["evaluate", "--limit", "8", "--db", url, "--device", "cpu"])
        engine = ResultStore(url).engine

        def count() -> int:
            with engine.connect() as connection:
                return connection.execute(text("SELECT COUNT(*) FROM metric_values")).scalar_one()

        rows, before = [], count()
        for sql in ("SELECT 1; COMMIT; DROP TABLE metric_values CASCADE",
                    "SELECT 1; COMMIT; DELETE FROM metric_values"):  # fmt: skip
            code, line, _ = _run(["query", "--db", url, sql])
            outcome = _judge(code, line, "one SQL statement")
            rows.append(
                ("pg", f"query: {sql}", "corrupted" if count() != before else outcome, line)
            )
        code, line, elapsed = _run(
            ["query", "--db", url, "SELECT pg_sleep(3600)", "--timeout", "2"]
        )
        rows.append(("pg", "query: pg_sleep(3600), --timeout 2",
                     _judge(code, line, "timeout of 2 s", elapsed, 2), line))  # fmt: skip
        return rows
    finally:
        server.stop()


class Infinite(CleanMetric):
    name = "infinite"
    direction = Direction.HIGHER

    def compute(self, ctx):
        return [self.value(float("inf"), len(ctx.y))]


class NegativeCount(CleanMetric):
    name = "negative-count"
    direction = Direction.HIGHER

    def compute(self, ctx):
        return [self.value(0.5, -5)]


class Noisy(torch.nn.Module):
    """A classifier that draws noise in its forward pass: two passes of a batch differ."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(784, 10)

    def forward(self, x):
        logits = self.linear(x.flatten(1))
        return logits + torch.randn_like(logits)


def _flipped_archive(path: Path, module: torch.nn.Module, script: bool) -> Path:
    """``module`` saved (TorchScript or state dict) with its first tensor byte flipped."""
    if script:
        torch.jit.save(torch.jit.script(module), str(path))
    else:
        torch.save(module.state_dict(), path)
    with zipfile.ZipFile(path) as archive:
        member = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26 :][:4])
    data[member.header_offset + 30 + name_length + extra_length] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _values_of(db: Path, metric: str) -> int:
    with sqlite3.connect(db) as connection:
        sql = "SELECT COUNT(*) FROM metric_values WHERE metric = ?"
        return connection.execute(sql, (metric,)).fetchone()[0]


def finding_seven_cases(folder: Path) -> list[Row]:
    """The four finding-7 cases finished in the second session: coverage with a missing
    profile dataset, a damaged archive, a metric's +inf or negative count, a random model."""
    from aisafety.database.architectures import build

    missing = folder / "no-profile.npz"
    profile = f"profile_dataset: {{name: npz, path: '{missing}'}}\n"
    cnn = build("mnist-cnn")
    torchscript = _flipped_archive(folder / "flipped.ts", cnn, script=True)
    checkpoint = _flipped_archive(folder / "flipped.pt", cnn, script=False)
    cases = [
        ("coverage, missing profile dataset, no attacks", profile + "metrics: [kmncov]\n",
         "read the adversarial examples"),
        ("coverage, missing profile dataset", profile + "attacks: [{name: fgsm, eps: [0.1]}]\n"
         "metrics: [kmncov, robust-accuracy]\n", "could not load the profile data"),
        ("TorchScript archive with a flipped byte", f"model: {{source: torchscript, path: "
         f"'{torchscript}', input_shape: [1,28,28]}}\n" + OK, "fails the zip archive's CRC"),
        ("checkpoint with a flipped byte", f"model: {{source: checkpoint, path: '{checkpoint}',"
         " architecture: mnist-cnn, input_shape: [1,28,28], num_classes: 10}\n" + OK,
         "fails the zip archive's CRC"),
    ]  # fmt: skip
    rows = []
    for i, (label, content, expect) in enumerate(cases):
        plan = folder / f"seven-{i}.yaml"
        plan.write_text(content)
        code, line, _ = _run(["evaluate", str(plan), "--db", f"sqlite:///{folder / 's.db'}",
                              "--limit", "8", "--device", "cpu"])  # fmt: skip
        rows.append(("values", label, _judge(code, line, expect), line))
    module = _plugin("buggy", aisafety_metrics=lambda: [Infinite, NegativeCount])
    for metric, expect, label in (
        ("infinite", "infinite = inf", "metric returning +inf"),
        ("negative-count", "n_samples = -5", "metric returning n_samples = -5"),
    ):
        db = folder / f"{metric}.db"
        plan = folder / f"{metric}.yaml"
        plan.write_text(f"metrics: [ca, {metric}]\n")
        with _registry(("buggy", module)):
            code, line, _ = _run(["evaluate", str(plan), "--db", f"sqlite:///{db}",
                                  "--limit", "8", "--device", "cpu"])  # fmt: skip
        outcome = "silent" if _values_of(db, metric) else _judge(code, line, expect)
        rows.append(("values", label, outcome, line))
    noisy = folder / "noisy.ts"
    torch.jit.save(torch.jit.script(Noisy()), str(noisy))
    plan = folder / "noisy.yaml"
    plan.write_text(f"model: {{name: noisy, source: torchscript, path: '{noisy}', "
                    "input_shape: [1,28,28]}\n" + OK)  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["evaluate", str(plan), "--db", f"sqlite:///{folder / 'n.db'}",
                         "--limit", "8", "--device", "cpu"])  # fmt: skip
    warned = [w for w in err.getvalue().splitlines() if "is not deterministic" in w]
    named = code == 0 and warned and "model 'noisy'" in warned[0] and "differ by up to" in warned[0]
    rows.append(("values", "model drawing noise in forward (a warning)",
                 "clear" if named else "silent", (warned or [""])[0]))  # fmt: skip
    return rows


def ray_cases(folder: Path) -> list[Row]:
    """The driver command of docs/scale-out.md without the cluster's token, and with another
    one, against a real two-node cluster (skipped without Ray)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        print("Ray is not installed: the authentication cases are skipped", file=sys.stderr)
        return []
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
    import subprocess

    from ray_cluster import start_ray_cluster

    cluster = start_ray_cluster(timeout=300)
    rows = []
    try:
        plan = folder / "ray.yaml"
        plan.write_text("dataset: {limit: 8}\n" + OK)
        for label, token, expect in (
            ("driver without RAY_AUTH_TOKEN", None, "is not set"),
            ("driver with another token", "x" * 64, "not the cluster's"),
        ):
            env = {**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address}
            env.pop("RAY_AUTH_TOKEN")
            if token:
                env["RAY_AUTH_TOKEN"] = token
            start = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "aisafety.cli", "evaluate", str(plan), "--executor", "ray",
                 "--address", "auto", "--db", f"sqlite:///{folder / 'ray.db'}"],
                capture_output=True, text=True, env=env, timeout=600, start_new_session=True,
            )  # fmt: skip
            line = (done.stderr.strip().splitlines() or [""])[-1]
            judged = _judge(done.returncode, line, expect, time.monotonic() - start, 120)
            if "Traceback" in done.stderr or "RAY_AUTH_MODE=token" not in line:
                judged = "traceback" if "Traceback" in done.stderr else "unclear"
            rows.append(("ray", f"ray: {label}", judged, line))
    finally:
        cluster.stop()
    return rows


def all_cases(folder: Path) -> list[Row]:
    db = f"sqlite:///{folder / 'iii.db'}"
    return (plan_cases(folder, db) + file_cases(folder, db) + plugin_cases(folder)
            + finding_seven_cases(folder) + network_cases() + postgres_cases()
            + ray_cases(folder))  # fmt: skip
