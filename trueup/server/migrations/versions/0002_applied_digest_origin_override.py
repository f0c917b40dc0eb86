"""applied digest, origin and local override in reports and device state

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TABLES = ("device_state", "device_reports")


def upgrade() -> None:
    # Nullable columns only: existing rows (reports from older agents) read as "unknown".
    # On SQLite batch mode adds them with ALTER TABLE ADD COLUMN (no table copy).
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("applied_digest", sa.String(length=80), nullable=True))
            batch_op.add_column(sa.Column("applied_origin", sa.String(length=32), nullable=True))
            batch_op.add_column(sa.Column("override", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("override")
            batch_op.drop_column("applied_origin")
            batch_op.drop_column("applied_digest")
