"""Scale-out (docs/scale-out.md): a plan on a real two-node Ray cluster writing to a real
PostgreSQL server, both started here on 127.0.0.1, stores what a local run stores in SQLite;
sharding, worker deaths and failed units change no number and lose nothing; a local run
never imports Ray."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import children
import pytest
import torch
import yaml
from batch_as_constant import BatchAsConstant
from sqlalchemy import text

from aisafety.config import plan_from_dict
from aisafety.errors import ConfigError
from aisafety.execution import run_plan
from aisafety.progress import RunProgress
from aisafety.store.compare import compare
from aisafety.store.results import ResultStore

PLAN = {
    "dataset": {"name": "mnist-embedded", "limit": 30},
    "attacks": [
        {"name": "fgsm", "eps": [0.1, 0.3]},
        {"name": "pgd-linf", "config": {"steps": 5, "random_start": True}, "eps": [0.2]},
    ],
    "metrics": ["ca", "aaw", "acac", "robust-accuracy"],
    "device": "cpu",
}


def _plan(**update):
    return plan_from_dict({**PLAN, **update})


def _local(tmp_path: Path, name: str, threads: int | None = None, **update) -> str:
    """The plan run here into SQLite; ``threads``: torch's intra-op threads meanwhile (Ray
    runs each task with ``executor.cpus`` of them: 1 here)."""
    url = f"sqlite:///{tmp_path / name}"
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        run_plan(_plan(**update), ResultStore(url), quiet=True)
    finally:
        torch.set_num_threads(before)
    return url


def _evaluate(plan: dict, *args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    path = cwd / "plan.json"
    path.write_text(json.dumps(plan))
    return children.start(
        [sys.executable, "-m", "aisafety.cli", "evaluate", str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=cwd,
    )


def _documented(plan: dict, url: str, cluster, cwd: Path, *args: str) -> subprocess.Popen:
    """docs/scale-out.md's driver command (``aisafety evaluate plan.yaml --executor ray
    --address auto --db URL``, tests/documented_cluster.py) on ``plan``, ``auto`` finding
    ``cluster`` through ``RAY_ADDRESS``, with ``args`` appended."""
    from documented_cluster import documented_driver

    path = cwd / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    env = {**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address}
    return children.start([*documented_driver(path, url), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)  # fmt: skip


def _count(url: str, sql: str) -> int:
    with ResultStore(url).engine.connect() as connection:
        return connection.execute(text(sql)).scalar_one()


# -- without Ray -----------------------------------------------------------------------------


def test_a_local_run_never_imports_ray(tmp_path):
    code = (
        "import sys, json; from aisafety.cli import main; "
        f"rc = main(['evaluate', sys.argv[1], '--db', 'sqlite:///{tmp_path}/r.db', '--quiet']); "
        "print(json.dumps([rc, sorted(m for m in sys.modules if m == 'ray' or "
        "m.startswith(('ray.', 'aisafety.distributed')))]))"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**PLAN, "attacks": PLAN["attacks"][:1]}))
    result = children.run([sys.executable, "-c", code, str(plan)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [0, []]


def _fake_cluster(tmp_path: Path, *commands: list[str]):
    """A RayCluster whose nodes are ``commands`` (no Ray), with its log files written."""
    from ray_cluster import RayCluster

    temp_dir = tmp_path / "aisafety-ray-fake"
    (temp_dir / "session_latest").mkdir(parents=True)
    cluster = RayCluster("127.0.0.1:1", temp_dir, {})
    for command, log in zip(commands, cluster.logs, strict=True):
        log.write_text("node output\n")
        cluster.nodes.append(children.start(command))
    return cluster


def test_a_clean_stop_of_the_test_cluster_leaves_no_file(tmp_path):
    """The nodes' logs (/tmp/aisafety-ray-*-head.log, -worker.log) were left behind by every
    stop: 210 pairs in /tmp after a day of sessions."""
    cluster = _fake_cluster(tmp_path, ["sleep", "600"], ["sleep", "600"])
    cluster.stop()
    assert all(node.returncode == -signal.SIGKILL for node in cluster.nodes)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_test_cluster_keeps_its_logs_and_names_them(tmp_path):
    cluster = _fake_cluster(tmp_path, ["sleep", "600"], ["true"])
    cluster.nodes[1].wait()  # the worker node exited on its own: the cluster failed
    with pytest.warns(UserWarning, match="a node had exited before the stop") as caught:
        cluster.stop()
    message = str(caught[0].message)
    assert all(log.exists() and str(log) in message for log in cluster.logs)
    assert cluster.temp_dir.is_dir() and str(cluster.temp_dir) in message
    cluster = _fake_cluster(tmp_path / "start", ["sleep", "600"], ["sleep", "600"])
    with pytest.warns(UserWarning, match="it failed to start"):
        cluster.stop(failed=True)
    assert all(log.exists() for log in cluster.logs) and cluster.temp_dir.is_dir()


def test_a_test_cluster_whose_head_fails_to_start_names_its_log():
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from ray_cluster import start_ray_cluster

    def refused(address: str, temp_dir: Path) -> tuple[list[str], list[str]]:
        return ["start", "--head", "--no-such-option"], []

    with (
        pytest.warns(UserWarning, match="it failed to start"),
        pytest.raises(RuntimeError, match="the Ray head node exited") as raised,
    ):
        start_ray_cluster(timeout=300, nodes=refused)
    head_log = Path(re.search(r"output is in (\S+-head\.log)", str(raised.value)).group(1))
    try:
        assert "no-such-option" in head_log.read_text()  # Ray's refusal, kept
    finally:
        head_log.unlink()
        shutil.rmtree(head_log.with_name(head_log.name.removesuffix("-head.log")))


def test_shards_of_a_deterministic_attack_change_no_number(tmp_path):
    """FGSM draws nothing at random: shards of two batches (16 + 14 samples) store exactly
    what the unsharded run stores (the shard size is in the unit key: other units). A shard
    size that is not a multiple of the batch size is refused: the model would see batches of
    other sizes, whose float sums differ in the last bits (measured: ACAC 0.8513860188 ->
    0.8513860192 with shards of 8 in batches of 128)."""
    plan = {"attacks": PLAN["attacks"][:1], "batch_size": 8}
    whole = _local(tmp_path, "whole.db", **plan)
    sharded = _local(tmp_path, "sharded.db", shard_size=16, **plan)
    counts, differences = compare(whole, sharded)
    assert differences == [] and counts["sample_outcomes"] == 60
    # the clean unit is the same unit; the two attack units are others
    assert len(ResultStore(whole).finished_units() & ResultStore(sharded).finished_units()) == 1
    with pytest.raises(ConfigError, match="shard_size 20 is not a multiple of batch_size 8"):
        _plan(shard_size=20, batch_size=8)


def test_one_shard_draws_what_the_unsharded_attack_draws(tmp_path):
    """Shard 0 keeps the attack's seed; later shards draw streams of their own (seeds
    derived from the attack's), so random starts are not repeated from shard to shard."""
    from aisafety.attack.fgsm import FGSM
    from aisafety.evaluation.context import shard_attack

    attack = FGSM({"seed": 5})
    assert shard_attack(attack, 0) is attack
    seeds = {shard_attack(attack, i).random_seed() for i in range(1, 50)}
    assert len(seeds) == 49 and 5 not in seeds and attack.random_seed() == 5
    whole = _local(tmp_path, "whole.db")
    one_shard = _local(tmp_path, "one.db", shard_size=128)
    assert compare(whole, one_shard)[1] == []


