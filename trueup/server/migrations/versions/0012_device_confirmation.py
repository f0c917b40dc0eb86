"""device confirmation: a revision's confirm-within window, each device's confirm-or-rollback

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("revisions", sa.Column("confirm_within", sa.Integer(), nullable=True))
    op.create_table(
        "device_confirmation",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("rollback_to", sa.Integer(), nullable=True),
        sa.Column("rolled_back_to_version", sa.Integer(), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("reported_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("device_confirmation")
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("confirm_within")
