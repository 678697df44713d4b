"""Running a plan's units as Ray tasks (``--executor ray``, docs/scale-out.md).

The driver (this process) asks one task to load the model and data, key the units and
compute the clean logits; the logits stay in Ray's object store, shared by every later
task. Without shards, each (attack, budget) unit is one task: the attack, its metrics and
its rows, stored in one transaction from the worker. With shards, each shard is an attack
task and a unit task joins them, computes the metrics and stores the unit. The clean
metrics read any attack result they need from the object store instead of running it
again. The driver keeps as many tasks in flight as the cluster has slots and submits the
next as one finishes (schedule.py: a unit's join first, as soon as its shards are done).
Ray retries a task whose worker died or that raised (``max_retries``); a unit still
failing is recorded in ``unit_failures`` and the rest of the plan goes on.
Imported only when a plan runs on Ray: a local run never imports Ray.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from aisafety.distributed import tasks
from aisafety.distributed.schedule import Schedule, Task
from aisafety.errors import AISafetyError, ConfigError
from aisafety.interfaces import EvaluationPlan, ExecutorSpec, MetricValue, RunRecord
from aisafety.progress import RunProgress
from aisafety.runner import Runner, WorkUnit
from aisafety.store.engine import sqlite_file
from aisafety.store.interruption import interrupts_deferred, terminate_as_interrupt
from aisafety.version import __version__
from aisafety.warning_log import KeptWarning, WarningLog, keeping

# A progress line at least this often while the cluster works on units of minutes or hours
HEARTBEAT_S = 60.0


def run_on_ray(runner: Runner) -> RunRecord:
    """The plan's units on the Ray cluster of ``plan.executor``; stored as a local run."""
    plan, spec = runner.plan, runner.plan.executor
    started_here = _connect(spec.address)
    try:
        with keeping(runner.warning_log):  # stored with the run; units' by their workers
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
    _warn_again(runner.warning_log, info["warnings"])
    units: list[WorkUnit] = info["units"]
    done = runner.store.finished_units() if runner.resume else set()
    todo = [u for u in units if u.key not in done]
    schedule = Schedule(todo, None if plan.shard_size is None else info["shards"])
    computed: dict[str, list[MetricValue]] = {}
    failed: list[str] = []

    def unit_done(unit: WorkUnit, ref: Any) -> None:
        try:
            computed[unit.key], seconds, kept = ray.get(ref)
            _warn_unit(unit, kept)  # stored with the unit by its worker
            progress.finish(unit.key, seconds)
        except RayError as exc:
            error = _describe(exc)
            kept = failed_unit_warnings(exc, submit.shard_warnings(unit), ray.get)
            runner.store.record_warnings(run_id, _warn_unit(unit, kept))
            runner.store.record_failure(run_id, unit.key, unit.description, error)
            failed.append(f"{unit.description}: {error.splitlines()[0][:300]}")
            progress.fail(unit.key, error.splitlines()[0][:120])

    run_id, status = None, "failed"
    try:  # from start_run on: whatever happens, finish_run stops the run's heartbeat
        with interrupts_deferred():  # a signal here is raised once the row exists
            run_id = runner.store.start_run(plan, __version__, f"ray:{info['device']}"[:16])
        runner.store.record_warnings(run_id, runner.warning_log.take())
        runner.store.record_reused(run_id, [u.key for u in units if u.key in done])
        submit = _Submitter(plan, url, cwd, run_id, logits_ref, options)
        progress = RunProgress(
            [(u.key, u.description) for u in units], enabled=not runner.quiet,
            workers=_slots(options), heartbeat=HEARTBEAT_S, remote=True,
        )  # fmt: skip
        for u in units:
            if u.key in done:
                progress.resume(u.key)
        with terminate_as_interrupt(), progress:
            _execute(schedule, submit, options, spec.queue_ahead, unit_done)
        status = "failed" if failed else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if run_id is not None:
            runner.store.finish_run(run_id, status, runner.warning_log.take())
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


