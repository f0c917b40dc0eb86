"""device drift history: every drift record agents report, kept per device

One row per drift record (device, subsystem, since), whatever number of
reports repeat it; `healed_at` and `healed_by` are filled in when a report
says it ended. Existing reports are left as they are (their history starts
with the next report).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_drift",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("subsystem", sa.String(length=100), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("healed_at", sa.Float(), nullable=True),
        sa.Column("detected_by", sa.String(length=20), nullable=True),
        sa.Column("paths", sa.Text(), nullable=False),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("healed_by", sa.Text(), nullable=True),
        sa.Column("attribution", sa.Text(), nullable=False),
        sa.Column("first_reported_at", sa.Float(), nullable=False),
        sa.Column("last_reported_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("device_id", "subsystem", "since", name="uq_device_drift_record"),
    )
    op.create_index("ix_device_drift_device_since", "device_drift", ["device_id", "since"])


def downgrade() -> None:
    op.drop_index("ix_device_drift_device_since", table_name="device_drift")
    op.drop_table("device_drift")
