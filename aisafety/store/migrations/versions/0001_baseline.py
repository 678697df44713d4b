"""Baseline: the layout of aisafety 0.1.0, and every layout before Alembic brought to it.

Databases made before this revision have no ``alembic_version`` table and one of the
layouts the store grew through (2026-11-23/24: tables and nullable columns added one
release at a time, ``runs.seed`` widened to 64 bits). This revision is the only one that
runs on them, so it accepts any of them: it creates the tables and indexes a database
lacks, adds the columns its tables lack (all of them nullable: rows written before they
existed keep NULL there, as they would have), widens ``runs.seed`` on PostgreSQL (a 32-bit
``INTEGER`` there before 2026-11-23 22:57; SQLite's integers have 64 bits whatever the
declared type) and (re)creates the views. Nothing is dropped or rewritten, so no row is
lost. On an empty database it builds the whole layout.

The layout is written out here, not read from ``schema.py``: a revision must keep meaning
what it meant when ``schema.py`` changes again.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aisafety.errors import StoreError

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None

LAYOUT = sa.MetaData()


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer, primary_key=True)


def _fk(name: str, target: str, nullable: bool = False, index: bool = False) -> sa.Column:
    kind = sa.String(64) if target == "units.key" else sa.Integer
    return sa.Column(name, kind, sa.ForeignKey(target), nullable=nullable, index=index)


def _col(name: str, kind, nullable: bool = False) -> sa.Column:
    return sa.Column(name, kind, nullable=nullable)


sa.Table(
    "runs", LAYOUT, _id(),
    _col("started_at", sa.DateTime), _col("finished_at", sa.DateTime, True),
    _col("status", sa.String(16)), _col("platform_version", sa.String(32)),
    _col("seed", sa.BigInteger), _col("device", sa.String(16)), _col("plan", sa.JSON),
    _col("host", sa.String(255), True), _col("pid", sa.Integer, True),
    _col("heartbeat_at", sa.DateTime, True),
)  # fmt: skip
sa.Table(
    "models", LAYOUT, _id(),
    _col("name", sa.String(200)), _col("fingerprint", sa.String(64)), _col("spec", sa.JSON),
    _col("capabilities", sa.String(200)),
    sa.UniqueConstraint("name", "fingerprint"),
)  # fmt: skip
sa.Table(
    "datasets", LAYOUT, _id(),
    _col("name", sa.String(200)), _col("split", sa.String(16)), _col("n_samples", sa.Integer),
    _col("fingerprint", sa.String(64)), _col("spec", sa.JSON),
    sa.UniqueConstraint("name", "split", "fingerprint"),
)  # fmt: skip
sa.Table(
    "units", LAYOUT,
    sa.Column("key", sa.String(64), primary_key=True), _fk("run_id", "runs.id"),
    _col("description", sa.String(400)), _col("finished_at", sa.DateTime),
    *(_col(f"n_{rows}", sa.Integer, True)
      for rows in ("values", "outcomes", "examples", "verdicts", "certificates")),
)  # fmt: skip
sa.Table(
    "unit_failures", LAYOUT, _id(), _fk("run_id", "runs.id", index=True),
    _col("key", sa.String(64)), _col("description", sa.String(400)), _col("error", sa.Text),
    _col("failed_at", sa.DateTime),
)  # fmt: skip
sa.Table(
    "attack_runs", LAYOUT, _id(),
    _fk("run_id", "runs.id"), _fk("unit_key", "units.key"), _fk("model_id", "models.id"),
    _fk("dataset_id", "datasets.id"),
    _col("attack", sa.String(200)), _col("family", sa.String(16)),
    _col("norm", sa.String(8), True), _col("eps", sa.Float), _col("config", sa.JSON),
    _col("n_samples", sa.Integer), _col("success_rate", sa.Float),
    _col("robust_accuracy", sa.Float), _col("seconds", sa.Float),
)  # fmt: skip
sa.Table(
    "metric_values", LAYOUT, _id(),
    _fk("run_id", "runs.id"), _fk("unit_key", "units.key"), _fk("model_id", "models.id"),
    _fk("dataset_id", "datasets.id"), _fk("attack_run_id", "attack_runs.id", nullable=True),
    _col("metric", sa.String(200)), _col("value", sa.Float, True),
    _col("direction", sa.String(8)), _col("unit", sa.String(32)),
    _col("attack", sa.String(200), True), _col("eps", sa.Float, True),
    _col("n_samples", sa.Integer), _col("details", sa.JSON),
    _col("platform_version", sa.String(32)), _col("created_at", sa.DateTime),
    _col("ci_low", sa.Float, True), _col("ci_high", sa.Float, True),
)  # fmt: skip
sa.Table(
    "sample_outcomes", LAYOUT, _id(), _fk("attack_run_id", "attack_runs.id", index=True),
    *(_col(name, sa.Integer)
      for name in ("sample_index", "label", "clean_pred", "adv_pred")),
    _col("success", sa.Boolean), _col("steps", sa.Integer),
    *(_col(name, sa.Float)
      for name in ("l0", "l1", "l2", "linf", "true_conf_clean", "true_conf_adv")),
    _col("broken_by", sa.String(200), True),
)  # fmt: skip
sa.Table(
    "ensemble_members", LAYOUT, _id(), _fk("attack_run_id", "attack_runs.id", index=True),
    _col("position", sa.Integer), _col("member", sa.String(200)),
    _col("n_attacked", sa.Integer), _col("n_broken", sa.Integer), _col("steps", sa.Integer),
    _col("seconds", sa.Float),
)  # fmt: skip
sa.Table(
    "smoothing_certificates", LAYOUT, _id(),
    _fk("run_id", "runs.id"), _fk("unit_key", "units.key", index=True),
    _col("certificates", sa.String(64)), _col("norm", sa.String(8)),
    *(_col(name, sa.Integer) for name in ("sample_index", "label", "prediction")),
    _col("abstained", sa.Boolean),
    *(_col(name, sa.Float) for name in ("p_a_lower", "radius", "seconds")),
)  # fmt: skip
sa.Table(
    "verification_samples", LAYOUT, _id(),
    _fk("metric_value_id", "metric_values.id", index=True),
    _col("sample_index", sa.Integer), _col("label", sa.Integer),
    _col("verdict", sa.String(16)), _col("margin", sa.Float, True),
    _col("seconds", sa.Float, True), _col("attack", sa.JSON),
)  # fmt: skip
sa.Table(
    "run_environments", LAYOUT,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
    _col("hostname", sa.String(200)), _col("platform", sa.String(200)),
    _col("python", sa.String(32)), _col("torch", sa.String(32)), _col("cpu_count", sa.Integer),
)  # fmt: skip
sa.Table(
    "example_images", LAYOUT, _id(), _fk("attack_run_id", "attack_runs.id", index=True),
    _col("sample_index", sa.Integer), _col("shape", sa.JSON),
    _col("clean", sa.LargeBinary), _col("adversarial", sa.LargeBinary),
)  # fmt: skip

VIEWS = {
    "results": """
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
""",
    "accuracy_curves": """
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
""",
}


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table in LAYOUT.sorted_tables:  # parents before children (foreign keys)
        if not inspector.has_table(table.name):
            table.create(bind)  # with its indexes
            continue
        present = {c["name"]: c for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                op.add_column(table.name, _added(table.name, column))
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)
    seed = {c["name"]: c for c in inspector.get_columns("runs")}["seed"]
    if bind.dialect.name == "postgresql" and not isinstance(seed["type"], sa.BigInteger):
        op.alter_column("runs", "seed", type_=sa.BigInteger(), existing_type=sa.Integer())
    for name, select in VIEWS.items():  # a view made by an older release is made again
        op.execute(f"DROP VIEW IF EXISTS {name}")
        op.execute(f"CREATE VIEW {name} AS {select}")


def _added(table: str, column: sa.Column) -> sa.Column:
    """A copy of ``column`` to add to existing rows: only nullable columns can be."""
    if not column.nullable:
        raise StoreError(
            f"{table}.{column.name} is missing from this database but cannot be added to it "
            "(NOT NULL, no default): the database was not made by aisafety"
        )
    return sa.Column(column.name, column.type, nullable=True)


def downgrade() -> None:
    raise NotImplementedError(
        "the baseline has no earlier revision; to go back, restore a copy of the database"
    )
