"""seals on tokens and users (the audit chain's anchor)

Revision ID: 0003
Revises: 0002

A nullable `seal` column on `tokens` and `users`: an HMAC under the server key
over the row's security-relevant fields. The migration cannot compute it (the
key is not in the database); a server process seals the existing rows that the
audit log vouches for when it starts (trueup.server.audit.seal_unsealed).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TABLES = ("tokens", "users")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("seal", sa.String(length=64), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("seal")
