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


def downgrade() -> None:
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("provenance")
