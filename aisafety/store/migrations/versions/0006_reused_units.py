"""The units a resumed run reused: the table ``reused_units``.

A ``--resume`` run stored only the units it computed; those it took from an interrupted run
kept that run's id, so the resumed run's report, worst case and sanity checks missed them
(a robust accuracy too high when the attacks were split between the two runs). What a run
reused cannot be derived from what was stored: the unit keys hash the model's weights, the
data and settings only a loaded plugin knows, and ``units.run_id`` moves to the latest run
that computed a key. Runs made before this revision have no rows there. Nothing is rewritten.

Revision ID: 0006_reused_units
Revises: 0005_semantics_version
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_reused_units"
down_revision = "0005_semantics_version"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("reused_units"):
        return
    op.create_table(
        "reused_units",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("unit_key", sa.String(64), primary_key=True),
        sa.Column("source_run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reused_units")
