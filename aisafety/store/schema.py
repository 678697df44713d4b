"""SQLAlchemy tables of the results store, and the flat ``results`` view.

One row per run, model, dataset, unit of work, attack run, metric value and per-sample
outcome, so "which test images does every defense fail on" is a single SQL query.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    status: Mapped[str] = mapped_column(String(16), default="running")
    platform_version: Mapped[str] = mapped_column(String(32))
    # seeds go up to 2^63 - 1: PostgreSQL's INTEGER is 32-bit (SQLite's is 64-bit either way)
    seed: Mapped[int] = mapped_column(BigInteger)
    device: Mapped[str] = mapped_column(String(16))
    plan: Mapped[dict] = mapped_column(JSON)
    # Who runs it: a 'running' run whose process is gone on this host was killed (kill -9,
    # power loss) and is marked 'interrupted' by the next run that starts.
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    # The run's lease (naive UTC), renewed while it runs: a 'running' run whose heartbeat is
    # older than liveness.STALE_AFTER_S died, on whatever host (aisafety/store/liveness.py).
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    # When the command that made the run started (naive UTC; aisafety/command_clock.py):
    # finished_at less this is the wall time its user waited. NULL for runs made from Python.
    command_started_at: Mapped[datetime | None] = mapped_column(DateTime)
    # The results semantics version of the code that made the run (store/semantics.py): the
    # rules its numbers were counted by. NULL for runs stored before it was kept.
    semantics_version: Mapped[int | None] = mapped_column(Integer)


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("name", "fingerprint"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    capabilities: Mapped[str] = mapped_column(String(200))


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("name", "split", "fingerprint"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    split: Mapped[str] = mapped_column(String(16))
    n_samples: Mapped[int] = mapped_column(Integer)
    fingerprint: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)


class Unit(Base):
    """A unit of work, committed in one transaction; ``--resume`` skips finished keys."""

    __tablename__ = "units"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    description: Mapped[str] = mapped_column(String(400))
    finished_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    # The rows the unit wrote: it counts as finished only while all of them are there, so a
    # dropped or emptied table cannot make ``--resume`` skip work whose results are gone.
    n_values: Mapped[int | None] = mapped_column(Integer)
    n_outcomes: Mapped[int | None] = mapped_column(Integer)
    n_examples: Mapped[int | None] = mapped_column(Integer)
    n_verdicts: Mapped[int | None] = mapped_column(Integer)
    n_certificates: Mapped[int | None] = mapped_column(Integer)
    # What the unit cost (aisafety/unit_cost.py): wall and CPU seconds, the process's peak
    # resident size while it ran and the CUDA allocator's peak; NULL where not measured
    # (units stored before revision 0003, a peak the platform cannot reset, no CUDA).
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_rss_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_gpu_mib: Mapped[float | None] = mapped_column(Float, nullable=True)


class ReusedUnit(Base):
    """A unit a ``--resume`` run took from an earlier run instead of computing it: its rows
    keep ``source_run_id``'s run id, so the report of ``run_id`` reads them from there (a
    later run that computes the key again moves ``units.run_id``, never this row)."""

    __tablename__ = "reused_units"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    unit_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    source_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))


class UnitFailure(Base):
    """A unit that still failed after its retries (``--executor ray``): the rest of the plan
    went on; ``--resume`` computes it again, since it is not in ``units``."""

    __tablename__ = "unit_failures"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    key: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(String(400))
    error: Mapped[str] = mapped_column(Text)
    failed_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RunWarning(Base):
    """An ``AISafetyWarning`` a run raised (aisafety/warning_log.py): the model at chance, a
    model that is not repeatable, ... ``unit_key`` names the unit it was raised in, NULL for
    the run's own (loading, the clean pass); identical warnings of one unit are one row."""

    __tablename__ = "run_warnings"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    # no foreign key: a unit that failed has no row in units, and its warnings are kept too
    unit_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    category: Mapped[str] = mapped_column(String(200))  # the class: AISafetyWarning, ...
    message: Mapped[str] = mapped_column(Text)
    raised_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class AttackRun(Base):
    __tablename__ = "attack_runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    unit_key: Mapped[str] = mapped_column(ForeignKey("units.key"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    attack: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(16))
    norm: Mapped[str | None] = mapped_column(String(8))
    eps: Mapped[float] = mapped_column(Float)
    config: Mapped[dict] = mapped_column(JSON)
    n_samples: Mapped[int] = mapped_column(Integer)
    success_rate: Mapped[float] = mapped_column(Float)
    robust_accuracy: Mapped[float] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)


