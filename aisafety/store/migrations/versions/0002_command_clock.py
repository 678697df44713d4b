"""The command's start on each run: ``runs.command_started_at`` (nullable).

A report gives the wall time a user waited for the command (Python's start, imports,
loading, evaluation) beside the evaluation's own (issue #36). Runs made before this revision,
and runs made from Python rather than the command line, keep NULL: the report then shows
the evaluation's time only. Nothing is rewritten.

Revision ID: 0002_command_clock
Revises: 0001_baseline
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_command_clock"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("runs")}
    if "command_started_at" not in columns:
        op.add_column("runs", sa.Column("command_started_at", sa.DateTime, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "command_started_at")
