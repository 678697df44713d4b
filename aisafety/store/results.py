"""The results store: every run, metric value and per-sample outcome as SQL rows.

SQLite (``./aisafety.db``) by default; any SQLAlchemy URL works (PostgreSQL when one machine
is not enough). Each unit of work is written in one transaction, so an interrupted run keeps
everything it finished, and ``--resume`` recognises finished units by their key.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import exists, insert, or_, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from aisafety.command_clock import command_started_at
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackSpec, Direction, EvaluationPlan, MetricValue
from aisafety.store import DEFAULT_URL, schema, semantics
from aisafety.store.engine import (
    check_url,
    checkpoint,
    open_engine,
    shown_url,
    with_retries,
)
from aisafety.store.liveness import Heartbeat, mark_dead_runs, utc_now
from aisafety.store.migration import migrate
from aisafety.store.read_only import query_read_only
from aisafety.unit_cost import UnitCost
from aisafety.warning_log import KeptWarning

if TYPE_CHECKING:  # torch is imported where rows are written: reading needs none
    from aisafety.attack.result import AttackResult

# Inputs kept per attack run for the report's example panels: successful ones first.
EXAMPLES_PER_RUN = 4


@dataclass(frozen=True)
class Subject:
    """The model and dataset a unit's rows belong to."""

    model_name: str
    model_fingerprint: str
    model_spec: dict[str, Any]
    capabilities: str
    dataset_name: str
    dataset_split: str
    dataset_size: int
    dataset_fingerprint: str
    dataset_spec: dict[str, Any]


def open_error(exc: BaseException) -> str:
    """What went wrong opening the store; a refused connection (a server down, a database
    not created) also names what to check, which the driver's message does not."""
    if isinstance(exc, OperationalError) and exc.orig is not None:
        return (
            f"{str(exc.orig).strip()}; check --db (host, port, database name, user, password), "
            "that the server runs and that the database exists (PostgreSQL: createdb NAME)"
        )
    if isinstance(exc, ImportError):  # postgresql:// asks SQLAlchemy 2.0 for psycopg2
        return (
            f"{exc}; the database's driver is not installed: for PostgreSQL write the URL as "
            "postgresql+psycopg://... (pip install 'aisafety[distributed]')"
        )
    return str(exc)