class MetricValueRow(Base):
    __tablename__ = "metric_values"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    unit_key: Mapped[str] = mapped_column(ForeignKey("units.key"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    attack_run_id: Mapped[int | None] = mapped_column(ForeignKey("attack_runs.id"))
    metric: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float)
    direction: Mapped[str] = mapped_column(String(8))
    unit: Mapped[str] = mapped_column(String(32))
    attack: Mapped[str | None] = mapped_column(String(200))
    eps: Mapped[float | None] = mapped_column(Float)
    n_samples: Mapped[int] = mapped_column(Integer)
    details: Mapped[dict] = mapped_column(JSON)
    platform_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    # 95% Clopper-Pearson interval of a rate (unit "fraction") over its n samples; NULL for
    # other metrics (aisafety/report/intervals.py)
    ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)


class SampleOutcome(Base):
    __tablename__ = "sample_outcomes"
    id: Mapped[int] = mapped_column(primary_key=True)
    attack_run_id: Mapped[int] = mapped_column(ForeignKey("attack_runs.id"), index=True)
    sample_index: Mapped[int] = mapped_column(Integer)
    label: Mapped[int] = mapped_column(Integer)
    clean_pred: Mapped[int] = mapped_column(Integer)
    adv_pred: Mapped[int] = mapped_column(Integer)
    success: Mapped[bool] = mapped_column(Boolean)
    steps: Mapped[int] = mapped_column(Integer)
    l0: Mapped[float] = mapped_column(Float)
    l1: Mapped[float] = mapped_column(Float)
    l2: Mapped[float] = mapped_column(Float)
    linf: Mapped[float] = mapped_column(Float)
    true_conf_clean: Mapped[float] = mapped_column(Float)
    true_conf_adv: Mapped[float] = mapped_column(Float)
    # the ensemble member whose example broke the sample (``standard``, ``rand``); NULL for
    # a single attack, for a sample no member broke, and for one misclassified unattacked
    broken_by: Mapped[str | None] = mapped_column(String(200), nullable=True)


class EnsembleMember(Base):
    """One member of an ensemble attack run (``standard``, ``rand``): what it ran on, broke
    and cost. ``n_broken`` over a run's members sums to the samples the attacks broke."""

    __tablename__ = "ensemble_members"
    id: Mapped[int] = mapped_column(primary_key=True)
    attack_run_id: Mapped[int] = mapped_column(ForeignKey("attack_runs.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # 1 = ran first
    member: Mapped[str] = mapped_column(String(200))
    n_attacked: Mapped[int] = mapped_column(Integer)  # samples still robust when it ran
    n_broken: Mapped[int] = mapped_column(Integer)  # of those, the ones it broke
    steps: Mapped[int] = mapped_column(Integer)  # its steps (or queries), summed over samples
    seconds: Mapped[float] = mapped_column(Float)


class SmoothingCertificate(Base):
    """One image's CERTIFY result (randomized smoothing), written once per unit and setting."""

    __tablename__ = "smoothing_certificates"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    unit_key: Mapped[str] = mapped_column(ForeignKey("units.key"), index=True)
    certificates: Mapped[str] = mapped_column(String(64))  # the setting's key in details
    norm: Mapped[str] = mapped_column(String(8))
    sample_index: Mapped[int] = mapped_column(Integer)
    label: Mapped[int] = mapped_column(Integer)
    prediction: Mapped[int] = mapped_column(Integer)  # -1: abstained
    abstained: Mapped[bool] = mapped_column(Boolean)
    p_a_lower: Mapped[float] = mapped_column(Float)
    radius: Mapped[float] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)


class VerificationSample(Base):
    """One sample's verdict under a certified metric (``MetricValue.verdicts``)."""

    __tablename__ = "verification_samples"
    id: Mapped[int] = mapped_column(primary_key=True)
    metric_value_id: Mapped[int] = mapped_column(ForeignKey("metric_values.id"), index=True)
    sample_index: Mapped[int] = mapped_column(Integer)
    label: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(16))  # certified / falsified / unknown / radius
    margin: Mapped[float | None] = mapped_column(Float)  # proved bound (radius for ACR)
    seconds: Mapped[float | None] = mapped_column(Float)
    attack: Mapped[dict] = mapped_column(JSON)  # the attack's outcome on this sample