def _warn_again(run: WarningLog, kept: list[KeptWarning]) -> None:
    """The prepare task's warnings (loading, the clean pass), which do not reach this
    process: warned here, where they are printed and kept in the run's log ``run``; those
    this process raised too (the plan's own, from its ``Runner``) once."""
    for warning in kept:
        if warning not in run:
            _warn(warning)


def _warn_unit(unit: WorkUnit, kept: list[KeptWarning]) -> list[KeptWarning]:
    """A unit's warnings, raised on its worker: warned here, as a local run prints them,
    each kept under the unit's key (not as the run's own); returned as kept."""
    with keeping(WarningLog(unit.key)) as log:
        for warning in kept:
            _warn(warning)
    return log.entries


def _warn(warning: KeptWarning) -> None:
    """A worker's warning, raised again here from this one line for the run's and every
    unit's: the default filter shows a warning once per (text, category, line) and run, so
    the same text from the prepare task and from a unit, or from two units, prints once, as
    a local run prints a warning raised at one place (two call sites printed it twice)."""
    warnings.warn(warning.message, warning.category, stacklevel=1)


def failed_unit_warnings(
    exc: RayError, shards: list[Any], get: Callable[[Any], list[KeptWarning]]
) -> list[KeptWarning]:
    """The warnings of a unit whose task failed: those its exception carries
    (``unit_warnings``: a unit task's, or a join's with its shards') and, for a sharded
    unit, those of each of its shards (``get`` of their warnings' references): a shard that
    failed fails the join before it runs, so its exception carries that shard's warnings
    only, and its sibling shards' were dropped before (raywarn-20)."""
    kept = list(_carried(exc))
    for ref in shards:
        try:
            kept += get(ref)
        except RayError as shard_failure:  # this shard failed: its own exception has them
            kept += _carried(shard_failure)
    return kept


def _carried(exc: RayError) -> list[KeptWarning]:
    """The warnings a failed task's exception carries (tasks.py's ``unit_warnings``)."""
    return list(getattr(getattr(exc, "cause", None), "unit_warnings", []))


def _execute(
    schedule: Schedule, submit: _Submitter, options: dict[str, Any], ahead: int,
    unit_done: Callable[[WorkUnit, Any], None],
) -> None:  # fmt: skip
    """Run the schedule with as many tasks in flight as the cluster runs at once, plus
    ``ahead`` (0: none waits in Ray's queue, where the driver could no longer put a unit's
    join first; the count is asked again as tasks finish: nodes come and go, and an
    autoscaler adds them only for waiting tasks); ``unit_done`` gets each unit
    whose task finished, with the reference of its result. Interrupted: the tasks in flight
    are cancelled, the rest never submitted."""
    in_flight: dict[Any, Task] = {}
    try:
        while True:
            slots = _slots(options)
            while len(in_flight) < slots + ahead and (task := schedule.next()) is not None:
                in_flight[submit(task)] = task
            if not in_flight:
                return
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            task = in_flight.pop(ready[0])
            schedule.finished(task)
            if task.stores_unit:
                unit_done(task.unit, ready[0])
    except KeyboardInterrupt:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        raise