def test_progress_on_a_cluster_shares_the_work_left_among_its_workers(capsys):
    """Units timed on workers (their own seconds), a failed unit not timed, and the ETA of
    the work left divided among the workers that run it side by side."""
    units = [("c", "clean metrics"), *((f"f{i}", f"fgsm eps=0.{i}") for i in range(1, 6))]
    progress = RunProgress(units, clock=lambda: 100.0, workers=2, heartbeat=0)
    progress.resume("c")
    progress.finish("f1", seconds=30.0)
    progress.fail("f2", "WorkerCrashedError: the worker died")
    assert progress.eta() == 30.0 * 3 / 2  # 3 fgsm units left at 30 s, on 2 workers
    progress.close()
    err = capsys.readouterr().err
    assert "fgsm eps=0.2: FAILED (WorkerCrashedError: the worker died; 3/6 units done" in err


def test_the_driver_submits_a_units_join_as_soon_as_its_shards_are_done():
    """The schedule of a sharded plan (schedule.py, no Ray): attack shards in the plan's
    order, a unit's join before any further shard once its last shard is done (not queued
    behind later units' shards), the clean unit once every attack task exists."""
    from aisafety.distributed.schedule import Schedule
    from aisafety.interfaces import AttackSpec
    from aisafety.runner import WorkUnit

    pgd = AttackSpec(name="pgd-linf")
    clean, a, b = WorkUnit("c", "clean"), WorkUnit("a", "a", pgd, 0.1), WorkUnit("b", "b", pgd, 0.2)
    schedule = Schedule([clean, a, b], n_shards=2)
    order, in_flight = [], []

    def submit(slots: int) -> None:  # what the driver does: fill the free slots
        while len(in_flight) < slots and (task := schedule.next()) is not None:
            in_flight.append(task)
            order.append((task.kind, task.unit.key, task.shard))

    submit(slots=1)
    while in_flight:
        schedule.finished(in_flight.pop(0))
        submit(slots=1)
    assert order == [
        ("shard", "a", 0), ("shard", "a", 1), ("join", "a", None),
        ("shard", "b", 0), ("shard", "b", 1), ("join", "b", None), ("clean", "c", None),
    ]  # fmt: skip
    unsharded = Schedule([clean, a, b], n_shards=None)
    tasks = [unsharded.next() for _ in range(4)]
    assert [(t.kind, t.unit.key) for t in tasks[:3]] == [
        ("unit", "a"),
        ("unit", "b"),
        ("clean", "c"),
    ]
    assert tasks[3] is None and all(t.stores_unit for t in tasks[:3])


