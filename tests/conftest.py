"""Shared fixtures: the shipped zoo model and the embedded MNIST subset (both loaded once)."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

# Idle OpenMP threads (onnxruntime's, torch's) spin-wait by default and starve each other
# on 2 cores; set before torch or onnxruntime start their thread pools.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# `aisafety list` answers from a cache keyed by the installed code (aisafety/listing_cache.py);
# tests swap registries in-process, so the suite lists live (tests/test_startup.py tests it)
os.environ["AISAFETY_LIST_CACHE"] = "0"
# testkit/: what the tests share with the benches (the PostgreSQL and Ray launchers, the
# reference corruptions), beside tests/ so a bench need not import tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
# Every process the suite starts inherits this mark; pytest_sessionfinish finds the survivors
from children import SESSION_VARIABLE, leftovers  # noqa: E402
from run_ledger import run_ledger  # noqa: E402

# Default memory budgets are claimed in a ledger shared by a user's processes
# (aisafety/memory_ledger.py): one per test run (testkit/run_ledger.py)
os.environ.setdefault("AISAFETY_MEMORY_LEDGER", run_ledger())

os.environ[SESSION_VARIABLE] = f"{os.getpid()}-{uuid.uuid4().hex}"

import pytest
import torch

from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.memory import open_blocks
from aisafety.prediction.torch_module import TorchPredictor


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process started by the suite outlives it: survivors are named, killed, and fail the
    run (after every fixture's teardown, so servers a fixture stops are already gone)."""
    token = os.environ[SESSION_VARIABLE]
    deadline = time.monotonic() + 60  # servers stopped at teardown (Ray, PostgreSQL) may
    while leftovers(token) and time.monotonic() < deadline:  # take a few seconds to exit
        time.sleep(0.5)
    survivors = leftovers(token)
    for pid, _ in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if survivors:
        listing = "\n".join(f"  pid {pid}: {command[:200]}" for pid, command in survivors)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"processes the test suite started were alive at its end (killed):\n{listing}"
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    ledger = os.environ["AISAFETY_MEMORY_LEDGER"]
    if ledger == run_ledger() and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(ledger, ignore_errors=True)  # the run's own (else one per run piles up)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's end: pytest then runs 5 full garbage collections (to report unraisable
    exceptions from cycles) and the interpreter more at exit, each a walk over every object
    the run still holds (0.5-0.6 s per walk at 436,000 objects after test_contract.py; more
    after a long chunk). Collected here until nothing unreachable is left (an exception in a
    finalizer is still reported: pytest's hook is in place until after this), then the
    survivors are frozen, so the passes after skip them. What they would still have found:
    cycles that become garbage only as the interpreter exits, whose ``__del__`` Python does
    not promise to run anyway."""
    for _ in range(5):
        if not gc.collect():
            break
    gc.freeze()


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """A run started in a test is finished in it: its heartbeat thread (liveness.py) would
    otherwise go on renewing the lease in a database the test has deleted or whose server
    has stopped ("heartbeat of run 1 failed: ... AdminShutdown" after the suite)."""
    before = set(threading.enumerate())
    yield
    left = [
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith("aisafety-heartbeat-") and t.is_alive()
    ]
    assert not left, f"runs left running (finish_run them in the test): {left}"


@pytest.fixture(autouse=True)
def no_memory_block_outlives_its_test():
    """A ``reuse_freed_memory`` block (aisafety/memory.py) opened in a test is closed by its
    end: one left open keeps glibc's thresholds raised and the heap untrimmed for the rest of
    the process (a notebook's, a Ray worker's). Compared with the count before the test, so
    only the test that left it open fails."""
    before = open_blocks()
    yield
    assert open_blocks() == before, "a reuse_freed_memory block was left open"


@pytest.fixture(scope="session")
def zoo_predictor() -> TorchPredictor:
    """The shipped ``mnist-cnn`` zoo model on the CPU (sha256-checked on load)."""
    return load_zoo_model("mnist-cnn")


@pytest.fixture(scope="session")
def embedded_mnist() -> LoadedDataset:
    """The 1,000 MNIST test images shipped in the package (100 per class)."""
    return EmbeddedMnist().load(None, "test")


@pytest.fixture(scope="session")
def zoo_pgd40_survivors(embedded_mnist: LoadedDataset):
    """``survivors(name, eps)``: which of the 200 robustness images (every 5th of the embedded
    1,000, the zoo's cheap subset) the zoo entry ``name`` still classifies right under the
    zoo's PGD-40 at l-inf ``eps`` (``zoo_build.pgd_robust_accuracy``: seed 0, step 2.5 eps /
    40). Seeded, so one run per (name, eps) serves every test that checks it against the
    entry's record: test_zoo.py (every MNIST entry) and test_paper_defenses.py /
    test_parseval_deep_defense_ensemble_at.py (5 of them at the same budget) ran it twice."""
    from aisafety.attack.pgd import PGDLinf

    x, y = embedded_mnist.x[::5], embedded_mnist.y[::5]
    runs: dict[tuple[str, float], torch.Tensor] = {}

    def survivors(name: str, eps: float) -> torch.Tensor:
        if (name, eps) not in runs:
            result = PGDLinf({"steps": 40})(load_zoo_model(name), x, y, eps)
            runs[(name, eps)] = result.adv_pred == y
        return runs[(name, eps)].clone()

    return survivors


@pytest.fixture(scope="module")
def linear(embedded_mnist: LoadedDataset) -> TorchPredictor:
    """A least-squares linear classifier fitted on the embedded MNIST set (fast to query);
    one per test module, as each module built its own before."""
    data = embedded_mnist
    features = torch.cat([data.x.flatten(1), torch.ones(len(data), 1)], 1).double()
    targets = torch.nn.functional.one_hot(data.y, 10).double()
    gram = features.T @ features + torch.eye(features.shape[1], dtype=torch.double)
    solution = torch.linalg.solve(gram, features.T @ targets).float()
    layer = torch.nn.Linear(784, 10)
    with torch.no_grad():
        layer.weight.copy_(solution[:784].T)
        layer.bias.copy_(solution[784])
    network = torch.nn.Sequential(torch.nn.Flatten(), layer)
    return TorchPredictor(network, (1, 28, 28), 10, name="linear")


@pytest.fixture(scope="session")
def mnist_subset(embedded_mnist: LoadedDataset):
    """``mnist_subset(n)``: a class-balanced, seeded subset of the embedded data.

    ``x[:n]`` of the embedded file (in test-set order) is not class-balanced for small n.
    """

    def subset(n: int, seed: int = 0) -> LoadedDataset:
        return embedded_mnist.balanced_subset(n, seed=seed)

    return subset


REPORT_PLAN = {
    "model": {"name": "mnist-cnn"},
    "dataset": {"name": "mnist-embedded", "limit": 60},
    "attacks": [
        {"name": "fgsm", "eps": [0.1, 0.2, 0.3]},
        {"name": "pgd-linf", "config": {"steps": 5}, "eps": [0.1, 0.3]},
        {"name": "random-noise", "config": {"draws": 2}, "eps": [0.1, 0.3]},
    ],
    "metrics": [
        "ca", "robust-accuracy", "zero-gradient-rate",
        {"name": "adversarial-hypervolume",
         "config": {"budgets": 4, "steps": 3, "samples": 30}},
        {"name": "ibp-certified-accuracy", "config": {"eps": 0.01}},
        {"name": "average-certified-radius",
         "config": {"verifier": "ibp", "max_radius": 0.05, "precision": 0.01,
                    "attack_steps": 3}},
        {"name": "ibp-certified-accuracy", "config": {"eps": 0.05}},
        "mce",
    ],
    "corruptions": {"names": ["gaussian_noise", "contrast", "fog"], "severities": [1, 3, 5],
                    "samples": 60},
}  # fmt: skip


@pytest.fixture(scope="session")
def report_db(tmp_path_factory) -> tuple[str, int]:
    """A small stored run with every kind of report content: (database URL, run id)."""
    from aisafety.config import plan_from_dict
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'results.db'}"
    record = Runner(plan_from_dict(REPORT_PLAN), ResultStore(url), quiet=True).run()
    return url, record.run_id


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on 127.0.0.1 for the whole session (testkit/postgres_server.py);
    skips, naming the reason, where PostgreSQL or psycopg is not installed."""
    from postgres_server import find_bindir, start_postgres

    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'psycopg[binary]'")
    if find_bindir() is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): apt install postgresql")
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the session's PostgreSQL server: its SQLAlchemy URL."""
    return postgres_server.create_database()


