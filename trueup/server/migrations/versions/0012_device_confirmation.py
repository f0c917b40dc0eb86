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


def downgrade() -> None:
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("confirm_within")
