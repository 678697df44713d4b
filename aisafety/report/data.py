"""Everything a report shows about one run, read from the results database alone.

Any stored run, old or new, can be reported: tables a run predates (example images, the
run's machine) simply come back empty and their sections say so.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, exists, func, or_, select
from sqlalchemy.orm import Session

from aisafety.errors import ConfigError
from aisafety.store import schema
from aisafety.store.engine import shown_url
from aisafety.store.results import ResultStore


@dataclass(frozen=True)
class MetricRow:
    model: str
    dataset: str
    metric: str
    attack: str | None
    eps: float | None
    value: float | None
    direction: str
    unit: str
    n_samples: int
    details: dict[str, Any]
    id: int = 0
    ci: tuple[float, float] | None = None  # the stored 95% interval of a rate

    @property
    def name(self) -> str:
        """The metric without its settings: ``ald(p=2)`` -> ``ald``."""
        return self.metric.split("(", 1)[0]


@dataclass(frozen=True)
class AttackRunRow:
    id: int
    model: str
    dataset: str
    attack: str
    family: str
    norm: str | None
    eps: float
    config: dict[str, Any]
    n_samples: int
    robust_accuracy: float
    seconds: float

    @property
    def name(self) -> str:
        """The registered attack name: ``pgd-linf(steps=10)`` -> ``pgd-linf``."""
        return self.attack.split("(", 1)[0]


@dataclass(frozen=True)
class MemberRow:
    """One member of an ensemble attack run, in the order they ran (``ensemble_members``)."""

    member: str
    n_attacked: int  # samples still robust when it ran
    n_broken: int  # of those, the ones it broke


@dataclass(frozen=True)
class UnitRow:
    """One unit of the run and what it cost (NULL costs: stored before they were kept)."""

    description: str
    finished_at: datetime
    seconds: float | None
    cpu_seconds: float | None
    peak_rss_mib: float | None
    peak_gpu_mib: float | None
    from_run: int | None = None  # the earlier run it was reused from (``--resume``)


@dataclass(frozen=True)
class WarningRow:
    """A warning the run raised: in a unit (its description), or the run's own (None)."""

    unit: str | None
    category: str
    message: str


@dataclass(frozen=True)
class Example:
    attack_run_id: int
    sample_index: int
    clean: np.ndarray  # (C, H, W) in [0, 1]
    adversarial: np.ndarray


@dataclass
class RunData:
    run_id: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    platform_version: str
    seed: int
    device: str
    plan: dict[str, Any]
    environment: dict[str, Any] | None
    models: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    metrics: list[MetricRow]
    attack_runs: list[AttackRunRow]
    # attack run id -> per-sample arrays (sample_index order): label, clean_pred, adv_pred
    outcomes: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    examples: dict[int, list[Example]] = field(default_factory=dict)
    # metric value id -> per-sample certified radii (verdict "radius" rows of a verifier)
    radii: dict[int, np.ndarray] = field(default_factory=dict)
    # when the command that made it started (None: made from Python, or before it was kept)
    command_started_at: datetime | None = None
    units: list[UnitRow] = field(default_factory=list)  # in the order they finished
    members: dict[int, list[MemberRow]] = field(default_factory=dict)  # ensemble attack runs
    warnings: list[WarningRow] = field(default_factory=list)  # the run's own first
    # the rules its numbers were counted by (store/semantics.py; NULL read as UNRECORDED)
    semantics_version: int | None = None

    @property
    def wall_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def command_seconds(self) -> float | None:
        """The wall time its user waited: from the command's start to the run's end."""
        if self.finished_at is None or self.command_started_at is None:
            return None
        return (self.finished_at - self.command_started_at).total_seconds()

    @property
    def model_names(self) -> list[str]:
        return [m["name"] for m in self.models]

    def correct(self, attack_run_id: int) -> np.ndarray:
        """Per sample: still classified correctly under this attack run."""
        o = self.outcomes[attack_run_id]
        return o["adv_pred"] == o["label"]

    def clean_correct(self, attack_run_id: int) -> np.ndarray:
        o = self.outcomes[attack_run_id]
        return o["clean_pred"] == o["label"]


def latest_run_id(store: ResultStore) -> int:
    with Session(store.engine) as session:
        run_id = session.scalar(select(func.max(schema.Run.id)))
    if run_id is None:
        raise ConfigError(
            f"the database {shown_url(store.url)!r} holds no runs yet; run 'aisafety evaluate' "
            "first"
        )
    return run_id


