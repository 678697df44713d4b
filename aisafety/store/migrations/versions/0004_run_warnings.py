"""The warnings a run raised: the table ``run_warnings``.

A run's ``AISafetyWarning``\\ s (the model at chance, outputs that are not repeatable, ...)
only reached the terminal; a user reading the results later never saw them. Runs made
before this revision have no rows there (their warnings were not kept). Nothing is
rewritten.

Revision ID: 0004_run_warnings
Revises: 0003_unit_cost
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_run_warnings"
down_revision = "0003_unit_cost"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("run_warnings"):
        return
    op.create_table(
        "run_warnings",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("unit_key", sa.String(64), nullable=True),
        sa.Column("category", sa.String(200), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("raised_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_run_warnings_run_id", "run_warnings", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_warnings_run_id", "run_warnings")
    op.drop_table("run_warnings")