class RunEnvironment(Base):
    """Where a run ran (the report's provenance): one row per run, written at its start."""

    __tablename__ = "run_environments"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    platform: Mapped[str] = mapped_column(String(200))
    python: Mapped[str] = mapped_column(String(32))
    torch: Mapped[str] = mapped_column(String(32))
    cpu_count: Mapped[int] = mapped_column(Integer)


class ExampleImage(Base):
    """A few inputs of each attack run, clean and adversarial (float16 arrays of ``shape``),
    so the report can show them from the database alone; see ``store.EXAMPLES_PER_RUN``."""

    __tablename__ = "example_images"
    id: Mapped[int] = mapped_column(primary_key=True)
    attack_run_id: Mapped[int] = mapped_column(ForeignKey("attack_runs.id"), index=True)
    sample_index: Mapped[int] = mapped_column(Integer)
    shape: Mapped[list] = mapped_column(JSON)
    clean: Mapped[bytes] = mapped_column(LargeBinary)
    adversarial: Mapped[bytes] = mapped_column(LargeBinary)


RESULTS_VIEW = """
CREATE VIEW IF NOT EXISTS results AS
SELECT mv.run_id AS run_id,
       m.name AS model,
       d.name AS dataset,
       d.split AS split,
       mv.metric AS metric,
       mv.attack AS attack,
       ar.norm AS norm,
       mv.eps AS eps,
       mv.value AS value,
       mv.direction AS direction,
       mv.unit AS unit,
       mv.n_samples AS n_samples,
       mv.platform_version AS platform_version,
       mv.created_at AS created_at
FROM metric_values mv
JOIN models m ON m.id = mv.model_id
JOIN datasets d ON d.id = mv.dataset_id
LEFT JOIN attack_runs ar ON ar.id = mv.attack_run_id
"""

# Robust accuracy against budget, one row per (run, model, attack, eps), every attack family
# except corruptions (their eps is ignored). eps = 0 is the clean accuracy on the same samples,
# taken from the per-sample outcomes of the attack's first run.
ACCURACY_CURVES_VIEW = """
CREATE VIEW IF NOT EXISTS accuracy_curves AS
SELECT ar.run_id AS run_id,
       m.name AS model,
       d.name AS dataset,
       ar.attack AS attack,
       ar.family AS family,
       ar.norm AS norm,
       ar.eps AS eps,
       ar.robust_accuracy AS robust_accuracy,
       ar.n_samples AS n_samples
FROM attack_runs ar
JOIN models m ON m.id = ar.model_id
JOIN datasets d ON d.id = ar.dataset_id
WHERE ar.family <> 'corruption'
UNION ALL
SELECT ar.run_id, m.name, d.name, ar.attack, ar.family, ar.norm, 0.0,
       AVG(CASE WHEN so.clean_pred = so.label THEN 1.0 ELSE 0.0 END), COUNT(*)
FROM attack_runs ar
JOIN models m ON m.id = ar.model_id
JOIN datasets d ON d.id = ar.dataset_id
JOIN sample_outcomes so ON so.attack_run_id = ar.id
WHERE ar.family <> 'corruption'
  AND ar.id IN (SELECT MIN(id) FROM attack_runs GROUP BY run_id, model_id, dataset_id, attack)
GROUP BY ar.id, ar.run_id, m.name, d.name, ar.attack, ar.family, ar.norm
"""

VIEWS = (RESULTS_VIEW, ACCURACY_CURVES_VIEW)
