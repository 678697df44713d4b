"""What each unit cost: ``units.seconds``, ``cpu_seconds``, ``peak_rss_mib``, ``peak_gpu_mib``.

A user sizing a run needs each unit's time and peak memory (issue #32; measured by
``aisafety/unit_cost.py``). All four are nullable: units stored before this revision keep
NULL, as does a peak the platform could not measure. Nothing is rewritten.

Revision ID: 0003_unit_cost
Revises: 0002_command_clock
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_unit_cost"
down_revision = "0002_command_clock"
branch_labels = None
depends_on = None

COLUMNS = ("seconds", "cpu_seconds", "peak_rss_mib", "peak_gpu_mib")


def upgrade() -> None:
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("units")}
    for name in COLUMNS:
        if name not in present:
            op.add_column("units", sa.Column(name, sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("units") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
