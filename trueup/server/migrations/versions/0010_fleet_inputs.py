"""fleet inputs: device labels, versioned profiles, device variables and own layer, revision provenance

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("revisions", sa.Column("provenance", sa.Text(), nullable=True))
    op.create_table(
        "device_labels",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("key", sa.String(317), nullable=False),
        sa.Column("value", sa.String(63), nullable=False),
        sa.UniqueConstraint("device_id", "key", name="uq_device_labels_device_key"),
    )
    op.create_index("ix_device_labels_tenant_key", "device_labels", ["tenant_id", "key"])
    _upgrade_profiles_and_inputs()


def downgrade() -> None:
    op.drop_index("ix_device_labels_tenant_key", table_name="device_labels")
    op.drop_table("device_labels")
    _downgrade_profiles_and_inputs()
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("provenance")


# --- profiles and device inputs ---


def _upgrade_profiles_and_inputs() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("created_by", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False, server_default=""),
        sa.Column("deleted", sa.Integer(), nullable=False, server_default="0"),
        sa.UniqueConstraint("tenant_id", "name", "version", name="uq_profiles_tenant_name_version"),
    )
    op.create_table(
        "device_inputs",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("variables", sa.Text(), nullable=False),
        sa.Column("own", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.String(length=512), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_device_inputs_tenant", "device_inputs", ["tenant_id"])


def _downgrade_profiles_and_inputs() -> None:
    op.drop_index("ix_device_inputs_tenant", table_name="device_inputs")
    op.drop_table("device_inputs")
    op.drop_table("profiles")


# --- end of profiles and device inputs ---
