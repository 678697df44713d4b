"""Results-database layouts of releases made before Alembic, frozen from git history, and
rows as those releases wrote them: tests/test_migrations.py opens them with today's store.

* ``2a40541`` (2026-11-23 08:16, the first release): runs, models, datasets, units,
  attack_runs, metric_values, sample_outcomes and the ``results`` view; ``runs.seed`` a
  32-bit INTEGER (on PostgreSQL).
* ``7896022`` (2026-11-23 23:12, just before the ensembles): ``runs.seed`` BIGINT, run
  host/pid, unit row counts, metric intervals, failures, certificates, verdicts,
  environments and example images, the ``accuracy_curves`` view; no ``broken_by``,
  ``ensemble_members``, ``heartbeat_at`` or ``units.n_examples``/``n_verdicts``/
  ``n_certificates``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

LAYOUTS = ("2a40541", "7896022")

RESULTS_VIEW = """CREATE VIEW results AS
SELECT mv.run_id AS run_id, m.name AS model, d.name AS dataset, d.split AS split,
       mv.metric AS metric, mv.attack AS attack, ar.norm AS norm, mv.eps AS eps,
       mv.value AS value, mv.direction AS direction, mv.unit AS unit,
       mv.n_samples AS n_samples, mv.platform_version AS platform_version,
       mv.created_at AS created_at
FROM metric_values mv
JOIN models m ON m.id = mv.model_id
JOIN datasets d ON d.id = mv.dataset_id
LEFT JOIN attack_runs ar ON ar.id = mv.attack_run_id"""
# 7896022's accuracy_curves, without its eps = 0 half (a view the baseline must replace)
CURVES_VIEW = """CREATE VIEW accuracy_curves AS
SELECT ar.run_id AS run_id, ar.attack AS attack, ar.eps AS eps,
       ar.robust_accuracy AS robust_accuracy