# Runs stored before corruptions left ``attacks:`` hold corruption attack runs (no budget, eps
# ignored); they are no attack results, so the report reads around them, as the schema's
# ``robust_accuracy`` views do. Their corruption errors are in the mce/rmce metric values.
LEGACY_CORRUPTION = "corruption"


def load_run(store: ResultStore, run_id: int) -> RunData:
    """Read run ``run_id`` with its models, metric values, attack runs and outcomes."""
    with Session(store.engine) as session:
        run = session.get(schema.Run, run_id)
        if run is None:
            known = list(session.scalars(select(schema.Run.id).order_by(schema.Run.id)))
            shown = ", ".join(map(str, known[-10:])) or "none"
            raise ConfigError(
                f"run {run_id} is not in {shown_url(store.url)!r} (runs there: {shown}); "
                "use --latest or one of those ids"
            )
        env = session.get(schema.RunEnvironment, run_id)
        names = _names(session)
        metrics = [
            MetricRow(
                model=names["model"][r.model_id]["name"],
                dataset=names["dataset"][r.dataset_id]["name"],
                metric=r.metric,
                attack=r.attack,
                eps=r.eps,
                value=r.value,
                direction=r.direction,
                unit=r.unit,
                n_samples=r.n_samples,
                details=r.details or {},
                id=r.id,
                ci=None if r.ci_low is None else (r.ci_low, r.ci_high),
            )
            for r in session.scalars(
                select(schema.MetricValueRow)
                .where(of_run(schema.MetricValueRow, run_id))
                .order_by(schema.MetricValueRow.id)
            )
        ]
        attack_rows = list(
            session.scalars(
                select(schema.AttackRun)
                .where(of_run(schema.AttackRun, run_id))
                .where(schema.AttackRun.family != LEGACY_CORRUPTION)
                .order_by(schema.AttackRun.id)
            )
        )
        attack_runs = [
            AttackRunRow(
                id=a.id,
                model=names["model"][a.model_id]["name"],
                dataset=names["dataset"][a.dataset_id]["name"],
                attack=a.attack,
                family=a.family,
                norm=a.norm,
                eps=a.eps,
                config=a.config or {},
                n_samples=a.n_samples,
                robust_accuracy=a.robust_accuracy,
                seconds=a.seconds,
            )
            for a in attack_rows
        ]
        model_ids = {a.model_id for a in attack_rows} | {
            r.model_id
            for r in session.scalars(
                select(schema.MetricValueRow).where(of_run(schema.MetricValueRow, run_id))
            )
        }
        dataset_ids = {a.dataset_id for a in attack_rows} | {
            r.dataset_id
            for r in session.scalars(
                select(schema.MetricValueRow).where(of_run(schema.MetricValueRow, run_id))
            )
        }
        ids = [a.id for a in attack_rows]
        data = RunData(
            run_id=run.id,
            status=run.status,
            started_at=run.started_at,
            finished_at=run.finished_at,
            command_started_at=run.command_started_at,
            semantics_version=run.semantics_version,
            platform_version=run.platform_version,
            seed=run.seed,
            device=run.device,
            plan=run.plan or {},
            environment=None
            if env is None
            else {
                "hostname": env.hostname,
                "platform": env.platform,
                "python": env.python,
                "torch": env.torch,
                "cpu_count": env.cpu_count,
            },
            models=[names["model"][i] for i in sorted(model_ids)],
            datasets=[names["dataset"][i] for i in sorted(dataset_ids)],
            metrics=metrics,
            attack_runs=attack_runs,
            outcomes=_outcomes(session, ids),
            examples=_examples(session, ids),
            radii=_radii(session, [m.id for m in metrics]),
            units=_units(session, run_id),
            members=_members(session, ids),
        )
    data.warnings = [WarningRow(*w) for w in store.run_warnings(run_id)]
    return data


def of_run(table: type, run_id: int) -> ColumnElement[bool]:
    """Rows of ``table`` (one with ``run_id`` and ``unit_key``) that belong to run ``run_id``:
    those it stored, and those of the units it reused from earlier runs (``--resume``), so a
    resumed run reads as the whole plan whichever run computed each unit."""
    reused = schema.ReusedUnit
    return or_(
        table.run_id == run_id,
        exists().where(
            reused.run_id == run_id,
            reused.unit_key == table.unit_key,
            reused.source_run_id == table.run_id,
        ),
    )


