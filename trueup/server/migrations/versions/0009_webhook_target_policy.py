"""webhook target policy: a secret header per target, a per-tenant allowlist

`notify_targets` gains a secret header (its name; its value sealed with the
tenant's data key under a secret id of its own). `notify_allowlists` holds each
tenant's internal receivers (networks and host names) that the target policy
lets its webhooks reach. Existing targets keep their URLs; one that carries
credentials (`user:pw@`) is no longer delivered (docs/notifications.md).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("notify_targets", sa.Column("auth_header_name", sa.String(100), nullable=True))
    op.add_column(
        "notify_targets", sa.Column("auth_header_secret_id", sa.String(32), nullable=True)
    )
    op.add_column("notify_targets", sa.Column("auth_header_nonce", sa.LargeBinary(), nullable=True))
    op.add_column(
        "notify_targets", sa.Column("auth_header_ciphertext", sa.LargeBinary(), nullable=True)
    )
    op.create_table(
        "notify_allowlists",
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), primary_key=True),
        sa.Column("entries", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("notify_allowlists")
    with op.batch_alter_table("notify_targets") as batch:
        for column in (
            "auth_header_ciphertext",
            "auth_header_nonce",
            "auth_header_secret_id",
            "auth_header_name",
        ):
            batch.drop_column(column)
