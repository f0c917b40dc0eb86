"""device backups: the archives agents upload, in chunks

`backups` holds one row per archive (tenant, device, sizes, sha256, the
uploader's metadata); `backup_chunks` its content, one row per chunk of at
most 1 MiB, so that no value nears PostgreSQL's limits and neither upload
nor download needs a whole archive in memory.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "backups",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
        sa.Column("uploaded_at", sa.Float(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
    )
    op.create_index("ix_backups_device", "backups", ["device_id", "id"])
    op.create_table(
        "backup_chunks",
        sa.Column("backup_id", sa.Integer(), sa.ForeignKey("backups.id"), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("backup_chunks")
    op.drop_index("ix_backups_device", table_name="backups")
    op.drop_table("backups")
