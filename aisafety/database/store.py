"""The results store: every run, metric value and per-sample outcome as SQL rows.

SQLite (``./aisafety.db``) by default; any SQLAlchemy URL works (PostgreSQL when one machine
is not enough). Each unit of work is written in one transaction, so an interrupted run keeps
everything it finished, and ``--resume`` recognises finished units by their key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import create_engine, event, insert, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from aisafety.attack.result import AttackResult
from aisafety.database import schema
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackSpec, Direction, EvaluationPlan, MetricValue

DEFAULT_URL = "sqlite:///aisafety.db"
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


def _make_sqlite_folder(url: str) -> None:
    """``--db sqlite:///results/run.db`` should work without creating ``results/`` first."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _sqlite_foreign_keys(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class ResultStore:
    def __init__(self, url: str = DEFAULT_URL):
        if "://" not in url:
            raise ConfigError(
                f"database URL {url!r} is not a SQLAlchemy URL; use e.g. 'sqlite:///results.db' "
                "or 'postgresql://user@host/db'"
            )
        try:
            _make_sqlite_folder(url)
            self.engine: Engine = create_engine(url)
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", _sqlite_foreign_keys)
            schema.Base.metadata.create_all(self.engine)
            with self.engine.begin() as connection:
                for view in schema.VIEWS:
                    connection.execute(text(view))
        except (SQLAlchemyError, ImportError) as exc:
            raise ConfigError(f"cannot open the results database {url!r}: {exc}") from exc
        self.url = url

    # runs -------------------------------------------------------------------------------
    def start_run(self, plan: EvaluationPlan, version: str, device: str) -> int:
        with Session(self.engine) as session, session.begin():
            run = schema.Run(
                platform_version=version,
                seed=plan.seed,
                device=device,
                plan=plan.model_dump(mode="json"),
            )
            session.add(run)
            session.flush()
            session.add(_environment(run.id))
            return run.id

    def finish_run(self, run_id: int, status: str = "finished") -> None:
        with Session(self.engine) as session, session.begin():
            run = session.get(schema.Run, run_id)
            run.status = status
            run.finished_at = schema.utcnow()

    # units ------------------------------------------------------------------------------
    def finished_units(self) -> set[str]:
        with Session(self.engine) as session:
            return set(session.scalars(select(schema.Unit.key)))

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
    ) -> None:
        """Write a unit, its attack run, outcomes and values in one transaction."""
        with Session(self.engine) as session, session.begin():
            model_id, dataset_id = self._subject_ids(session, subject)
            # A unit run again without --resume (same key) now points at its latest run; the
            # earlier run's rows stay, so history is kept and --resume shows the latest values.
            session.merge(
                schema.Unit(
                    key=key, run_id=run_id, description=description, finished_at=schema.utcnow()
                )
            )
            session.flush()
            attack_run_id = None
            if attack is not None:
                attack_run_id = self._add_attack_run(
                    session, run_id, key, model_id, dataset_id, *attack
                )
            session.add_all(
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
                )
                for v in values
            )

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
    ) -> int:
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
        session.add_all(_example_rows(row.id, result))
        return row.id

    # queries ----------------------------------------------------------------------------
    def query(self, sql: str) -> tuple[list[str], list[tuple]]:
        try:
            with self.engine.connect() as connection:
                result = connection.execute(text(sql))
                if not result.returns_rows:
                    return [], []
                return list(result.keys()), [tuple(r) for r in result]
        except SQLAlchemyError as exc:
            raise ConfigError(
                f"query failed: {exc.orig if hasattr(exc, 'orig') else exc}"
            ) from None


def _outcome_rows(attack_run_id: int, result: AttackResult) -> list[dict[str, Any]]:
    """Per-sample rows, built from whole tensors (one ``tolist`` per column)."""
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
    }
    return [
        {"attack_run_id": attack_run_id, **dict(zip(columns, values, strict=True))}
        for values in zip(*columns.values(), strict=True)
    ]


def _example_rows(attack_run_id: int, result: AttackResult) -> list[schema.ExampleImage]:
    """The first ``EXAMPLES_PER_RUN`` samples the attack broke, then unbroken ones."""
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

    return schema.RunEnvironment(
        run_id=run_id,
        hostname=socket.gethostname()[:200],
        platform=platform.platform()[:200],
        python=platform.python_version(),
        torch=torch.__version__[:32],
        cpu_count=os.cpu_count() or 0,
    )