class _Submitter:
    """Submits a task of the schedule; returns the reference its unit is done with (for a
    shard: its attack result). Keeps every attack result's references, which the unit's
    join and the clean unit's metrics read through the object store."""

    def __init__(
        self, plan: EvaluationPlan, url: str, cwd: str, run_id: int, logits_ref: Any,
        options: dict[str, Any],
    ) -> None:  # fmt: skip
        self.common = (plan, url, cwd)
        self.run_id, self.logits_ref, self.options = run_id, logits_ref, options
        # each function made a remote function once (Ray exports it to the cluster once)
        self.remote = {f: ray.remote(f) for f in (tasks.attack_unit, tasks.attack, tasks.unit)}
        # (attack key, eps) -> the references of its result's shards (one if unsharded)
        self.results: dict[tuple[str, float], list] = {}
        # (attack key, eps) -> the references of its shards' warnings, stored by its join
        self.warned: dict[tuple[str, float], list] = {}

    def __call__(self, task: Task) -> Any:
        u, run_id, logits = task.unit, self.run_id, self.logits_ref
        if task.kind == "unit":
            done_ref, result_ref = self._remote(tasks.attack_unit, task, num_returns=2).remote(
                *self.common, run_id, u, logits
            )
            self.results[(u.attack.key(), float(u.eps))] = [result_ref]
            return done_ref
        if task.kind == "shard":
            ref, warned = self._remote(tasks.attack, task, num_returns=2).remote(
                *self.common, u.attack, u.eps, task.shard, logits
            )
            self.results.setdefault((u.attack.key(), float(u.eps)), []).append(ref)
            self.warned.setdefault((u.attack.key(), float(u.eps)), []).append(warned)
            return ref
        if task.kind == "join":
            key = (u.attack.key(), float(u.eps))
            return self._remote(tasks.unit, task).remote(
                *self.common, run_id, u, logits, {}, None, *self.results[key], *self.warned[key]
            )
        # the clean unit: every attack task exists by now (Schedule submits it last)
        return self._remote(tasks.unit, task).remote(
            *self.common, run_id, u, logits, dict(self.results), ray.get
        )

    def shard_warnings(self, unit: WorkUnit) -> list[Any]:
        """The references of ``unit``'s shards' warnings (none for an unsharded unit)."""
        if unit.attack is None:
            return []
        return self.warned.get((unit.attack.key(), float(unit.eps)), [])

    def _remote(self, function: Callable, task: Task, **options: Any) -> Any:
        """``function`` as a Ray task named after its unit (as the dashboard and ``ps`` show
        it: ``ray::attack pgd-linf(...) eps=0.1 shard 2``)."""
        shard = f" shard {task.shard}" if task.shard is not None else ""
        name = f"{function.__name__} {task.unit.description}"[:200] + shard
        return self.remote[function].options(name=name, **self.options, **options)


def _connect(address: str | None) -> bool:
    """Connect to the cluster (None: start a private Ray here); True if we connected."""
    if ray.is_initialized():  # the caller connected already (a notebook, a test)
        return False
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError, RayError) as exc:
        if _refused_for_authentication(exc):
            raise ConfigError(_authentication_advice(address)) from None
        raise ConfigError(
            f"cannot reach the Ray cluster at {address!r}: {exc}; start one with "
            "'ray start --head' (docs/scale-out.md), or leave out --address to run Ray "
            "on this machine only"
        ) from None
    return True


def _refused_for_authentication(exc: BaseException) -> bool:
    """Whether Ray's error, or one it was raised from, is a refused token. A wrong token
    comes as ``ConnectionError`` from a ``RuntimeError`` whose text holds the
    ``AuthenticationError``; a missing one as ``AuthenticationError`` itself."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}"
        if "AuthenticationError" in text or "InvalidAuthToken" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _authentication_advice(address: str | None) -> str:
    """What the driver's environment lacks, named without showing the token."""
    mode, token = os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN")
    if mode is None:
        why = "RAY_AUTH_MODE is not set (the cluster asks for RAY_AUTH_MODE=token)"
    elif mode != "token":
        why = f"RAY_AUTH_MODE is {mode!r}, not 'token'"
    elif not token and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        why = "RAY_AUTH_TOKEN is not set"
    else:
        why = "its token (RAY_AUTH_TOKEN) is not the cluster's"
    return (
        f"the Ray cluster at {address!r} refused this driver's authentication: {why}; "
        "export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the token its nodes were started "
        "with> before 'aisafety evaluate' (docs/scale-out.md, 'Starting the cluster')"
    )


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
