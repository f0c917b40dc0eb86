"""device evidence: the bundles agents upload, in chunks, and the operators' requests

`evidence` holds one row per bundle (tenant, device, sizes, sha256, the
uploader's metadata); `evidence_chunks` its content, one row per chunk of at
most 1 MiB, like the backups of 0005. `evidence_requests` records each
operator's request for a fresh bundle until the device answers it.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evidence",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("uploaded_at", sa.Float(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
    )
    op.create_index("ix_evidence_device", "evidence", ["device_id", "id"])
    op.create_table(
        "evidence_chunks",
        sa.Column("evidence_id", sa.Integer(), sa.ForeignKey("evidence.id"), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "evidence_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("requested_by", sa.String(length=512), nullable=False),
        sa.Column("answered_at", sa.Float(), nullable=True),
        sa.Column("evidence_id", sa.Integer(), nullable=True),
    )
    op.create_index("ix_evidence_requests_device", "evidence_requests", ["device_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_evidence_requests_device", table_name="evidence_requests")
    op.drop_table("evidence_requests")
    op.drop_table("evidence_chunks")
    op.drop_index("ix_evidence_device", table_name="evidence")
    op.drop_table("evidence")
