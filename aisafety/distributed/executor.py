"""Running a plan's units as Ray tasks (``--executor ray``, docs/scale-out.md).

The driver (this process) asks one task to load the model and data, key the units and
compute the clean logits; the logits stay in Ray's object store, shared by every later
task. Without shards, each (attack, budget) unit is one task: the attack, its metrics and
its rows, stored in one transaction from the worker. With shards, each shard is an attack
task and a unit task joins them, computes the metrics and stores the unit. The clean
metrics read any attack result they need from the object store instead of running it
again. Ray retries a task whose worker died or that raised (``max_retries``); a
unit still failing is recorded in ``unit_failures`` and the rest of the plan goes on.
Imported only when a plan runs on Ray: a local run never imports Ray.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from aisafety.database.engine import sqlite_file
from aisafety.database.interruption import terminate_as_interrupt
from aisafety.distributed import tasks
from aisafety.errors import AISafetyError, ConfigError
from aisafety.interfaces import EvaluationPlan, ExecutorSpec, MetricValue, RunRecord
from aisafety.progress import RunProgress
from aisafety.runner import Runner, WorkUnit
from aisafety.version import __version__

# A progress line at least this often while the cluster works on units of minutes or hours
HEARTBEAT_S = 60.0


def run_on_ray(runner: Runner) -> RunRecord:
    """The plan's units on the Ray cluster of ``plan.executor``; stored as a local run."""
    plan, spec = runner.plan, runner.plan.executor
    started_here = _connect(spec.address)
    try:
        return _run(runner, plan, spec)
    finally:
        if started_here:
            ray.shutdown()


def _run(runner: Runner, plan: EvaluationPlan, spec: ExecutorSpec) -> RunRecord:
    url, cwd = absolute_url(runner.store.url), os.getcwd()
    options: dict[str, Any] = {
        "num_cpus": spec.cpus,
        "num_gpus": _gpus(plan, spec),
        "max_retries": spec.max_retries,
        "retry_exceptions": True,
    }
    prepare = ray.remote(tasks.prepare).options(num_returns=2, **options)
    info_ref, logits_ref = prepare.remote(plan, url, cwd)
    try:
        info = ray.get(info_ref)
    except RayTaskError as exc:  # a bad model path, a capability the model lacks, ...
        raise _user_error(exc) from None
    units: list[WorkUnit] = info["units"]
    run_id = runner.store.start_run(plan, __version__, f"ray:{info['device']}"[:16])
    done = runner.store.finished_units() if runner.resume else set()
    todo = [u for u in units if u.key not in done]
    pending = _submit(todo, plan, url, cwd, run_id, info["shards"], logits_ref, options)
    progress = RunProgress(
        [(u.key, u.description) for u in units], enabled=not runner.quiet,
        workers=_slots(options), heartbeat=HEARTBEAT_S, remote=True,
    )  # fmt: skip
    for u in units:
        if u.key in done:
            progress.resume(u.key)
    computed: dict[str, list[MetricValue]] = {}
    failed: list[str] = []
    status = "failed"
    try:
        with terminate_as_interrupt(), progress:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                unit = pending.pop(ready[0])
                try:
                    computed[unit.key], seconds = ray.get(ready[0])
                    progress.finish(unit.key, seconds)
                except RayError as exc:
                    error = _describe(exc)
                    runner.store.record_failure(run_id, unit.key, unit.description, error)
                    failed.append(f"{unit.description}: {error.splitlines()[0][:300]}")
                    progress.fail(unit.key, error.splitlines()[0][:120])
        status = "failed" if failed else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        runner.store.finish_run(run_id, status)
    values: list[MetricValue] = []
    for u in units:
        values += runner.store.unit_values(u.key) if u.key in done else computed.get(u.key, [])
    return RunRecord(
        run_id=run_id,
        plan=plan,
        platform_version=__version__,
        values=tuple(values),
        resumed_units=len(units) - len(todo),
        failed_units=tuple(failed),
    )