@pytest.fixture(scope="session")
def _ray_clusters():
    """Where ``ray_cluster`` keeps the session's cluster; stops one still running at the
    session's end (a run stopped early, -x)."""
    started: dict = {}
    yield started
    if "cluster" in started:
        started.pop("cluster").stop()


@pytest.fixture
def ray_cluster(request: pytest.FixtureRequest, _ray_clusters: dict):
    """docs/scale-out.md's two-node Ray cluster on 127.0.0.1 (tests/documented_cluster.py),
    one for the whole run: started for the first test that takes it (~15-19 s), stopped after
    the last one, not at the session's end, so its nodes do not idle beside every later test.
    tests/test_scale_out.py and tests/test_scale_out_docs.py each started their own before."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from documented_cluster import start_documented_cluster

    if "failed" in _ray_clusters:  # a start that failed is not retried (up to 300 s each)
        raise _ray_clusters["failed"]
    if "cluster" not in _ray_clusters:
        try:
            _ray_clusters["cluster"] = start_documented_cluster()
        except Exception as exc:
            _ray_clusters["failed"] = exc
            raise
    yield _ray_clusters["cluster"]
    items = request.session.items
    later = items[items.index(request.node) + 1 :]
    if not any("ray_cluster" in getattr(item, "fixturenames", ()) for item in later):
        _ray_clusters.pop("cluster").stop()