def test_executor_settings_are_checked(tmp_path):
    from aisafety.cli import main

    assert _plan(executor="ray").executor.name == "ray"
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({**PLAN, "executor": {"name": "local", "address": "auto"}}))
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path}/r.db"]) == 2
    plan.write_text(json.dumps({**PLAN, "executor": {"name": "ray", "max_retries": -1}}))
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path}/r.db"]) == 2
    plan.write_text(json.dumps({**PLAN, "executor": {"name": "ray", "queue_ahead": -1}}))
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path}/r.db"]) == 2


# -- on a Ray cluster with PostgreSQL -------------------------------------------------------


# ray_cluster (tests/conftest.py): docs/scale-out.md's two nodes, one CPU each, on 127.0.0.1,
# one cluster for these tests and tests/test_scale_out_docs.py.
# In the default suite, so CI runs the real cluster and server: ~50 s at load 3-4, 15-19 s of
# it the start of the two Ray nodes (shared with the fault test below and the docs' tests).
def test_a_plan_on_ray_and_postgresql_stores_what_a_local_run_stores_in_sqlite(
    ray_cluster, postgres_url, tmp_path
):
    """Three shards per attack on two nodes, units written by the workers to PostgreSQL:
    every number bit-identical to the same plan run here into SQLite with as many torch
    threads as a Ray task has (with 2 threads here, ACAC differs in its last bits:
    0.8513860192590054 against 0.8513860188197844, as on another machine); --resume then
    finds every unit and computes nothing. The driver is docs/scale-out.md's command as
    written (``--address auto``), so this test also runs that documented command on the
    documented cluster (tests/test_scale_out_docs.py's own run of it is slow since
    session 17)."""
    local = _local(tmp_path, "local.db", threads=1, shard_size=10, batch_size=10)
    plan = {**PLAN, "shard_size": 10, "batch_size": 10}
    assert all(log.is_file() for log in ray_cluster.logs)  # what its clean stop removes
    _stores_what_local_stores(plan, local, ray_cluster, postgres_url, tmp_path)
    resumed = _documented(plan, postgres_url, ray_cluster, tmp_path, "--resume")
    out, err = children.communicate(resumed)
    assert resumed.returncode == 0, err
    assert "(4 finished unit(s) taken from the database)" in out
    assert _count(postgres_url, "SELECT COUNT(*) FROM units") == 4