def _submit(
    todo: list[WorkUnit], plan: EvaluationPlan, url: str, cwd: str, run_id: int,
    n_shards: int, logits_ref: Any, options: dict[str, Any],
) -> dict[Any, WorkUnit]:  # fmt: skip
    """The tasks of the units still to do; returns the reference each unit is done with.

    Unsharded: one task per attack unit (attack, metrics, rows), so a unit is done when its
    task is. Sharded: one attack task per shard, then a task per unit that joins its shards
    (it waits for them; Ray may queue it behind shards of later units). The clean unit's task
    gets every attack result's references, for clean metrics that reuse an attack."""
    pending: dict[Any, WorkUnit] = {}
    shards: dict[str, list] = {}
    attacked = [u for u in todo if u.attack is not None]
    if plan.shard_size is None:
        whole = ray.remote(tasks.attack_unit).options(num_returns=2, **options)
        for u in attacked:
            done_ref, result_ref = whole.remote(plan, url, cwd, run_id, u, logits_ref)
            pending[done_ref], shards[u.key] = u, [result_ref]
    else:
        attack = ray.remote(tasks.attack).options(**options)
        for u in attacked:
            shards[u.key] = [
                attack.remote(plan, url, cwd, u.attack, u.eps, shard, logits_ref)
                for shard in range(n_shards)
            ]
    results = {(u.attack.key(), float(u.eps)): shards[u.key] for u in attacked}
    unit_task = ray.remote(tasks.unit).options(**options)
    for u in todo:
        if u.attack is None or plan.shard_size is not None:
            ref = unit_task.remote(
                plan, url, cwd, run_id, u, logits_ref,
                results if u.attack is None else {}, ray.get if u.attack is None else None,
                *(shards[u.key] if u.attack is not None else []),
            )  # fmt: skip
            pending[ref] = u
    return pending


def _connect(address: str | None) -> bool:
    """Connect to the cluster (None: start a private Ray here); True if we connected."""
    if ray.is_initialized():  # the caller connected already (a notebook, a test)
        return False
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address!r}: {exc}; start one with "
            "'ray start --head' (docs/scale-out.md), or leave out --address to run Ray "
            "on this machine only"
        ) from None
    return True


def _slots(options: dict[str, Any]) -> int:
    """How many tasks the cluster runs at once (for the ETA)."""
    resources = ray.cluster_resources()
    slots = resources.get("CPU", 1) / options["num_cpus"]
    if options["num_gpus"]:
        slots = min(slots, resources.get("GPU", 0) / options["num_gpus"])
    return max(1, int(slots))


def _gpus(plan: EvaluationPlan, spec: ExecutorSpec) -> float:
    """GPUs per task: the plan's, else one when the units run on CUDA."""
    if spec.gpus is not None:
        return spec.gpus
    if plan.device == "cuda":
        return 1
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    return 1 if plan.device == "auto" and has_gpus else 0


def absolute_url(url: str) -> str:
    """A SQLite URL with an absolute path: workers may run in another directory."""
    path = sqlite_file(url)
    return url if path is None else f"sqlite:///{path.resolve()}"


def _describe(exc: RayError) -> str:
    """The failure as stored: the task's own exception (and traceback), or why Ray gave up
    (a worker that died: ``WorkerCrashedError``, ...)."""
    cause = getattr(exc, "cause", None)
    failure = cause if isinstance(cause, BaseException) else exc
    head = f"{type(failure).__name__}: {failure}".strip()
    trace = getattr(exc, "traceback_str", "") or ""
    return f"{head}\n{trace}" if trace and failure is not exc else head


def _user_error(exc: RayTaskError) -> Exception:
    """The platform's own error (a clear message) when the task raised one, else Ray's."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, AISafetyError):
        return cause
    return ConfigError(f"preparing the plan on the Ray cluster failed: {_describe(exc)}")
