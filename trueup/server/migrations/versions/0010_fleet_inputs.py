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


def downgrade() -> None:
    op.drop_index("ix_device_labels_tenant_key", table_name="device_labels")
    op.drop_table("device_labels")
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("provenance")
