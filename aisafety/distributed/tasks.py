"""What a Ray worker runs: plain functions over the same ``Runner`` code as a local run.

Each worker process loads the plan's model, data and evaluation context once (``_prepared``)
and keeps them for the next task of the same plan. Clean logits and attack results arrive
from Ray's object store, computed once for the whole cluster; every unit is then computed
and stored by ``Runner.compute`` exactly as the local executor does, so the numbers agree.
This module imports no Ray: ``executor.py`` wraps these functions into tasks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from aisafety.attack.result import AttackResult
from aisafety.evaluation.clean_pass_checks import warn_after_clean_pass, warn_before_work
from aisafety.interfaces import AttackSpec, EvaluationPlan, MetricValue
from aisafety.runner import Prepared, Runner, WorkUnit
from aisafety.store.interruption import HANG_ENDS_PROCESS
from aisafety.store.results import ResultStore
from aisafety.warning_log import KeptWarning, WarningLog, keeping

# One plan per worker process at a time: its runner (with the store) and prepared context.
_PREPARED: dict[str, tuple[Runner, Prepared]] = {}


def _prepared(plan: EvaluationPlan, url: str, cwd: str) -> tuple[Runner, Prepared]:
    """The plan's runner and context in this worker, built on its first task."""
    key = json.dumps([plan.model_dump(mode="json"), url], sort_keys=True)
    os.environ[HANG_ENDS_PROCESS] = "1"  # a forward stuck in compiled code ends the worker
    if key not in _PREPARED:
        _PREPARED.clear()  # a new plan: free the previous one's model and data
        if os.path.isdir(cwd):  # plan paths relative to where `aisafety evaluate` ran
            os.chdir(cwd)
        runner = Runner(plan, ResultStore(url), quiet=True)
        with keeping(runner.warning_log):  # handed to the driver by ``prepare``
            _PREPARED[key] = (runner, runner.prepare())
    return _PREPARED[key]


def prepare(plan: EvaluationPlan, url: str, cwd: str) -> tuple[dict, torch.Tensor]:
    """The plan's units (keyed from the model and data as a worker sees them), the device
    and shard count, the warnings of loading and of the clean pass (this worker's do not
    reach the driver, which warns and stores them) and the clean logits: computed once,
    shared through the object store."""
    runner, prepared = _prepared(plan, url, cwd)
    ctx = prepared.context
    with keeping(runner.warning_log):  # the local run's checks, in its order
        warn_before_work(ctx)
        warn_after_clean_pass(ctx)
    info = {
        "units": runner.work_units(prepared.subject),
        "device": str(prepared.device),
        "shards": len(ctx.shards()),
        # all the run's own (a second run reuses the worker); not a unit's that failed here
        "warnings": [w for w in runner.warning_log.entries if w.unit_key is None],
    }
    return info, ctx.clean_logits


def attack(
    plan: EvaluationPlan, url: str, cwd: str, spec: AttackSpec, eps: float, shard: int,
    clean_logits: torch.Tensor,
) -> tuple[AttackResult, list[KeptWarning]]:  # fmt: skip
    """One shard of one attack at one budget (plans with ``shard_size``) and, as a second
    output, the warnings it raised, which its unit's join stores with the unit."""
    _, prepared = _prepared(plan, url, cwd)
    ctx = prepared.context
    _use_clean_logits(ctx, clean_logits)
    with keeping(WarningLog()) as log:
        try:
            return ctx.attack_shard(spec, eps, shard), log.entries
        except BaseException as exc:  # its unit fails with it: the driver keeps them
            exc.unit_warnings = log.entries  # type: ignore[attr-defined]
            raise


def attack_unit(
    plan: EvaluationPlan, url: str, cwd: str, run_id: int, work: WorkUnit,
    clean_logits: torch.Tensor,
) -> tuple[tuple[list[MetricValue], float, list[KeptWarning]], AttackResult]:  # fmt: skip
    """A whole unsharded attack unit in one task: the attack, its metrics and its rows, so
    the unit is done when its task is (one task per unit: no metric task queued behind every
    other unit's attack). Returns (values, seconds, warnings) and, as a second output, the
    attack result, for clean metrics that reuse it (through the object store)."""
    started = time.perf_counter()
    runner, prepared = _prepared(plan, url, cwd)
    ctx = prepared.context
    _use_clean_logits(ctx, clean_logits)
    log = WarningLog(work.key)
    try:
        values = _computed(runner, prepared, work, run_id, log)  # runs the attack
        result = ctx.adversarial(work.attack, work.eps)  # kept by the context: no rerun
        return (values, time.perf_counter() - started, log.entries), result
    finally:
        ctx.forget_adversarial(work.attack, work.eps)


def unit(
    plan: EvaluationPlan, url: str, cwd: str, run_id: int, work: WorkUnit,
    clean_logits: torch.Tensor, results: dict[tuple[str, float], list],
    get: Callable[[list], list[AttackResult]] | None, *shards: Any,
) -> tuple[list[MetricValue], float, list[KeptWarning]]:  # fmt: skip
    """Compute and store one unit: the attack's shards joined, then its metrics (or the clean
    metrics, which read attack results of other units through ``results`` when they need
    them). ``shards``: each shard's result, then each shard's warnings (``attack``'s two
    outputs), stored with the unit. Idempotent: a retried task whose first attempt stored
    the unit writes nothing. Returns the values, the unit's compute time (its shards'
    attack time included) and its warnings."""
    started = time.perf_counter()
    runner, prepared = _prepared(plan, url, cwd)
    ctx = prepared.context
    _use_clean_logits(ctx, clean_logits)
    parts, warned = shards[: len(shards) // 2], shards[len(shards) // 2 :]
    log = WarningLog(work.key)
    for warning in (w for kept in warned for w in kept):
        log.add(warning.category, warning.message)
    if work.attack is not None:
        ctx.set_adversarial(work.attack, work.eps, AttackResult.concat(list(parts)))
    ctx.attack_source = _lookup(results, get)
    try:
        values = _computed(runner, prepared, work, run_id, log)
        return values, time.perf_counter() - started + sum(s.seconds for s in parts), log.entries
    finally:
        ctx.attack_source = None
        if work.attack is not None:
            ctx.forget_adversarial(work.attack, work.eps)


def _computed(
    runner: Runner, prepared: Prepared, work: WorkUnit, run_id: int, log: WarningLog
) -> list[MetricValue]:
    """``runner.compute``; a unit that fails takes its warnings (``unit_warnings``) with its
    exception to the driver, which prints and stores them, as a local run does."""
    try:
        return runner.compute(prepared, work, run_id, log)
    except BaseException as exc:
        exc.unit_warnings = log.entries  # type: ignore[attr-defined]
        raise


def _use_clean_logits(ctx, clean_logits: torch.Tensor) -> None:
    if "clean_logits" not in vars(ctx):
        ctx.use_clean_logits(clean_logits)


def _lookup(
    results: dict[tuple[str, float], list], get: Callable[[list], list[AttackResult]] | None
) -> Callable[[AttackSpec, float], AttackResult | None]:
    """Attack results of the plan's other units (their shards' object references), fetched
    from the object store on demand; None (compute here) when that unit is not running in
    this run or its attack failed."""

    def source(spec: AttackSpec, eps: float) -> AttackResult | None:
        refs = results.get((spec.key(), float(eps)))
        if not refs or get is None:
            return None
        try:
            return AttackResult.concat(get(refs))
        except Exception:  # noqa: BLE001 - that unit records its own failure
            return None

    return source