@pytest.mark.slow
def test_without_shards_each_unit_is_one_task_and_stores_what_a_local_run_stores(
    ray_cluster, postgres_url, tmp_path
):
    """No shard_size: each attack unit is one task (attack, metrics, rows), so units finish
    one by one as their tasks do; every number equals the local run's."""
    local = _local(tmp_path, "local.db", threads=1)
    _stores_what_local_stores(PLAN, local, ray_cluster, postgres_url, tmp_path)


def _stores_what_local_stores(plan, local, ray_cluster, postgres_url, tmp_path) -> None:
    """Run ``plan`` (PLAN's 4 units) on the cluster into PostgreSQL with the documented
    driver command; assert every stored number equals the ``local`` run's."""
    driver = _documented(plan, postgres_url, ray_cluster, tmp_path)
    out, err = children.communicate(driver)
    assert driver.returncode == 0, err
    assert "4/4 units done" in err
    counts, differences = compare(local, postgres_url)
    assert differences == []
    assert counts == {"metric_values": 10, "attack_runs": 3, "sample_outcomes": 90}


def _one_slot(address: str, temp_dir: Path) -> tuple[list[str], list[str]]:
    """The nodes of testkit/ray_cluster.py, the worker node without CPUs: one task at a time."""
    from ray_cluster import one_cpu_nodes

    head, worker = one_cpu_nodes(address, temp_dir)
    return head, [a if a != "--num-cpus=1" else "--num-cpus=0" for a in worker]


@pytest.mark.slow  # ~1.5 min: a cluster of its own
def test_a_sharded_unit_is_stored_as_soon_as_its_shards_are_done(postgres_url, tmp_path):
    """Two units of three shards each on a cluster that runs one task at a time: the first
    unit is stored before the second unit's shards run, not after them. When the driver
    submitted every shard up front, Ray ran the shards of both units before either join
    (the worker's lease went from one shard task to the next), so a sharded plan stored
    its units only at its end. Bound asserted: half of the second unit's three shards."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from ray_cluster import start_ray_cluster

    plan = {
        **PLAN,
        "dataset": {"name": "mnist-embedded", "limit": 120},
        "attacks": [{"name": "pgd-linf", "config": {"steps": 100}, "eps": [0.1, 0.2]}],
        "metrics": ["ca", "robust-accuracy"],
        "shard_size": 40,
        "batch_size": 40,
    }
    cluster = start_ray_cluster(nodes=_one_slot)
    try:
        args = ("--executor", "ray", "--address", cluster.address, "--db", postgres_url)
        driver = _evaluate(plan, *args, env=cluster.env, cwd=tmp_path)
        out, err = children.communicate(driver)
    finally:
        cluster.stop()
    assert driver.returncode == 0, err
    with ResultStore(postgres_url).engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT u.finished_at, a.seconds FROM units u JOIN attack_runs a "
                "ON a.unit_key = u.key ORDER BY a.eps"
            )
        ).all()
    (first, _), (second, seconds) = rows
    gap = (second - first).total_seconds()
    print(f"units stored {gap:.2f} s apart; the second unit's 3 shards took {seconds:.2f} s")
    assert gap > 0.5 * seconds, (first, second, seconds)


SLOW_PLAN = {
    **PLAN,
    "dataset": {"name": "mnist-embedded", "limit": 120},
    "attacks": [
        {"name": "pgd-linf", "config": {"steps": 60, "random_start": True}, "eps": [0.1, 0.2]},
        {"name": "fgsm", "eps": [0.1]},
    ],
    "shard_size": 40,
    "batch_size": 40,
}


def _kill_a_busy_worker(cluster, driver: subprocess.Popen, timeout: float = 300) -> str:
    """kill -9 a worker process in the middle of an attack task; the name of that task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and driver.poll() is None:
        pids = cluster.worker_pids(busy_with="attack")
        if pids:
            time.sleep(0.5)  # well into the task
            if (task := _kill_if_busy(pids[0])) is not None:
                return task
        time.sleep(0.1)
    raise AssertionError("no attack task seen running on the cluster")