class ResultStore:
    """The results database. ``create=False`` refuses a SQLite file that does not exist."""

    def __init__(self, url: str = DEFAULT_URL, create: bool = True):
        check_url(url, create)
        try:
            self.engine: Engine = open_engine(url)
            migrate(self.engine, schema.Base.metadata, schema.VIEWS)
        except (SQLAlchemyError, ImportError) as exc:
            shown = shown_url(url)
            raise ConfigError(
                f"cannot open the results database {shown!r}: {open_error(exc)}"
            ) from exc
        self.url = url
        self._heartbeats: dict[int, Heartbeat] = {}

    # runs -------------------------------------------------------------------------------
    def start_run(self, plan: EvaluationPlan, version: str, device: str) -> int:
        """A new run row, whose lease a heartbeat thread renews until ``finish_run``; runs
        that died (lease expired, or process gone on this host) are marked interrupted."""

        def start() -> int:
            with Session(self.engine) as session, session.begin():
                mark_dead_runs(session)
                run = schema.Run(
                    platform_version=version,
                    seed=plan.seed,
                    device=device,
                    plan=plan.model_dump(mode="json"),
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    heartbeat_at=utc_now(),
                    command_started_at=command_started_at(),
                    semantics_version=semantics.CURRENT,
                )
                session.add(run)
                session.flush()
                session.add(_environment(run.id))
                return run.id

        run_id = with_retries(f"start a run in {shown_url(self.url)}", start)
        self._heartbeats[run_id] = Heartbeat(self.engine, run_id)
        return run_id

    def finish_run(
        self, run_id: int, status: str = "finished", warnings: Sequence[KeptWarning] = ()
    ) -> None:
        """Mark the run ``status``, with the ``warnings`` it raised not yet written."""
        heartbeat = self._heartbeats.pop(run_id, None)
        if heartbeat is not None:
            heartbeat.stop()

        def finish() -> None:
            with Session(self.engine) as session, session.begin():
                run = session.get(schema.Run, run_id)
                run.status = status
                run.finished_at = schema.utcnow()
                session.add_all(_warning_rows(run_id, warnings))

        with_retries(f"mark run {run_id} {status} in {shown_url(self.url)}", finish)
        checkpoint(self.engine)

    def record_warnings(self, run_id: int, warnings: Sequence[KeptWarning]) -> None:
        """The ``AISafetyWarning``\\ s a run raised, each written once by its caller
        (``WarningLog.take``), so that they outlive the terminal."""
        if not warnings:
            return

        def write() -> None:
            with Session(self.engine) as session, session.begin():
                session.add_all(_warning_rows(run_id, warnings))

        with_retries(f"store the warnings of run {run_id} in {shown_url(self.url)}", write)

    def run_warnings(self, run_id: int) -> list[tuple[str | None, str, str]]:
        """(unit description or None, category, message) of ``run_id``'s warnings, the run's
        own first, then by unit in the order they were written (a unit that failed: its key);
        a unit it reused (``--resume``) brings the warnings its earlier run raised in it."""
        w, u, r = schema.RunWarning, schema.Unit, schema.ReusedUnit
        reused = exists().where(
            r.run_id == run_id, r.unit_key == w.unit_key, r.source_run_id == w.run_id
        )
        with Session(self.engine) as session:
            rows = session.execute(
                select(w.unit_key, u.description, w.category, w.message)
                .outerjoin(u, u.key == w.unit_key)
                .where(or_(w.run_id == run_id, reused))
                .order_by(w.unit_key.is_not(None), w.id)
            ).all()
        return [
            (None if key is None else description or key, category, message)
            for key, description, category, message in rows
        ]

    # units ------------------------------------------------------------------------------
    def finished_units(self) -> set[str]:
        """Keys of units whose rows are all present (counted against what the unit wrote)."""
        with Session(self.engine) as session:
            return set(session.scalars(text(FINISHED_UNITS_SQL)))

    def record_reused(self, run_id: int, keys: Sequence[str]) -> dict[str, int]:
        """That ``run_id`` takes the finished units ``keys`` from the runs that stored them
        (``--resume``), so that its report reads them from there; returns key -> that run."""
        if not keys:
            return {}

        def write() -> dict[str, int]:
            with Session(self.engine) as session, session.begin():
                unit = schema.Unit
                sources = dict(
                    session.execute(select(unit.key, unit.run_id).where(unit.key.in_(keys))).all()
                )
                session.add_all(
                    schema.ReusedUnit(run_id=run_id, unit_key=key, source_run_id=source)
                    for key, source in sources.items()
                )
                return sources

        return with_retries(f"store the units run {run_id} reused in {shown_url(self.url)}", write)

    def reused_units(self, run_id: int) -> dict[str, int]:
        """Key -> the earlier run whose rows ``run_id`` reused (``--resume``), none else."""
        r = schema.ReusedUnit
        with Session(self.engine) as session:
            rows = session.execute(select(r.unit_key, r.source_run_id).where(r.run_id == run_id))
            return dict(rows.all())

    def unit_values(self, key: str) -> list[MetricValue]:
        """The metric values a finished unit stored (shown again on ``--resume``)."""
        with Session(self.engine) as session:
            latest = session.get(schema.Unit, key)
            rows = session.scalars(
                select(schema.MetricValueRow)
                .where(schema.MetricValueRow.unit_key == key)
                .where(schema.MetricValueRow.run_id == (latest.run_id if latest else None))
                .order_by(schema.MetricValueRow.id)
            )
            return [
                MetricValue(
                    metric=r.metric,
                    value=float("nan") if r.value is None else r.value,
                    direction=Direction(r.direction),
                    unit=r.unit,
                    attack=r.attack,
                    eps=r.eps,
                    n_samples=r.n_samples,
                    details=r.details,
                )
                for r in rows
            ]

    def record_unit(
        self,
        run_id: int,
        key: str,
        description: str,
        subject: Subject,
        values: list[MetricValue],
        version: str,
        attack: tuple[AttackSpec, str, AttackResult] | None = None,
        cost: UnitCost | None = None,
        warnings: Sequence[KeptWarning] = (),
    ) -> bool:
        """Write a unit, its attack run, outcomes and values in one transaction (retried
        while another process holds the write lock). Idempotent per (run, unit key): a unit
        this run already stored (a retried task whose first attempt committed) is left as it
        is and False is returned. ``cost``: what computing it took (``unit_cost.py``);
        ``warnings``: the ones raised while computing it."""
        written = with_retries(
            f"store unit {description!r} in {shown_url(self.url)}",
            lambda: self._write_unit(
                run_id, key, description, subject, values, version, attack, cost, warnings
            ),
        )
        checkpoint(self.engine)
        return written

    def record_failure(self, run_id: int, key: str, description: str, error: str) -> None:
        """A unit that failed for good (after its retries): kept with its error, so the run
        says what is missing; ``--resume`` computes it again."""

        def write() -> None:
            with Session(self.engine) as session, session.begin():
                session.add(
                    schema.UnitFailure(
                        run_id=run_id, key=key, description=description[:400], error=error
                    )
                )

        with_retries(f"record the failure of unit {description!r} in {shown_url(self.url)}", write)

    def failures(self, run_id: int) -> list[tuple[str, str, str]]:
        """(key, description, error) of the units of ``run_id`` that failed for good."""
        with Session(self.engine) as session:
            rows = session.scalars(
                select(schema.UnitFailure)
                .where(schema.UnitFailure.run_id == run_id)
                .order_by(schema.UnitFailure.id)
            )
            return [(r.key, r.description, r.error) for r in rows]

    def _write_unit(
        self,
        run_id: int,
        key: str,
        description: str,
        subject: Subject,
        values: list[MetricValue],
        version: str,
        attack: tuple[AttackSpec, str, AttackResult] | None,
        cost: UnitCost | None = None,
        warnings: Sequence[KeptWarning] = (),
    ) -> bool:
        with Session(self.engine) as session, session.begin():
            # Locked until commit (PostgreSQL), so two attempts of one task cannot both write;
            # two first inserts of one key collide on the primary key and the retry finds it.
            stored = session.get(schema.Unit, key, with_for_update=True)
            if stored is not None and stored.run_id == run_id:
                return False
            model_id, dataset_id = self._subject_ids(session, subject)
            # A unit run again without --resume (same key) now points at its latest run; the
            # earlier run's rows stay, so history is kept and --resume shows the latest values.
            fields = {
                "run_id": run_id,
                "description": description,
                "finished_at": schema.utcnow(),
                "n_values": len(values),
                "n_outcomes": 0 if attack is None else len(attack[2].y),
                **cost_columns(cost),
            }
            if stored is None:  # an INSERT: a concurrent first write of this key collides
                unit = schema.Unit(key=key, **fields)
                session.add(unit)
            else:
                unit = stored
                for name, value in fields.items():
                    setattr(unit, name, value)
            session.flush()
            attack_run_id, unit.n_examples = None, 0
            if attack is not None:
                attack_run_id, unit.n_examples = self._add_attack_run(
                    session, run_id, key, model_id, dataset_id, *attack
                )
            unit.n_certificates = self._add_certificates(session, run_id, key, values)
            rows = [
                schema.MetricValueRow(
                    run_id=run_id,
                    unit_key=key,
                    model_id=model_id,
                    dataset_id=dataset_id,
                    attack_run_id=attack_run_id,
                    metric=v.metric,
                    value=None if v.value != v.value else v.value,
                    direction=v.direction.value,
                    unit=v.unit,
                    attack=v.attack,
                    eps=v.eps,
                    n_samples=v.n_samples,
                    details=v.details,
                    platform_version=version,
                    **_interval(v),
                )
                for v in values
            ]
            session.add_all(rows)
            unit.n_verdicts = _add_sample_verdicts(session, rows, values)
            session.add_all(_warning_rows(run_id, warnings))
        return True

    @staticmethod
    def _add_certificates(
        session: Session, run_id: int, key: str, values: list[MetricValue]
    ) -> int:
        """The rows of each value's ``smoothing_certificates``, once per certificate setting
        (the smoothed metrics of one setting share them); returns how many it wrote."""
        written, count = set(), 0
        for v in values:
            cert = v.smoothing_certificates
            if cert is None or cert.setting in written:
                continue
            written.add(cert.setting)
            columns = zip(
                cert.sample_index, cert.label, cert.prediction, cert.p_a_lower, cert.radius,
                cert.seconds, strict=True,
            )  # fmt: skip
            rows = [
                {"run_id": run_id, "unit_key": key, "certificates": cert.setting,
                 "norm": cert.norm, "sample_index": i, "label": label, "prediction": prediction,
                 "p_a_lower": p_a_lower, "radius": radius, "seconds": seconds,
                 "abstained": prediction == -1}
                for i, label, prediction, p_a_lower, radius, seconds in columns
            ]  # fmt: skip
            count += len(rows)
            session.execute(insert(schema.SmoothingCertificate), rows)
        return count

    def _subject_ids(self, session: Session, s: Subject) -> tuple[int, int]:
        model = session.scalar(
            select(schema.Model).filter_by(name=s.model_name, fingerprint=s.model_fingerprint)
        )
        if model is None:
            model = schema.Model(
                name=s.model_name,
                fingerprint=s.model_fingerprint,
                spec=s.model_spec,
                capabilities=s.capabilities,
            )
            session.add(model)
        dataset = session.scalar(
            select(schema.Dataset).filter_by(
                name=s.dataset_name, split=s.dataset_split, fingerprint=s.dataset_fingerprint
            )
        )
        if dataset is None:
            dataset = schema.Dataset(
                name=s.dataset_name,
                split=s.dataset_split,
                n_samples=s.dataset_size,
                fingerprint=s.dataset_fingerprint,
                spec=s.dataset_spec,
            )
            session.add(dataset)
        session.flush()
        return model.id, dataset.id

    @staticmethod
    def _add_attack_run(
        session: Session,
        run_id: int,
        key: str,
        model_id: int,
        dataset_id: int,
        spec: AttackSpec,
        family: str,
        result: AttackResult,
    ) -> tuple[int, int]:
        """The attack run's row, its outcomes and examples: (its id, how many examples)."""
        row = schema.AttackRun(
            run_id=run_id,
            unit_key=key,
            model_id=model_id,
            dataset_id=dataset_id,
            attack=spec.label,
            family=family,
            norm=result.norm.value if result.norm else None,
            eps=result.eps,
            config=spec.config,
            n_samples=len(result.y),
            success_rate=result.success_rate,
            robust_accuracy=result.robust_accuracy,
            seconds=result.seconds,
        )
        session.add(row)
        session.flush()
        session.execute(insert(schema.SampleOutcome), _outcome_rows(row.id, result))
        session.add_all(_member_rows(row.id, result))
        examples = _example_rows(row.id, result)
        session.add_all(examples)
        return row.id, len(examples)

    # queries ----------------------------------------------------------------------------
    def query(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Read-only SQL (writes, ATTACH and VACUUM INTO are refused)."""
        return query_read_only(self.engine, sql)


# A unit is finished when its row is there and so are all the rows it wrote in its latest
# run: metric values, per-sample outcomes, example images, verification verdicts and
# smoothing certificates (units of databases made before a count existed have it NULL and
# are computed again). A unit counted by other rules than this code's (its run's semantics
# version, NULL before it was kept: store/semantics.py) is computed again too: reused, it
# would carry numbers this code no longer gives, e.g. a clean mistake counted robust.
FINISHED_UNITS_SQL = f"""
SELECT u.key FROM units u
WHERE u.run_id IN (SELECT r.id FROM runs r WHERE r.semantics_version = {semantics.CURRENT:d})
  AND u.n_values = (
    SELECT COUNT(*) FROM metric_values mv WHERE mv.unit_key = u.key AND mv.run_id = u.run_id)
  AND u.n_outcomes = (
    SELECT COUNT(*) FROM sample_outcomes so JOIN attack_runs ar ON ar.id = so.attack_run_id
    WHERE ar.unit_key = u.key AND ar.run_id = u.run_id)
  AND u.n_examples = (
    SELECT COUNT(*) FROM example_images ei JOIN attack_runs ar ON ar.id = ei.attack_run_id
    WHERE ar.unit_key = u.key AND ar.run_id = u.run_id)
  AND u.n_verdicts = (
    SELECT COUNT(*) FROM verification_samples vs JOIN metric_values mv
      ON mv.id = vs.metric_value_id
    WHERE mv.unit_key = u.key AND mv.run_id = u.run_id)
  AND u.n_certificates = (
    SELECT COUNT(*) FROM smoothing_certificates sc
    WHERE sc.unit_key = u.key AND sc.run_id = u.run_id)
"""


def _warning_rows(run_id: int, warnings: Sequence[KeptWarning]) -> list[schema.RunWarning]:
    return [
        schema.RunWarning(
            run_id=run_id, unit_key=w.unit_key, category=w.category.__name__[:200],
            message=w.message,
        )
        for w in warnings
    ]  # fmt: skip


def _add_sample_verdicts(session: Session, rows: list, values: list[MetricValue]) -> int:
    """Each value's per-sample ``verdicts`` (certified metrics) as table rows; returns how
    many it wrote."""
    if not any(v.verdicts for v in values):
        return 0
    session.flush()  # the metric rows' ids
    verdicts = [
        {"metric_value_id": row.id, "sample_index": s.sample_index, "label": s.label,
         "verdict": s.verdict, "margin": s.margin, "seconds": s.seconds, "attack": s.attack}
        for row, v in zip(rows, values, strict=True) for s in v.verdicts
    ]  # fmt: skip
    if verdicts:
        session.execute(insert(schema.VerificationSample), verdicts)
    return len(verdicts)


def _outcome_rows(attack_run_id: int, result: AttackResult) -> list[dict[str, Any]]:
    """Per-sample rows, built from whole tensors (one ``tolist`` per column)."""
    import torch

    norms = result.norms
    clean_true = torch.softmax(result.clean_logits, 1).gather(1, result.y[:, None])[:, 0]
    adv_true = torch.softmax(result.adv_logits, 1).gather(1, result.y[:, None])[:, 0]
    columns = {
        "sample_index": list(range(len(result.y))),
        "label": result.y.tolist(),
        "clean_pred": result.clean_pred.tolist(),
        "adv_pred": result.adv_pred.tolist(),
        "success": result.success.tolist(),
        "steps": result.steps.tolist(),
        "l0": norms["l0"].tolist(),
        "l1": norms["l1"].tolist(),
        "l2": norms["l2"].tolist(),
        "linf": norms["linf"].tolist(),
        "true_conf_clean": clean_true.tolist(),
        "true_conf_adv": adv_true.tolist(),
        "broken_by": result.breakers,
    }
    return [
        {"attack_run_id": attack_run_id, **dict(zip(columns, values, strict=True))}
        for values in zip(*columns.values(), strict=True)
    ]


def _member_rows(attack_run_id: int, result: AttackResult) -> list[schema.EnsembleMember]:
    """One row per member of an ensemble attack (none for a single attack)."""
    if result.members is None or result.member_attacked is None:
        return []
    steps = result.member_steps.sum(0).tolist() if result.member_steps is not None else None
    seconds = result.member_seconds or (0.0,) * len(result.members)
    broken = result.broken_by
    return [
        schema.EnsembleMember(
            attack_run_id=attack_run_id,
            position=j + 1,
            member=name,
            n_attacked=int(result.member_attacked[:, j].sum()),
            n_broken=int((broken == j).sum()) if broken is not None else 0,
            steps=int(steps[j]) if steps is not None else 0,
            seconds=float(seconds[j]),
        )
        for j, name in enumerate(result.members)
    ]


def _example_rows(attack_run_id: int, result: AttackResult) -> list[schema.ExampleImage]:
    """The first ``EXAMPLES_PER_RUN`` samples the attack broke, then unbroken ones."""
    import torch

    order = torch.argsort((~result.success.bool()).to(torch.int8), stable=True)
    rows = []
    for i in order[:EXAMPLES_PER_RUN].tolist():
        clean = result.x[i].detach().cpu().to(torch.float16).numpy()
        adversarial = result.x_adv[i].detach().cpu().to(torch.float16).numpy()
        rows.append(
            schema.ExampleImage(
                attack_run_id=attack_run_id,
                sample_index=i,
                shape=list(clean.shape),
                clean=clean.tobytes(),
                adversarial=adversarial.tobytes(),
            )
        )
    return rows


def _environment(run_id: int) -> schema.RunEnvironment:
    import os
    import platform
    import socket

    import torch

    return schema.RunEnvironment(
        run_id=run_id,
        hostname=socket.gethostname()[:200],
        platform=platform.platform()[:200],
        python=platform.python_version(),
        torch=torch.__version__[:32],
        cpu_count=os.cpu_count() or 0,
    )


def _interval(v: MetricValue) -> dict[str, float | None]:
    """The stored 95% Clopper-Pearson interval of a rate; None for other metrics."""
    from aisafety.report.intervals import is_rate, rate_interval

    if not is_rate(v.unit, v.value, v.n_samples):
        return {"ci_low": None, "ci_high": None}
    low, high = rate_interval(v.value, v.n_samples)
    return {"ci_low": low, "ci_high": high}


def cost_columns(cost: UnitCost | None) -> dict[str, float | None]:
    """The ``units`` columns of a unit's cost; all NULL when it was not measured."""
    if cost is None:
        return {f.name: None for f in dataclasses.fields(UnitCost)}
    return dataclasses.asdict(cost)
