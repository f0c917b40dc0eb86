"""notifications: webhook targets, routing rules, events, deliveries and their attempts

`notify_targets` holds webhooks (the signing secret sealed with the tenant's
data key); `notify_rules` routes a tenant's events to a target and may
escalate; `notify_devices` is what the notifier last concluded about each
device; `notify_escalations` the escalations that fired and have not resolved;
`notify_events`, `notify_deliveries` (one per event and target) and
`notify_attempts` (one per HTTP request) are the delivery log.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_targets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret_id", sa.String(length=32), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("tenant_id", "name", name="uq_notify_targets_tenant_name"),
    )
    op.create_table(
        "notify_rules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("target_id", sa.Integer(), sa.ForeignKey("notify_targets.id"), nullable=False),
        sa.Column("match", sa.Text(), nullable=False),
        sa.Column("escalate_after", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_notify_rules_tenant_name"),
    )
    op.create_table(
        "notify_devices",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("conditions", sa.Text(), nullable=False),
        sa.Column("failed_since", sa.Float(), nullable=True),
        sa.Column("report_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "notify_escalations",
        sa.Column("rule_id", sa.Integer(), sa.ForeignKey("notify_rules.id"), primary_key=True),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("failed_since", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "notify_events",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("severity", sa.String(length=20), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
    )
    op.create_table(
        "notify_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column(
            "event_id", sa.String(length=36), sa.ForeignKey("notify_events.id"), nullable=False
        ),
        sa.Column("target_id", sa.Integer(), sa.ForeignKey("notify_targets.id"), nullable=False),
        sa.Column("rule_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("event_id", "target_id", name="uq_notify_deliveries_event_target"),
    )
    op.create_index("ix_notify_deliveries_due", "notify_deliveries", ["state", "next_attempt_at"])
    op.create_table(
        "notify_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id", sa.Integer(), sa.ForeignKey("notify_deliveries.id"), nullable=False
        ),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_notify_attempts_delivery", "notify_attempts", ["delivery_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_notify_attempts_delivery", table_name="notify_attempts")
    op.drop_table("notify_attempts")
    op.drop_index("ix_notify_deliveries_due", table_name="notify_deliveries")
    op.drop_table("notify_deliveries")
    op.drop_table("notify_events")
    op.drop_table("notify_escalations")
    op.drop_table("notify_devices")
    op.drop_table("notify_rules")
    op.drop_table("notify_targets")
