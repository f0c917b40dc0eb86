"""rollouts: staged waves over devices, their members, the controller's lease

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("current_wave", sa.Integer(), nullable=False),
        sa.Column("wave_started_at", sa.Float(), nullable=True),
        sa.Column("wave_done_at", sa.Float(), nullable=True),
        sa.Column("accepted_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_by", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("comment", sa.Text(), nullable=False, server_default=""),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_rollouts_tenant_state", "rollouts", ["tenant_id", "state"])
    op.create_table(
        "rollout_members",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("rollout_id", sa.Integer(), sa.ForeignKey("rollouts.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("provenance", sa.Text(), nullable=True),
        sa.Column("from_version", sa.Integer(), nullable=False),
        sa.Column("sent_version", sa.Integer(), nullable=True),
        sa.Column("reverted_version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("baseline_codes", sa.Text(), nullable=True),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.UniqueConstraint("rollout_id", "device_id", name="uq_rollout_members_device"),
    )
    op.create_index("ix_rollout_members_wave", "rollout_members", ["rollout_id", "wave", "state"])
    op.create_index("ix_rollout_members_device", "rollout_members", ["device_id"])
    op.create_table(
        "rollout_leases",
        sa.Column("rollout_id", sa.Integer(), sa.ForeignKey("rollouts.id"), primary_key=True),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rollout_leases")
    op.drop_index("ix_rollout_members_device", table_name="rollout_members")
    op.drop_index("ix_rollout_members_wave", table_name="rollout_members")
    op.drop_table("rollout_members")
    op.drop_index("ix_rollouts_tenant_state", table_name="rollouts")
    op.drop_table("rollouts")