def _units(session: Session, run_id: int) -> list[UnitRow]:
    """The units this run stored (a unit a later run computed again is that run's), then
    those it reused, each with the run it came from."""
    rows = session.scalars(
        select(schema.Unit).where(schema.Unit.run_id == run_id).order_by(schema.Unit.finished_at)
    )
    own = [
        UnitRow(u.description, u.finished_at, u.seconds, u.cpu_seconds, u.peak_rss_mib,
                u.peak_gpu_mib)
        for u in rows
    ]  # fmt: skip
    reused = session.execute(
        select(schema.Unit, schema.ReusedUnit.source_run_id)
        .join(schema.ReusedUnit, schema.ReusedUnit.unit_key == schema.Unit.key)
        .where(schema.ReusedUnit.run_id == run_id)
        .order_by(schema.ReusedUnit.source_run_id, schema.Unit.finished_at)
    )
    return own + [
        UnitRow(u.description, u.finished_at, u.seconds, u.cpu_seconds, u.peak_rss_mib,
                u.peak_gpu_mib, from_run=source)
        for u, source in reused
    ]  # fmt: skip


def _members(session: Session, attack_run_ids: list[int]) -> dict[int, list[MemberRow]]:
    """Each ensemble attack run's members, in the order they ran."""
    rows = session.scalars(
        select(schema.EnsembleMember)
        .where(schema.EnsembleMember.attack_run_id.in_(attack_run_ids))
        .order_by(schema.EnsembleMember.attack_run_id, schema.EnsembleMember.position)
    )
    members: dict[int, list[MemberRow]] = {}
    for r in rows:
        members.setdefault(r.attack_run_id, []).append(
            MemberRow(r.member, r.n_attacked, r.n_broken)
        )
    return members


def _names(session: Session) -> dict[str, dict[int, dict[str, Any]]]:
    models = {
        m.id: {
            "name": m.name,
            "fingerprint": m.fingerprint,
            "spec": m.spec,
            "capabilities": m.capabilities,
        }
        for m in session.scalars(select(schema.Model))
    }
    datasets = {
        d.id: {
            "name": d.name,
            "split": d.split,
            "n_samples": d.n_samples,
            "fingerprint": d.fingerprint,
            "spec": d.spec,
        }
        for d in session.scalars(select(schema.Dataset))
    }
    return {"model": models, "dataset": datasets}


def _outcomes(session: Session, attack_run_ids: list[int]) -> dict[int, dict[str, np.ndarray]]:
    if not attack_run_ids:
        return {}
    so = schema.SampleOutcome
    rows = session.execute(
        select(so.attack_run_id, so.sample_index, so.label, so.clean_pred, so.adv_pred)
        .where(so.attack_run_id.in_(attack_run_ids))
        .order_by(so.attack_run_id, so.sample_index)
    ).all()
    grouped: dict[int, list[tuple]] = defaultdict(list)
    for run_id, *rest in rows:
        grouped[run_id].append(rest)
    out = {}
    for run_id, values in grouped.items():
        array = np.asarray(values, dtype=np.int64)
        out[run_id] = {
            "sample_index": array[:, 0],
            "label": array[:, 1],
            "clean_pred": array[:, 2],
            "adv_pred": array[:, 3],
        }
    return out


def _examples(session: Session, attack_run_ids: list[int]) -> dict[int, list[Example]]:
    if not attack_run_ids:
        return {}
    out: dict[int, list[Example]] = defaultdict(list)
    for row in session.scalars(
        select(schema.ExampleImage)
        .where(schema.ExampleImage.attack_run_id.in_(attack_run_ids))
        .order_by(schema.ExampleImage.id)
    ):
        shape = tuple(row.shape)
        out[row.attack_run_id].append(
            Example(
                attack_run_id=row.attack_run_id,
                sample_index=row.sample_index,
                clean=np.frombuffer(row.clean, np.float16).reshape(shape).astype(np.float32),
                adversarial=np.frombuffer(row.adversarial, np.float16)
                .reshape(shape)
                .astype(np.float32),
            )
        )
    return dict(out)


def _radii(session: Session, metric_value_ids: list[int]) -> dict[int, np.ndarray]:
    """Per-sample certified radii stored by radius metrics (e.g. average-certified-radius)."""
    table = getattr(schema, "VerificationSample", None)
    if table is None or not metric_value_ids:
        return {}
    grouped: dict[int, list[float]] = defaultdict(list)
    for value_id, margin in session.execute(
        select(table.metric_value_id, table.margin)
        .where(table.metric_value_id.in_(metric_value_ids), table.verdict == "radius")
        .order_by(table.metric_value_id, table.sample_index)
    ):
        grouped[value_id].append(np.nan if margin is None else margin)
    return {k: np.asarray(v, dtype=float) for k, v in grouped.items()}