FROM attack_runs ar WHERE ar.family <> 'corruption'"""


def _c(name: str, kind, nullable: bool = False, *args) -> sa.Column:
    return sa.Column(name, kind, *args, nullable=nullable)


def layout(release: str) -> sa.MetaData:
    """The tables of ``release`` (one of LAYOUTS)."""
    later = release != "2a40541"
    meta = sa.MetaData()
    sa.Table(
        "runs", meta, sa.Column("id", sa.Integer, primary_key=True),
        _c("started_at", sa.DateTime), _c("finished_at", sa.DateTime, True),
        _c("status", sa.String(16)), _c("platform_version", sa.String(32)),
        _c("seed", sa.BigInteger if later else sa.Integer), _c("device", sa.String(16)),
        _c("plan", sa.JSON),
        *((_c("host", sa.String(255), True), _c("pid", sa.Integer, True)) if later else ()),
    )  # fmt: skip
    sa.Table(
        "models", meta, sa.Column("id", sa.Integer, primary_key=True),
        _c("name", sa.String(200)), _c("fingerprint", sa.String(64)), _c("spec", sa.JSON),
        _c("capabilities", sa.String(200)), sa.UniqueConstraint("name", "fingerprint"),
    )  # fmt: skip
    sa.Table(
        "datasets", meta, sa.Column("id", sa.Integer, primary_key=True),
        _c("name", sa.String(200)), _c("split", sa.String(16)), _c("n_samples", sa.Integer),
        _c("fingerprint", sa.String(64)), _c("spec", sa.JSON),
        sa.UniqueConstraint("name", "split", "fingerprint"),
    )  # fmt: skip
    sa.Table(
        "units", meta, sa.Column("key", sa.String(64), primary_key=True),
        _c("run_id", sa.Integer, False, sa.ForeignKey("runs.id")),
        _c("description", sa.String(400)), _c("finished_at", sa.DateTime),
        *((_c("n_values", sa.Integer, True), _c("n_outcomes", sa.Integer, True))
          if later else ()),
    )  # fmt: skip

    def refs() -> tuple[sa.Column, ...]:
        return (
            _c("run_id", sa.Integer, False, sa.ForeignKey("runs.id")),
            _c("unit_key", sa.String(64), False, sa.ForeignKey("units.key")),
            _c("model_id", sa.Integer, False, sa.ForeignKey("models.id")),
            _c("dataset_id", sa.Integer, False, sa.ForeignKey("datasets.id")),
        )

    sa.Table(
        "attack_runs", meta, sa.Column("id", sa.Integer, primary_key=True),
        *refs(),
        _c("attack", sa.String(200)), _c("family", sa.String(16)),
        _c("norm", sa.String(8), True), _c("eps", sa.Float), _c("config", sa.JSON),
        _c("n_samples", sa.Integer), _c("success_rate", sa.Float),
        _c("robust_accuracy", sa.Float), _c("seconds", sa.Float),
    )  # fmt: skip
    sa.Table(
        "metric_values", meta, sa.Column("id", sa.Integer, primary_key=True),
        *refs(),
        _c("attack_run_id", sa.Integer, True, sa.ForeignKey("attack_runs.id")),
        _c("metric", sa.String(200)), _c("value", sa.Float, True),
        _c("direction", sa.String(8)), _c("unit", sa.String(32)),
        _c("attack", sa.String(200), True), _c("eps", sa.Float, True),
        _c("n_samples", sa.Integer), _c("details", sa.JSON),
        _c("platform_version", sa.String(32)), _c("created_at", sa.DateTime),
        *((_c("ci_low", sa.Float, True), _c("ci_high", sa.Float, True)) if later else ()),
    )  # fmt: skip
    sa.Table(
        "sample_outcomes", meta, sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("attack_run_id", sa.Integer, sa.ForeignKey("attack_runs.id"),
                  nullable=False, index=True),
        *(_c(n, sa.Integer) for n in ("sample_index", "label", "clean_pred", "adv_pred")),
        _c("success", sa.Boolean), _c("steps", sa.Integer),
        *(_c(n, sa.Float) for n in ("l0", "l1", "l2", "linf", "true_conf_clean",
                                    "true_conf_adv")),
    )  # fmt: skip
    if later:
        sa.Table(
            "unit_failures", meta, sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False,
                      index=True),
            _c("key", sa.String(64)), _c("description", sa.String(400)),
            _c("error", sa.Text), _c("failed_at", sa.DateTime),
        )  # fmt: skip
        sa.Table(
            "run_environments", meta,
            sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
            _c("hostname", sa.String(200)), _c("platform", sa.String(200)),
            _c("python", sa.String(32)), _c("torch", sa.String(32)),
            _c("cpu_count", sa.Integer),
        )  # fmt: skip
        sa.Table(
            "example_images", meta, sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("attack_run_id", sa.Integer, sa.ForeignKey("attack_runs.id"),
                      nullable=False, index=True),
            _c("sample_index", sa.Integer), _c("shape", sa.JSON),
            _c("clean", sa.LargeBinary), _c("adversarial", sa.LargeBinary),
        )  # fmt: skip
    return meta


def build(url: str, release: str) -> None:
    """A database in the layout of ``release`` holding one run of two units (ids assigned
    by the database, as the release's store had them: run, model, dataset, attack run 1)."""
    engine = sa.create_engine(url)
    meta = layout(release)
    later = release != "2a40541"
    with engine.begin() as connection:
        meta.create_all(connection)
        connection.exec_driver_sql(RESULTS_VIEW)
        if later:
            connection.exec_driver_sql(CURVES_VIEW)
        t = meta.tables
        when = datetime(2026, 11, 23, 12, 0, 0)
        run = {"started_at": when, "finished_at": when, "status": "finished",
               "platform_version": "0.1.0", "seed": 2**31 - 1, "device": "cpu",
               "plan": {"seed": 2**31 - 1, "attacks": [{"name": "fgsm"}]}}  # fmt: skip
        connection.execute(t["runs"].insert(), [run | ({"host": "h", "pid": 7} if later else {})])
        connection.execute(t["models"].insert(), [{"name": "mnist-cnn",
            "fingerprint": "a" * 16, "spec": {"name": "mnist-cnn"},
            "capabilities": "labels"}])  # fmt: skip
        connection.execute(t["datasets"].insert(), [{"name": "mnist-embedded",
            "split": "test", "n_samples": 5, "fingerprint": "b" * 16, "spec": {}}])  # fmt: skip
        counts = {"n_values": 2, "n_outcomes": 5} if later else {}
        connection.execute(t["units"].insert(), [
            {"key": "k-clean", "run_id": 1, "description": "clean", "finished_at": when}
            | ({"n_values": 1, "n_outcomes": 0} if later else {}),
            {"key": "k-fgsm", "run_id": 1, "description": "fgsm eps=0.1", "finished_at": when}
            | counts,
        ])  # fmt: skip
        refs = {"run_id": 1, "model_id": 1, "dataset_id": 1}
        connection.execute(t["attack_runs"].insert(), [{**refs, "unit_key": "k-fgsm",
            "attack": "fgsm", "family": "gradient", "norm": "linf", "eps": 0.1,
            "config": {}, "n_samples": 5, "success_rate": 0.4, "robust_accuracy": 0.6,
            "seconds": 0.25}])  # fmt: skip
        value = {**refs, "direction": "higher", "unit": "fraction", "n_samples": 5,
                 "platform_version": "0.1.0", "created_at": when,
                 "details": {"k": [1, 2]}}  # fmt: skip
        connection.execute(t["metric_values"].insert(), [
            {**value, "unit_key": "k-clean", "metric": "ca", "value": 0.8},
            {**value, "unit_key": "k-fgsm", "attack_run_id": 1, "metric": "aaw",
             "attack": "fgsm", "eps": 0.1, "value": None},
            {**value, "unit_key": "k-fgsm", "attack_run_id": 1, "metric": "ra",
             "attack": "fgsm", "eps": 0.1, "value": 0.6},
        ])  # fmt: skip
        connection.execute(t["sample_outcomes"].insert(), [
            {"attack_run_id": 1, "sample_index": i, "label": i, "clean_pred": i,
             "adv_pred": (i + i % 2) % 10, "success": bool(i % 2), "steps": 1, "l0": 784.0,
             "l1": 78.4 + i, "l2": 2.8, "linf": 0.1, "true_conf_clean": 0.99,
             "true_conf_adv": 0.5 - i / 100}
            for i in range(5)
        ])  # fmt: skip
    engine.dispose()


def dump(url: str, release: str) -> dict[str, list[tuple]]:
    """Every row of the release's tables, its own columns only, ordered by primary key."""
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        rows = {
            name: [tuple(r) for r in connection.execute(
                sa.select(*table.columns).order_by(*table.primary_key.columns))]
            for name, table in layout(release).tables.items()
        }  # fmt: skip
    engine.dispose()
    return rows