def _kill_if_busy(pid: int) -> str | None:
    """SIGKILL ``pid`` if it is still running an attack task, and return that task's name;
    else None. The process is stopped while its title is read, so the task the title names
    is the one the kill ends (a worker between tasks is titled ``ray::IDLE``)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return None
    ps = ["ps", "-ww", "-o", "args=", "-p", str(pid)]
    task = subprocess.run(ps, capture_output=True, text=True).stdout.strip().removeprefix("ray::")
    if task.startswith("attack"):
        os.kill(pid, signal.SIGKILL)
        return task
    os.kill(pid, signal.SIGCONT)
    return None


def _resubmitted(cluster, driver: subprocess.Popen) -> list[str]:
    """The names of the tasks Ray resubmitted for ``driver``, read from its core worker's
    log in the cluster's session (``Will resubmit task ...: ..., task_name=<name>,
    job_id=...``: Ray 2.60, at the INFO level the driver is started with)."""
    logs = cluster.temp_dir / "session_latest" / "logs"
    found = list(logs.glob(f"python-core-driver-*_{driver.pid}.log"))
    assert len(found) == 1, f"no single core worker log of the driver {driver.pid} in {logs}"
    return re.findall(r"Will resubmit task .*?task_name=(.*?), job_id=", found[0].read_text())


NOISY_BLIND = """
import warnings

import torch
from torch import nn

from aisafety.errors import AISafetyWarning


class NoisyBlind(nn.Module):
    # class 0 for every image (logits 10..1, gaps of 1), plus noise far below the gaps: at
    # chance accuracy, and two forward passes of one batch differ; the attack's gradient
    # passes warn (in its shard tasks)
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(784, 10)

    def forward(self, x):
        if x.requires_grad:
            warnings.warn("asked for a gradient", AISafetyWarning, stacklevel=2)
        noise = 0.01 * torch.randn(len(x), 10)
        return self.linear(x.flatten(1)) * 0 + torch.arange(10.0, 0, -1) + noise
"""


# In the default suite again since record-19 (~12-20 s at load 6-10: the driver's and a fresh
# worker's imports): the driver storing a worker's warnings with the run is checked nowhere
# else; the prepare task's messages are also checked in process by tests/test_at_chance.py.
def test_the_clean_pass_checks_of_a_worker_reach_the_driver(ray_cluster, postgres_url, tmp_path):
    """A model that is not deterministic and one at chance accuracy are named on the
    driver's stderr as a local run names them, once each, and stored with the run
    (``run_warnings``, in PostgreSQL): the clean pass runs on a worker, whose warnings do
    not reach the driver, so its prepare task hands them back. The determinism check was
    not made on Ray before session 19 (docs/reliability.md); the warnings were not stored
    before record-19 (tests/test_run_warnings.py: the local executor). A warning of the
    attack's two shard tasks is printed by the driver once and stored once with the unit
    (lost before raywarn-19; the task functions: tests/test_ray_unit_warnings.py)."""
    (tmp_path / "noisy_blind.py").write_text(NOISY_BLIND)
    model = {"name": "noisy-blind", "source": "python", "factory": "noisy_blind:NoisyBlind",
             "input_shape": [1, 28, 28], "python_path": [str(tmp_path)]}  # fmt: skip
    plan = {"model": model, "dataset": {"name": "mnist-embedded", "limit": 40},
            "attacks": [{"name": "fgsm", "eps": [0.1]}], "metrics": ["ca", "robust-accuracy"],
            "shard_size": 20, "batch_size": 20, "device": "cpu"}  # fmt: skip
    args = ("--executor", "ray", "--address", ray_cluster.address, "--quiet")
    driver = _evaluate(plan, *args, "--db", postgres_url, env=ray_cluster.env, cwd=tmp_path)
    out, err = children.communicate(driver)
    assert driver.returncode == 0, err
    determinism = "model 'noisy-blind' is not deterministic: two forward passes"
    chance = "model 'noisy-blind' has clean accuracy 0.100 (4/40)"
    assert err.count(f"warning: {determinism}") == 1 and err.count(f"warning: {chance}") == 1
    assert err.count("warning: asked for a gradient") == 1, err
    stored = ResultStore(postgres_url).query(
        "SELECT w.run_id, u.description, w.category, w.message FROM run_warnings w "
        "LEFT JOIN units u ON u.key = w.unit_key ORDER BY w.id"
    )[1]
    # the clean pass's checks have classes of their own since session 21 (the report counts
    # warnings by kind); the class crosses from the worker intact
    assert [row[:3] for row in stored] == [
        (1, None, "NotRepeatableWarning"),
        (1, None, "AtChanceWarning"),
        (1, "fgsm eps=0.1", "AISafetyWarning"),
    ]
    assert stored[0][3].startswith(determinism) and stored[1][3].startswith(chance)
    assert stored[2][3] == "asked for a gradient"


FAILS_ON_SHARD_ONE = """
import warnings
from pathlib import Path

