"""actor, author and audit target columns hold what the API accepts

An actor is `device:TENANT/DEVICE` (up to 461 characters) and an audit target
up to `device:DEVICE/secret:NAME` (468): the old 200 and 400 were too short for
the longest names the API accepts, and PostgreSQL refused those rows.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# (table, column, old length, new length)
_WIDENED = (
    ("audit_log", "actor", 200, 512),
    ("audit_log", "target", 400, 512),
    ("revisions", "author", 200, 512),
    ("acks", "author", 200, 512),
)


def upgrade() -> None:
    for table, column, old, new in _WIDENED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(
                column,
                existing_type=sa.String(length=old),
                type_=sa.String(length=new),
                existing_nullable=False,
            )


def downgrade() -> None:
    for table, column, old, new in _WIDENED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(
                column,
                existing_type=sa.String(length=new),
                type_=sa.String(length=old),
                existing_nullable=False,
            )
