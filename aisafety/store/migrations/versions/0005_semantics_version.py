"""The rules that counted a run: ``runs.semantics_version`` (nullable).

A change that moves stored numbers for a reason that is not the model (session 19's
``keep_clean_mistakes``: a clean mistake an attack made right is no longer robust) made runs
on either side of it compare as if the model had changed. Each run now stores the results
semantics version of the code that made it (``aisafety/store/semantics.py``). Runs made
before this revision keep NULL, read as the version before every listed change. Nothing is
rewritten.

Revision ID: 0005_semantics_version
Revises: 0004_run_warnings
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_semantics_version"
down_revision = "0004_run_warnings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("runs")}
    if "semantics_version" not in columns:
        op.add_column("runs", sa.Column("semantics_version", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "semantics_version")
