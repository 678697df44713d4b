"""Orchestration: one EvaluationPlan -> stored MetricValues.

The work is split into units: one for the clean metrics, one per (attack, budget) with the
metrics that read that attack's examples. Each unit is committed on its own; a unit whose key
is already in the store is skipped on ``resume`` and its stored values are shown instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import traceback
import warnings
from dataclasses import dataclass

import torch

from aisafety.attack.base import Attack
from aisafety.database.datasets.base import LoadedDataset
from aisafety.default_budget import warn_default_budgets
from aisafety.defense.obfuscation import warn_obfuscation
from aisafety.errors import (
    AISafetyError,
    AISafetyWarning,
    CapabilityError,
    ConfigError,
    PluginError,
    StoreError,
    TamperingError,
)
from aisafety.evaluation.base import AttackMetric, CleanMetric, Metric, checked_values
from aisafety.evaluation.clean_pass_checks import warn_after_clean_pass, warn_before_work
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.integrity import RunIntegrity
from aisafety.evaluation.reference import missing_reference
from aisafety.interfaces import (
    AttackSpec,
    CorruptionsSpec,
    DatasetSpec,
    EvaluationPlan,
    MetricSpec,
    MetricValue,
    RunRecord,
)
from aisafety.limits import check_budgets, check_memory, check_targets, check_work_limits
from aisafety.loading import (
    apply_defenses,
    fingerprint,
    load_data,
    load_model,
    load_whole_data,
    resolve_device,
    subset,
    warn_normalised_twice,
)
from aisafety.memory import reuse_freed_memory
from aisafety.memory_budget import GIB, memory_limit
from aisafety.plugins import Registry, default_registry, warn_failures
from aisafety.prediction.base import Predictor
from aisafety.prediction.watch import before_exit_on_hang
from aisafety.progress import RunProgress
from aisafety.store.interruption import interrupts_deferred, terminate_as_interrupt
from aisafety.store.results import ResultStore, Subject
from aisafety.unit_cost import CostMeter
from aisafety.version import __version__
from aisafety.warning_log import WarningLog, keeping

log = logging.getLogger(__name__)


def _key(*parts: object) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class WorkUnit:
    """One unit of work: clean metrics (``attack`` None; ``metrics`` names them by label),
    or one attack at one budget with the attack metrics that read it. Plain data, so it
    travels to a Ray worker."""

    key: str
    description: str
    attack: AttackSpec | None = None
    eps: float | None = None
    metrics: tuple[str, ...] = ()


@dataclass
class Prepared:
    """What every unit of one plan reads: the stored subject and the evaluation context."""

    subject: Subject
    context: EvaluationContext
    device: torch.device
    integrity: RunIntegrity | None = None  # fingerprints of the shared state, on first use


ACCURACY_METRICS = ("robust-accuracy", "aaw", "aab")  # robust accuracy, by attack family


def warn_unmeasured_attacks(attacks, metrics: list[Metric]) -> None:
    """An attack no accuracy metric applies to would run and then be missing from the
    table's robust-accuracy rows and the accuracy-against-budget curve (aaw reads white-box
    attacks only, aab black-box ones): a baseline such as random noise then silently vanishes."""
    for attack in attacks:
        if not any(m.name in ACCURACY_METRICS and m.applies_to(attack.family) for m in metrics):
            warnings.warn(
                f"attack {attack.name!r} ({attack.family.value}) has no accuracy metric among "
                f"the plan's metrics, so its robust accuracy is not measured (aaw reads "
                "gradient attacks only, aab score, decision and transfer ones); add "
                "robust-accuracy (every attack) to metrics",
                AISafetyWarning,
                stacklevel=3,
            )


def check_attack_metrics_have_attacks(attacks, metrics: list[Metric]) -> None:
    """An attack metric with no attack of its families in the plan gives no value: a
    warning naming it, and an error when no metric of the plan gives one (the run would
    end with exit 0 and an empty table, e.g. coverage listed without attacks)."""
    unread = [
        m
        for m in metrics
        if isinstance(m, AttackMetric) and not any(m.applies_to(a.family) for a in attacks)
    ]
    if unread and len(unread) == len(metrics):
        raise ConfigError(
            f"metric(s) {', '.join(repr(m.name) for m in unread)} read the adversarial "
            "examples of the plan's attacks, but the plan has no attack they apply to, so "
            "the run would store nothing; add attacks, or measure the clean data (neuron "
            "metrics: config: {data: clean})"
        )
    for metric in unread:
        warnings.warn(
            f"metric {metric.name!r} reads attacks' adversarial examples and the plan has no "
            "attack it applies to, so it gives no value; add attacks (neuron metrics: "
            "config: {data: clean} measures the clean data)",
            AISafetyWarning,
            stacklevel=3,
        )


def with_plan_precision(plan: EvaluationPlan, registry: Registry) -> EvaluationPlan:
    """The plan with its ``precision`` written into every attack that has the option and
    does not set its own, so the stored attack label and config say how it ran (and a
    run in another precision is other work on ``--resume``). fp32, the default, changes
    nothing."""
    if plan.precision == "fp32":
        return plan
    specs = []
    for spec in plan.attacks:
        fields = getattr(registry.get("attack", spec.name).Config, "model_fields", {})
        if "precision" in fields and "precision" not in spec.config:
            spec = spec.model_copy(update={"config": {**spec.config, "precision": plan.precision}})
        specs.append(spec)
    return plan.model_copy(update={"attacks": tuple(specs)})


def _check_labels(data: LoadedDataset, predictor) -> None:
    """Labels beyond the model's classes, refused before any work: with ``ca`` alone they
    ran, and a label the model can never predict (1..10 for 0..9) counted as an error.
    ``data`` is the whole set: a plan's ``limit`` could sample only labels in range."""
    if not len(data):
        return
    low, high, classes = int(data.y.min()), int(data.y.max()), predictor.num_classes
    if low < 0 or high >= classes:
        shifted = " (numbered from 1? give y - 1)" if low == 1 and high == classes else ""
        raise ConfigError(
            f"dataset {data.name!r} has labels {low}..{high}, but model {predictor.name!r} "
            f"has {classes} classes, labels 0..{classes - 1}{shifted}; evaluate it on data "
            "labelled as it was trained"
        )