import torch
from torch import nn

from aisafety.errors import AISafetyWarning

FIRST_OF_SHARD_ONE = torch.load(Path(__file__).with_name("first_of_shard_one.pt"))


class FailsOnShardOne(nn.Module):
    # every forward warns (the clean pass on the prepare task: the run's; each shard's: the
    # unit's); a gradient pass warns with its shard and fails on shard 1 (batch = shard)
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(784, 10)

    def forward(self, x):
        warnings.warn("a forward pass", AISafetyWarning, stacklevel=2)
        if x.requires_grad:
            shard = int(torch.equal(x[0].detach(), FIRST_OF_SHARD_ONE))
            warnings.warn(f"a gradient pass of shard {shard}", AISafetyWarning, stacklevel=2)
            if shard == 1:
                raise RuntimeError("shard 1 cannot be attacked")
        return self.linear(x.flatten(1))
"""


# slow (~10 s more of the shared cluster); the same paths in process, in the default suite:
# tests/test_ray_unit_warnings.py
@pytest.mark.slow
def test_every_warning_a_worker_raises_reaches_the_driver_once(ray_cluster, tmp_path):
    """raywarn-20, on the cluster: a shard that fails leaves its sibling's warnings with the
    unit (only its own came back before); a text raised on the prepare task and in a unit
    prints once (twice before); a TorchScript archive's one-image warning (raised at load,
    in the worker) is printed and stored with the run."""
    import warnings

    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry

    data = load_data(DatasetSpec(name="mnist-embedded", limit=40), default_registry())
    torch.save(data.x[20].clone(), tmp_path / "first_of_shard_one.pt")
    (tmp_path / "fails_on_shard_one.py").write_text(FAILS_ON_SHARD_ONE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's: the constant, as intended
        traced = torch.jit.trace(BatchAsConstant().eval(), torch.rand(1, 1, 28, 28))
        torch.jit.save(traced, str(tmp_path / "traced.ts"))
    model = {"name": "fails", "source": "python", "factory": "fails_on_shard_one:FailsOnShardOne",
             "input_shape": [1, 28, 28], "python_path": [str(tmp_path)]}  # fmt: skip
    reference = {"name": "traced", "source": "torchscript", "path": str(tmp_path / "traced.ts"),
                 "input_shape": [1, 28, 28]}  # fmt: skip
    plan = {"model": model, "reference_model": reference,
            "dataset": {"name": "mnist-embedded", "limit": 40},
            "attacks": [{"name": "fgsm", "eps": [0.1]}], "metrics": ["ca", "robust-accuracy"],
            "shard_size": 20, "batch_size": 20, "device": "cpu",
            "executor": {"name": "ray", "max_retries": 0}}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'r.db'}"
    args = ("--address", ray_cluster.address, "--quiet", "--db", url)
    driver = _evaluate(plan, *args, env=ray_cluster.env, cwd=tmp_path)
    out, err = children.communicate(driver)
    assert driver.returncode == 1, err  # the attack unit failed
    assert err.count("warning: a forward pass") == 1, err
    assert err.count("TorchScript archive") == 1, err
    rows = ResultStore(url).query(
        "SELECT w.unit_key IS NULL, u.description, w.message FROM run_warnings w "
        "LEFT JOIN unit_failures u ON u.key = w.unit_key ORDER BY w.id"
    )[1]
    run = [message for own, _, message in rows if own]
    unit = sorted(message for _, where, message in rows if where == "fgsm eps=0.1")
    assert "a forward pass" in run
    assert sum("TorchScript archive" in message for message in run) == 1
    assert unit == ["a forward pass", "a gradient pass of shard 0", "a gradient pass of shard 1"]


# In the default suite: the fault test, ~35 s at load 3-4 on the shared cluster.
def test_a_worker_killed_mid_plan_loses_and_duplicates_nothing(ray_cluster, postgres_url, tmp_path):
    """kill -9 of a worker running an attack shard: Ray runs the task again, the plan
    completes, every unit is stored exactly once and every number equals an undisturbed
    local run's. With two tasks queued beyond the free slots (queue_ahead, for autoscaling
    clusters), so that path meets a real cluster too."""
    local = _local(tmp_path, "local.db", threads=1, **SLOW_PLAN)
    plan = {**SLOW_PLAN, "executor": {"name": "ray", "queue_ahead": 2}}
    args = ("--address", ray_cluster.address, "--db", postgres_url)
    env = {**ray_cluster.env, "RAY_BACKEND_LOG_LEVEL": "info"}  # resubmissions logged
    driver = _evaluate(plan, *args, env=env, cwd=tmp_path)
    killed = _kill_a_busy_worker(ray_cluster, driver)
    out, err = children.communicate(driver)
    assert driver.returncode == 0, err
    assert _resubmitted(ray_cluster, driver) == [killed]  # the kill ended it: it ran again
    assert _count(postgres_url, "SELECT COUNT(*) FROM units") == 4
    assert _count(postgres_url, "SELECT COUNT(*) FROM metric_values") == _count(
        local, "SELECT COUNT(*) FROM metric_values"
    )
    assert _count(postgres_url, "SELECT COUNT(*) FROM unit_failures") == 0
    assert compare(local, postgres_url)[1] == []


@pytest.mark.slow
def test_a_unit_that_fails_for_good_is_recorded_and_resume_runs_only_it(
    ray_cluster, postgres_url, tmp_path
):
    """With no retries, the unit whose worker is killed fails: it is stored in
    unit_failures with its error, the other units finish (exit 1 names it); --resume then
    computes that unit alone, and the numbers equal an undisturbed local run's."""
    local = _local(tmp_path, "local.db", threads=1, **SLOW_PLAN)
    plan = {**SLOW_PLAN, "executor": {"name": "ray", "max_retries": 0}}
    args = ("--address", ray_cluster.address, "--db", postgres_url)
    driver = _evaluate(plan, *args, env=ray_cluster.env, cwd=tmp_path)
    _kill_a_busy_worker(ray_cluster, driver)
    out, err = children.communicate(driver)
    assert driver.returncode == 1, err
    assert "1 unit(s) failed after their retries" in err
    assert _count(postgres_url, "SELECT COUNT(*) FROM unit_failures") == 1
    assert _count(postgres_url, "SELECT COUNT(*) FROM units") == 3
    resumed = _evaluate(plan, *args, "--resume", env=ray_cluster.env, cwd=tmp_path)
    out, err = children.communicate(resumed)
    assert resumed.returncode == 0, err
    assert "(3 finished unit(s) taken from the database)" in out
    assert compare(local, postgres_url)[1] == []