class Runner:
    def __init__(
        self,
        plan: EvaluationPlan,
        store: ResultStore,
        registry: Registry | None = None,
        resume: bool = False,
        quiet: bool = False,
        model: tuple[Predictor, str] | None = None,
        data: LoadedDataset | None = None,
    ):
        """``model`` (a predictor and its fingerprint) and ``data`` replace the plan's model
        and dataset when given (``aisafety.evaluate(model=..., data=...)``)."""
        self.registry = registry or default_registry()
        self.given_model, self.given_data = model, data
        self.plan = plan = with_plan_precision(plan, self.registry)
        self.store = store
        self.resume = resume
        self.quiet = quiet
        # the run's own warnings (the plan's, loading, the clean pass), stored with the run
        self.warning_log = WarningLog()
        with keeping(self.warning_log):
            warn_failures(self.registry)  # a plugin skipped: the run goes on without it
            # Build every attack and metric now: a bad name or config fails before any work.
            self.attacks = {s.key(): self._make_attack(s) for s in plan.attacks}
            self.metrics: list[Metric] = [self._make_metric(s) for s in plan.metrics]
            warn_unmeasured_attacks(self.attacks.values(), self.metrics)
            warn_default_budgets(plan, self.metrics)  # eps 0.1 on data not MNIST's
            check_attack_metrics_have_attacks(self.attacks.values(), self.metrics)
        baseline_users = [m.name for m in self.metrics if m.needs_reference]
        if baseline_users and plan.reference_model is None:
            raise missing_reference(f"metric {baseline_users[0]!r}")
        self._reference_fingerprint: str | None = None

    def _make_attack(self, spec: AttackSpec) -> Attack:
        """The plan's seed seeds an attack that does not set its own (runs over ``seeds``
        then differ in the attacks' random starts too, not only in the data order)."""
        cls = self.registry.get("attack", spec.name)
        config = dict(spec.config)
        if "seed" in getattr(cls.Config, "model_fields", {}):
            config.setdefault("seed", self.plan.seed)
        attack = self.registry.create("attack", spec.name, config)
        check_work_limits(spec, getattr(attack, "config", None), self.plan.limits)
        return attack

    def _make_metric(self, spec: MetricSpec) -> Metric:
        metric = self.registry.create("metric", spec.name, spec.config)
        check_work_limits(
            f"metric {spec.name!r}", getattr(metric, "config", None), self.plan.limits, False
        )
        if not isinstance(metric, CleanMetric | AttackMetric):
            source = self.registry.sources["metric"].get(spec.name, "?")
            raise PluginError(
                f"metric {spec.name!r} (from {source!r}) is neither a CleanMetric nor an "
                "AttackMetric; subclass one of aisafety.evaluation.base's two metric kinds"
            )
        return metric

    def run(self) -> RunRecord:
        """Every unit of the plan, one after the other in this process (the local executor;
        ``aisafety.execution.run_plan`` picks the plan's executor). Its warnings are stored
        with it, as well as printed."""
        with keeping(self.warning_log):
            return self._run()

    def _run(self) -> RunRecord:
        prepared = self.prepare()
        warn_before_work(prepared.context)  # a CIFAR-100 model on CIFAR-10, before any work
        plan = self.plan
        done = self.store.finished_units() if self.resume else set()
        values: list[MetricValue] = []
        failed: list[str] = []
        resumed = 0
        run_id, status, completed = None, "failed", False
        try:  # from start_run on: whatever happens, finish_run stops the run's heartbeat
            with interrupts_deferred():  # a signal here is raised once the row exists
                run_id = self.store.start_run(plan, __version__, str(prepared.device))
            units = self.work_units(prepared.subject)
            self.store.record_reused(run_id, [u.key for u in units if u.key in done])
            progress = RunProgress([(u.key, u.description) for u in units], enabled=not self.quiet)
            current: list[WorkUnit] = []  # the unit computing now, for a stuck forward pass
            hung = before_exit_on_hang(lambda message: self._record_hang(run_id, current, message))
            with terminate_as_interrupt(), progress, hung:
                self._check_clean_pass(prepared)
                # the model at chance or not repeatable: kept now, whatever ends the run
                self.store.record_warnings(run_id, self.warning_log.take())
                for unit in units:
                    if unit.key in done:
                        values += self.store.unit_values(unit.key)
                        resumed += 1
                        progress.resume(unit.key)
                        continue
                    current[:] = [unit]
                    progress.start(unit.key)
                    try:
                        values += self.compute(prepared, unit, run_id)
                    except TamperingError as exc:  # nothing of it is stored; the rest goes on
                        self.store.record_failure(run_id, unit.key, unit.description, str(exc))
                        failed.append(f"{unit.description}: {exc}")
                        progress.fail(unit.key, str(exc))
                        continue
                    progress.finish(unit.key)
            status = "failed" if failed else "finished"
            completed = True
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except Exception as exc:
            if run_id is not None and getattr(exc, "failed_in", None) is not None:
                self._record_crash(run_id, exc)  # its traceback, kept
            raise
        finally:
            if run_id is not None:
                self._finish_run(run_id, status, completed)
        return RunRecord(
            run_id=run_id,
            plan=plan,
            platform_version=__version__,
            values=tuple(values),
            resumed_units=resumed,
            failed_units=tuple(failed),
        )

    def _record_hang(self, run_id: int, current: list[WorkUnit], message: str) -> None:
        """Before a forward pass stuck in compiled code ends the process (from the watchdog's
        thread): the unit in ``unit_failures`` with the message, the run ``failed``."""
        for unit in current:
            self.store.record_failure(run_id, unit.key, unit.description, message)
        self.store.finish_run(run_id, "failed", self.warning_log.take())

    def _record_crash(self, run_id: int, exc: Exception) -> None:
        """The crashed unit and its traceback in ``unit_failures`` (``--resume`` computes
        it again); the exception itself goes on ending the run."""
        unit = getattr(exc, "failed_unit", None)
        if unit is None:
            return
        details = "".join(traceback.format_exception(exc))
        try:
            self.store.record_failure(run_id, unit.key, unit.description, details)
        except StoreError as error:  # the crash, not the database, is what to show
            warnings.warn(str(error), AISafetyWarning, stacklevel=2)

    def _finish_run(self, run_id: int, status: str, completed: bool) -> None:
        """Mark the run; when an error is already ending it (a database server that stayed
        away), failing to mark it must not hide that error: it is warned about instead."""
        try:
            self.store.finish_run(run_id, status, self.warning_log.take())
        except StoreError as exc:
            if completed:
                raise
            warnings.warn(f"{exc} (the run stays 'running' until the next run marks it)",
                          AISafetyWarning, stacklevel=2)  # fmt: skip

    def _check_clean_pass(self, prepared: Prepared) -> None:
        """The clean outputs, computed before any plugin runs, with the model's first
        forward passes checked (a model that changes its inputs or weights fails here), and
        the warnings about the model (``clean_pass_checks.py``, as on Ray)."""
        integrity, name = self._integrity(prepared), prepared.context.predictor.name
        warn_after_clean_pass(
            prepared.context, lambda: integrity.check(f"model {name!r} (the clean forward pass)")
        )

    def _integrity(self, prepared: Prepared) -> RunIntegrity:
        """The fingerprints of ``prepared``'s shared state (taken on first use)."""
        if prepared.integrity is None:
            prepared.integrity = RunIntegrity(prepared.context)
        return prepared.integrity

    def prepare(self) -> Prepared:
        """Model, reference, data and the evaluation context, checked before any work."""
        plan = self.plan
        torch.manual_seed(plan.seed)
        device = resolve_device(plan.device)
        predictor, weights = self.given_model or load_model(plan.model, device, self.registry)
        warn_normalised_twice(predictor)  # kept with the run, also for a model handed in
        predictor = apply_defenses(predictor, plan.defenses, self.registry)
        warn_obfuscation(predictor, self.attacks.values())
        reference = None
        if plan.reference_model is not None:  # the undefended baseline: no plan defenses
            reference, self._reference_fingerprint = load_model(
                plan.reference_model, device, self.registry
            )
            warn_normalised_twice(reference)
        self._check_sizes(predictor)
        for model in (predictor, reference):  # a forward pass that never returns ends
            if model is not None:  # its unit (prediction/watch.py)
                model.forward_timeout = plan.limits.forward_seconds
        whole = self._whole_data()
        _check_labels(whole, predictor)  # all of it: a small limit can miss a wrong label
        data = subset(whole, plan.dataset)
        self._check_capabilities(predictor)
        for attack in self.attacks.values():  # bf16 where the device has none: fail now
            attack.search_predictor(predictor)
        for spec in plan.attacks:
            check_budgets(
                spec, getattr(self.attacks[spec.key()], "norm", None), predictor.input_shape
            )
        subject = Subject(
            model_name=predictor.name,
            model_fingerprint=_key(weights, [d.model_dump(mode="json") for d in plan.defenses]),
            model_spec=plan.model.model_dump(mode="json"),
            capabilities=",".join(sorted(c.value for c in predictor.capabilities)),
            dataset_name=data.name,
            dataset_split=plan.dataset.split,
            dataset_size=len(data),
            dataset_fingerprint=fingerprint(data),
            dataset_spec=plan.dataset.model_dump(mode="json"),
        )
        context = EvaluationContext(
            predictor, data, lambda s: self.attacks[s.key()], plan.batch_size, self.quiet,
            load_profile=self._profile_data,
            reference=reference, seed=plan.seed, corruptions=plan.corruptions,
            shard_size=plan.shard_size,
        )  # fmt: skip
        return Prepared(subject, context, device)

    def _check_sizes(self, predictor) -> None:
        """Counts that only the model's shape makes too large, refused before any work: the
        memory EOT copies or a population would take, targets beyond the model's classes,
        and the input defenses' counts."""
        limits, batch = self.plan.limits, self.plan.batch_size
        for attack in self.attacks.values():
            label, config = f"attack {attack.name!r}", getattr(attack, "config", None)
            check_memory(label, config, limits, batch, predictor.input_shape)
            check_targets(label, config, predictor.num_classes)
        layer = predictor
        while hasattr(layer, "inner"):  # the input defenses, outermost first
            label, config = f"defense {type(layer).name!r}", getattr(layer, "config", None)
            check_work_limits(label, config, limits)
            check_memory(label, config, limits, batch, predictor.input_shape)
            layer = layer.inner

    def _whole_data(self) -> LoadedDataset:
        """The plan's dataset, or the data handed in, before the plan's ``limit``."""
        if self.given_data is None:
            return load_whole_data(self.plan.dataset, self.registry)
        return self.given_data

    def _profile_data(self) -> LoadedDataset:
        """Neuron bounds' data: the plan's profile set; for data handed in without one, that
        data itself (there is no training split to read)."""
        if self.given_data is not None and self.plan.profile_dataset is None:
            return self.given_data
        return load_data(self._profile_spec(), self.registry)

    def _profile_spec(self) -> DatasetSpec:
        """The data neuron bounds come from: the plan's, else the whole train split."""
        if self.plan.profile_dataset is not None:
            return self.plan.profile_dataset
        return self.plan.dataset.model_copy(update={"split": "train", "limit": None})

    def _check_capabilities(self, predictor) -> None:
        """Fail before any work, naming the attacks that would run on this model instead."""
        for attack in self.attacks.values():
            if attack.requires in predictor.capabilities:
                continue
            usable = [
                name
                for name in self.registry.names("attack")
                if self.registry.get("attack", name).requires in predictor.capabilities
            ]
            try:
                predictor.require(attack.requires, f"attack {attack.name!r}")
            except CapabilityError as exc:
                raise CapabilityError(
                    f"{exc} Attacks that run on this model: {', '.join(usable) or '(none)'}."
                ) from None
        for metric in self.metrics:
            predictor.require(metric.requires, f"metric {metric.name!r}")
            metric.check_model(predictor)

    def _random_defenses(self) -> list[str]:
        """The plan's input defenses that draw at random (a ``seed`` in their config): one
        stream per defense runs across the batches, so their results depend on the batch
        size."""
        return [
            d.name
            for d in self.plan.defenses
            if "seed" in getattr(self.registry.get("defense", d.name).Config, "model_fields", {})
        ]

    def work_units(self, subject: Subject) -> list[WorkUnit]:
        """The plan's units, clean metrics first, each keyed for ``--resume``."""
        base = (subject.model_fingerprint, subject.dataset_fingerprint, self.plan.seed)
        if self._reference_fingerprint is not None:  # another baseline, other defense costs
            base += (self._reference_fingerprint,)
        if self.plan.profile_dataset is not None:  # other neuron bounds, other coverage
            base += (self.plan.profile_dataset.key(),)
        if self._random_defenses():  # their draws run across batches: keyed by the size
            base += (("batch_size", self.plan.batch_size),)
        if self.plan.corruptions != CorruptionsSpec():  # other corrupted sets, other mCE
            base += (self.plan.corruptions.key(),)
        units = self._clean_units(base, subject.dataset_name)
        # other shards, other random streams: a sharded unit is another unit
        shards = () if self.plan.shard_size is None else (("shards", self.plan.shard_size),)
        for spec in self.plan.attacks:
            labels = [m.label() for m in self._attack_metrics(spec)]
            # an attack whose results depend on the chunking: the batch size is part of its
            # units' key, so another batch size is another unit and never mixes with this one
            attack = self.attacks[spec.key()]
            chunking = () if attack.chunk_independent else (("batch_size", self.plan.batch_size),)
            for eps in spec.eps:
                key = _key(base, spec.key(), eps, labels, *shards, *chunking)
                units.append(WorkUnit(key, f"{spec.label} eps={eps:g}", spec, eps))
        return units

    def _clean_units(self, base: tuple, dataset_name: str) -> list[WorkUnit]:
        """The cheap clean metrics as one unit, then one unit per label of the metrics that
        are units of their own (a verifier's hours on one model: ``--resume`` loses one)."""
        clean = self._clean_metrics()
        shared = [m.label() for m in clean if not m.own_unit]
        own = list(dict.fromkeys(m.label() for m in clean if m.own_unit))
        units = []
        if shared:
            key = _key(base, "clean", shared)
            units.append(WorkUnit(key, f"clean metrics on {dataset_name}", metrics=tuple(shared)))
        for label in own:
            key = _key(base, "clean", [label])
            units.append(WorkUnit(key, f"{label} on {dataset_name}", metrics=(label,)))
        return units

    def _clean_metrics(self, labels: tuple[str, ...] | None = None) -> list[CleanMetric]:
        """The plan's clean metrics, or those of one unit (``labels``)."""
        clean = [m for m in self.metrics if isinstance(m, CleanMetric)]
        return clean if labels is None else [m for m in clean if m.label() in labels]

    def _attack_metrics(self, spec: AttackSpec) -> list[AttackMetric]:
        family = self.attacks[spec.key()].family
        return [m for m in self.metrics if isinstance(m, AttackMetric) and m.applies_to(family)]

    def compute(
        self, prepared: Prepared, unit: WorkUnit, run_id: int, log: WarningLog | None = None
    ) -> list[MetricValue]:
        """Compute one unit and store it in one transaction: the same code on every executor
        (on Ray, the attack's shards may have been handed to the context already). ``log``:
        the unit's warnings (on Ray: its shards' already in it, and its task hands them to the
        driver, which prints them)."""
        with keeping(WarningLog(unit.key) if log is None else log) as log:
            try:
                return self._compute_checked(prepared, unit, run_id, log)
            except BaseException:  # a unit that failed: its warnings go with the run's
                for warning in log.entries:
                    self.warning_log.keep(warning)
                raise

    def _compute_checked(
        self, prepared: Prepared, unit: WorkUnit, run_id: int, log: WarningLog
    ) -> list[MetricValue]:
        """``_compute`` under the memory budget, its errors made the platform's."""
        integrity = self._integrity(prepared)
        gib = self.plan.limits.memory_gib
        try:
            # every capability chunks under the plan's memory budget (``memory_budget.py``)
            with memory_limit(None if gib is None else int(gib * GIB)):
                return self._compute(prepared, unit, run_id, integrity, log)
        except TamperingError:
            integrity.restore()  # the next unit computes on what a run without it would
            raise
        except AISafetyError:
            raise
        except Exception as exc:  # torch.OutOfMemoryError included
            reason = (str(exc).strip().splitlines() or [""])[0][:300]
            if isinstance(exc, RuntimeError) and "allocate" in reason:
                raise ConfigError(
                    f"{unit.description}: out of memory ({reason}); lower batch_size, or the "
                    "setting that multiplies the inputs (eot_samples, population, samples), or "
                    "give a smaller limits.memory_gib so that such settings are refused up front"
                ) from None
            # a bug in a plugin (or the model): the run ends as before, and the command line
            # names the call instead of printing a traceback (cli/__init__.py, docs/reliability.md)
            exc.failed_in = integrity.calling or unit.description  # type: ignore[attr-defined]
            exc.failed_unit = unit  # type: ignore[attr-defined]
            raise
        finally:
            integrity.end_unit()

    def _compute(
        self, prepared: Prepared, unit: WorkUnit, run_id: int, integrity: RunIntegrity,
        log: WarningLog,
    ) -> list[MetricValue]:  # fmt: skip
        """One unit, each plugin call followed by the integrity check naming it; stored with
        the warnings it raised (``log``)."""
        ctx, subject = prepared.context, prepared.subject
        checked, meter = integrity.checked, CostMeter()
        if unit.attack is None:
            values = []
            with reuse_freed_memory():  # the unit's large temporaries (``memory.py``)
                for m in self._clean_metrics(unit.metrics):
                    values += checked_values(
                        m, checked(f"metric {m.label()!r}", lambda m=m: m.compute(ctx))
                    )
            self.store.record_unit(
                run_id, unit.key, unit.description, subject, values, __version__, None,
                meter.read(), log.entries,
            )  # fmt: skip
            return values
        spec, eps = unit.attack, unit.eps
        values = []
        with reuse_freed_memory():
            result = checked(
                f"attack {spec.label!r} at eps={eps:g}", lambda: ctx.adversarial(spec, eps)
            )
            integrity.watch_result(f"{spec.label} eps={eps:g}", result)
            for m in self._attack_metrics(spec):
                who = f"metric {m.label()!r} (on {spec.label} eps={eps:g})"
                values += checked_values(m, checked(who, lambda m=m: m.compute(ctx, spec, eps)))
        family = self.attacks[spec.key()].family.value
        self.store.record_unit(
            run_id, unit.key, unit.description, subject, values, __version__,
            (spec, family, result), meter.read(), log.entries,
        )  # fmt: skip
        return values
