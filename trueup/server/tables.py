"""The control plane's schema, as SQLAlchemy Core tables.

Migrations under `migrations/` create exactly these tables; a test compares them.
Times are stored as UTC seconds since the epoch (floats) so that SQLite and
PostgreSQL compare them alike. Column sizes come from `limits.py`, which the
request models use too: what the API accepts fits these columns.

Why this module is over 400 lines: it is the one declaration of the schema
that the migrations must create exactly (a test compares them); each table
is a plain declaration with its comment, and one file keeps them comparable.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from trueup.server.limits import (
    ACTION_LENGTH,
    ACTOR_LENGTH,
    DEVICE_NAME_LENGTH,
    DIGEST_LENGTH,
    HEADER_NAME_LENGTH,
    KIND_LENGTH,
    LABEL_KEY_LENGTH,
    LABEL_VALUE_LENGTH,
    NAME_LENGTH,
    ORIGIN_LENGTH,
    SUBSYSTEM_LENGTH,
    TARGET_LENGTH,
    TOKEN_HASH_LENGTH,
    TOKEN_LABEL_LENGTH,
    URL_LENGTH,
)

__all__ = [
    "acks",
    "audit_head",
    "audit_log",
    "backup_chunks",
    "backups",
    "device_drift",
    "device_inputs",
    "device_labels",
    "device_reports",
    "device_state",
    "devices",
    "evidence",
    "evidence_chunks",
    "evidence_requests",
    "metadata",
    "notify_allowlists",
    "notify_attempts",
    "notify_deliveries",
    "notify_devices",
    "notify_escalations",
    "notify_events",
    "notify_rules",
    "notify_targets",
    "profiles",
    "revisions",
    "secrets",
    "tenants",
    "tokens",
    "users",
]

metadata = MetaData()

tenants = Table(
    "tenants",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(NAME_LENGTH), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    # The tenant's AEAD data key, wrapped by the server key (tenant id as associated data).
    Column("data_key_wrapped", LargeBinary, nullable=True),
)

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("role", String(KIND_LENGTH), nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("tenant_id", "name", name="uq_users_tenant_name"),
    # HMAC under the server key of (id, tenant, name, role): authentication refuses a
    # user whose row was changed behind the server's back (audit.py, migration 0003).
    Column("seal", String(64), nullable=True),
)

devices = Table(
    "devices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(DEVICE_NAME_LENGTH), nullable=False),
    Column("created_at", Float, nullable=False),
    # The newest revision's version; the compare-and-set target of If-Match.
    Column("desired_version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("tenant_id", "name", name="uq_devices_tenant_name"),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    # user | device | enrollment
    Column("kind", String(KIND_LENGTH), nullable=False),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=True),
    Column("token_hash", String(TOKEN_HASH_LENGTH), nullable=False, unique=True),
    Column("label", String(TOKEN_LABEL_LENGTH), nullable=False, server_default=""),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("used_at", Float, nullable=True),
    Column("revoked_at", Float, nullable=True),
    # HMAC under the server key of (id, tenant, kind, user, device, hash, expiry):
    # authentication refuses a token whose row was changed or inserted directly.
    Column("seal", String(64), nullable=True),
)

revisions = Table(
    "revisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("version", Integer, nullable=False),
    Column("parent_version", Integer, nullable=True),
    Column("author", String(ACTOR_LENGTH), nullable=False),
    Column("comment", Text, nullable=False, server_default=""),
    Column("content_hash", String(DIGEST_LENGTH), nullable=False),
    Column("document", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    # A rendered revision's provenance as JSON (profile versions, variables and own-layer
    # digests; migration 0010) and its confirm-or-rollback window in seconds (0012).
    Column("provenance", Text, nullable=True),
    Column("confirm_within", Integer, nullable=True),
    UniqueConstraint("device_id", "version", name="uq_revisions_device_version"),
)

device_reports = Table(
    "device_reports",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("received_at", Float, nullable=False),
    Column("applied_version", Integer, nullable=True),
    Column("observed_digest", String(DIGEST_LENGTH), nullable=True),
    Column("payload", Text, nullable=False),
    # Which document runs (sha256 of the applied document, without metadata.version),
    # where it came from, and a reported local override (JSON) — see migration 0002.
    Column("applied_digest", String(DIGEST_LENGTH), nullable=True),
    Column("applied_origin", String(ORIGIN_LENGTH), nullable=True),
    Column("override", Text, nullable=True),
    Index("ix_device_reports_device", "device_id", "id"),
)

device_state = Table(
    "device_state",
    metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("last_report_at", Float, nullable=False),
    Column("applied_version", Integer, nullable=True),
    Column("observed_digest", String(DIGEST_LENGTH), nullable=True),
    Column("reason_codes", Text, nullable=False),
    Column("report", Text, nullable=False),
    Column("heartbeat_interval", Float, nullable=False),
    # Set when a report first shows the desired revision applied with no reason code.
    Column("in_sync_since", Float, nullable=True),
    # The applied document's digest (compared with the desired revision's content_hash),
    # its origin (control-plane, local-file, local-cli, rollback, recovery, …) and the
    # reported local override as JSON (None when there is none).
    Column("applied_digest", String(DIGEST_LENGTH), nullable=True),
    Column("applied_origin", String(ORIGIN_LENGTH), nullable=True),
    Column("override", Text, nullable=True),
)

# Drift history (migration 0008): each drift record agents report, once, however many
# reports repeat it (device, subsystem and `since` identify it); updated when it ends.
# Kept per device: the newest DRIFT_KEEP (trueup.server.drift).
device_drift = Table(
    "device_drift",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("subsystem", String(SUBSYSTEM_LENGTH), nullable=False),
    Column("since", Float, nullable=False),
    Column("healed_at", Float, nullable=True),
    Column("detected_by", String(KIND_LENGTH), nullable=True),
    Column("paths", Text, nullable=False),  # JSON list
    Column("changed_by", Text, nullable=False),  # JSON list of writers, in words
    Column("healed_by", Text, nullable=True),  # JSON: trueup's heal and its transaction
    Column("attribution", Text, nullable=False),  # JSON: the notifications that explain it
    Column("first_reported_at", Float, nullable=False),
    Column("last_reported_at", Float, nullable=False),
    UniqueConstraint("device_id", "subsystem", "since", name="uq_device_drift_record"),
    Index("ix_device_drift_device_since", "device_id", "since"),
)

acks = Table(
    "acks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("subsystem", String(SUBSYSTEM_LENGTH), nullable=False),
    Column("reason", Text, nullable=False),
    Column("author", String(ACTOR_LENGTH), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

secrets = Table(
    "secrets",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("nonce", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("device_id", "name", name="uq_secrets_device_name"),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("tenant_id", Integer, nullable=True),
    Column("at", Float, nullable=False),
    Column("actor", String(ACTOR_LENGTH), nullable=False),
    Column("action", String(ACTION_LENGTH), nullable=False),
    Column("target", String(TARGET_LENGTH), nullable=False),
    Column("detail", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("row_hash", String(64), nullable=False),
)

# One row (id=1): the newest audit entry. Writers lock it, so the chain stays linear
# across server processes, and a deleted tail is noticed.
audit_head = Table(
    "audit_head",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("seq", Integer, nullable=False),
    Column("row_hash", String(64), nullable=False),
)

# Device backups (migration 0005): opaque archives the agents upload, kept per device
# (the newest `backup_keep`). The content is in `backup_chunks`, one row per
# BACKUP_CHUNK_BYTES, so no single value comes near PostgreSQL's limits and neither
# upload nor download holds a whole archive in memory (docs/control-plane.md, Backups).
# Backups and evidence bundles are one chunked blob store (service/blobs.py), each
# kind in tables of its own: their ids are in the audit log and the API's paths.
backups = Table(
    "backups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    # When the archive was made (the uploader's metadata), and when it arrived.
    Column("created_at", Float, nullable=True),
    Column("uploaded_at", Float, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    # The uploader's metadata as JSON (at most BACKUP_METADATA_LENGTH characters).
    Column("metadata", Text, nullable=False, key="meta"),
    Index("ix_backups_device", "device_id", "id"),
)

backup_chunks = Table(
    "backup_chunks",
    metadata,
    Column("backup_id", Integer, ForeignKey("backups.id"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)


# Notifications (migration 0006, docs/notifications.md). Targets are webhooks whose
# signing secret is sealed with the tenant's data key (like `secrets`); rules route a
# tenant's events to one target each; events are stored once, deliveries once per
# (event, target), attempts once per HTTP request.
notify_targets = Table(
    "notify_targets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("url", String(URL_LENGTH), nullable=False),
    # The secret's AEAD identity (associated data), nonce and ciphertext.
    Column("secret_id", String(32), nullable=False),
    Column("nonce", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    # A deleted target keeps its row (and delivery log), renamed NAME.deleted-ID.
    Column("deleted_at", Float, nullable=True),
    # A secret header sent on delivery (migration 0009): its name, and its value sealed
    # like the signing secret under a secret id of its own. All None: no such header.
    Column("auth_header_name", String(HEADER_NAME_LENGTH), nullable=True),
    Column("auth_header_secret_id", String(32), nullable=True),
    Column("auth_header_nonce", LargeBinary, nullable=True),
    Column("auth_header_ciphertext", LargeBinary, nullable=True),
    UniqueConstraint("tenant_id", "name", name="uq_notify_targets_tenant_name"),
)

# A tenant's internal webhook receivers (migration 0009): the networks (CIDRs) and host
# names its targets may reach although the target policy refuses them by default.
notify_allowlists = Table(
    "notify_allowlists",
    metadata,
    Column("tenant_id", Integer, ForeignKey("tenants.id"), primary_key=True),
    Column("entries", Text, nullable=False),  # JSON list of strings
    Column("updated_at", Float, nullable=False),
)

notify_rules = Table(
    "notify_rules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("target_id", Integer, ForeignKey("notify_targets.id"), nullable=False),
    # The match, as JSON: devices (globs), reason_codes, kinds, min_severity.
    Column("match", Text, nullable=False),
    # Escalation: seconds a device may stay failed before the rule escalates (None: never).
    Column("escalate_after", Float, nullable=True),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("tenant_id", "name", name="uq_notify_rules_tenant_name"),
)

# What the notifier last concluded about a device: its open conditions (JSON list),
# since when it has been failed, and the report that told it (so an older one is ignored).
notify_devices = Table(
    "notify_devices",
    metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("conditions", Text, nullable=False),
    Column("failed_since", Float, nullable=True),
    Column("report_at", Float, nullable=True),
)

# One row per (rule, device) escalation episode that has fired and not yet resolved.
notify_escalations = Table(
    "notify_escalations",
    metadata,
    Column("rule_id", Integer, ForeignKey("notify_rules.id"), primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("failed_since", Float, nullable=False),
    Column("fired_at", Float, nullable=False),
)

notify_events = Table(
    "notify_events",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("kind", String(KIND_LENGTH), nullable=False),
    Column("severity", String(KIND_LENGTH), nullable=False),
    Column("at", Float, nullable=False),
    # The signed body sent to every target (JSON).
    Column("payload", Text, nullable=False),
)

notify_deliveries = Table(
    "notify_deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("event_id", String(36), ForeignKey("notify_events.id"), nullable=False),
    Column("target_id", Integer, ForeignKey("notify_targets.id"), nullable=False),
    Column("rule_id", Integer, nullable=True),
    # pending | delivered | dead | discarded
    Column("state", String(KIND_LENGTH), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", Float, nullable=False),
    # Set while a worker sends it; a delivery whose lease ran out (a crash) is sent again.
    Column("lease_until", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    UniqueConstraint("event_id", "target_id", name="uq_notify_deliveries_event_target"),
    Index("ix_notify_deliveries_due", "state", "next_attempt_at"),
)

notify_attempts = Table(
    "notify_attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("delivery_id", Integer, ForeignKey("notify_deliveries.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("latency_ms", Float, nullable=False),
    Column("error", Text, nullable=True),
    Index("ix_notify_attempts_delivery", "delivery_id", "id"),
)

# Device evidence bundles (migration 0007): what `trueup evidence` builds on the router,
# uploaded by the agent (on request, or by `trueup evidence --upload`), kept per device
# (the newest EVIDENCE_KEEP), stored in chunks like the backups.
evidence = Table(
    "evidence",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("uploaded_at", Float, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("metadata", Text, nullable=False, key="meta"),
    Index("ix_evidence_device", "device_id", "id"),
)

evidence_chunks = Table(
    "evidence_chunks",
    metadata,
    Column("evidence_id", Integer, ForeignKey("evidence.id"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)

# An operator's request for a fresh bundle; answered (answered_at, evidence_id) by the
# device's next upload.
evidence_requests = Table(
    "evidence_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("requested_by", String(ACTOR_LENGTH), nullable=False),
    Column("answered_at", Float, nullable=True),
    Column("evidence_id", Integer, nullable=True),
    Index("ix_evidence_requests_device", "device_id", "id"),
)

# --- fleet inputs (migration 0010): labels, profiles, variables, own layer ---

# A device's labels (`site=ams`): what selectors match. Keys and values follow the
# Kubernetes label rules (trueup.model.layering.selectors); every change is audited
# as `device.labels` with the whole set before and after.
device_labels = Table(
    "device_labels",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("key", String(LABEL_KEY_LENGTH), nullable=False),
    Column("value", String(LABEL_VALUE_LENGTH), nullable=False),
    UniqueConstraint("device_id", "key", name="uq_device_labels_device_key"),
    Index("ix_device_labels_tenant_key", "tenant_id", "key"),
)

# Profiles (migration 0010): a partial device document with typed variables and a
# selector. Every version is kept (a row per version, never updated but for
# `deleted`); the newest row of a name is the profile, a deleted one marks its end.
profiles = Table(
    "profiles",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("version", Integer, nullable=False),
    # The profile document as canonical JSON, and its digest (Profile.digest).
    Column("document", Text, nullable=False),
    Column("digest", String(DIGEST_LENGTH), nullable=False),
    Column("created_by", String(ACTOR_LENGTH), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("comment", Text, nullable=False, server_default=""),
    # 1 on the version that deleted the profile (its document is the last one's).
    Column("deleted", Integer, nullable=False, server_default="0"),
    UniqueConstraint("tenant_id", "name", "version", name="uq_profiles_tenant_name_version"),
)

# A device's rendering inputs (migration 0010): its variable values and its own layer
# (a partial spec applied last; NULL: none), versioned for If-Match like revisions.
device_inputs = Table(
    "device_inputs",
    metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("variables", Text, nullable=False),
    Column("own", Text, nullable=True),
    Column("version", Integer, nullable=False),
    Column("updated_by", String(ACTOR_LENGTH), nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_device_inputs_tenant", "tenant_id"),
)

# --- end of fleet inputs ---

# --- rollouts (migration 0011): waves, members, the controller's lease ---

# A staged rollout of a plan's targets (trueup.server.service.rollouts): its state
# (running | paused | waiting-approval | completed | aborted | failed), its spec as JSON
# (waves, max_unavailable, soak, failure budget, confirm_within, gate timeout), the wave
# being driven, when that wave started and when its last member finished (the soak
# starts then), who started it and why it stopped.
rollouts = Table(
    "rollouts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("state", String(KIND_LENGTH), nullable=False),
    Column("spec", Text, nullable=False),
    Column("current_wave", Integer, nullable=False),
    Column("wave_started_at", Float, nullable=True),
    Column("wave_done_at", Float, nullable=True),
    # Failures of the current wave an operator accepted by resuming after a budget pause:
    # the budget counts the wave's failures beyond them (0 again when a wave starts).
    Column("accepted_failures", Integer, nullable=False, server_default="0"),
    Column("created_by", String(ACTOR_LENGTH), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("comment", Text, nullable=False, server_default=""),
    Column("reason", Text, nullable=True),
    Index("ix_rollouts_tenant_state", "tenant_id", "state"),
)

# One row per device of a rollout: its wave, the target document (JSON), digest and
# provenance, the desired version the plan was made against, the version sent (set in
# the transaction that stores the revision: a takeover sees it), the version that put it
# back, its state (pending | sent | passed | failed | reverted | skipped), the reason
# codes it reported when sent (JSON list: a gate looks for new ones) and why it ended.
rollout_members = Table(
    "rollout_members",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rollout_id", Integer, ForeignKey("rollouts.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("wave", Integer, nullable=False),
    Column("document", Text, nullable=False),
    Column("digest", String(DIGEST_LENGTH), nullable=False),
    Column("provenance", Text, nullable=True),
    Column("from_version", Integer, nullable=False),
    Column("sent_version", Integer, nullable=True),
    Column("reverted_version", Integer, nullable=True),
    Column("state", String(KIND_LENGTH), nullable=False),
    Column("baseline_codes", Text, nullable=True),
    Column("sent_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("reason", Text, nullable=True),
    UniqueConstraint("rollout_id", "device_id", name="uq_rollout_members_device"),
    Index("ix_rollout_members_wave", "rollout_id", "wave", "state"),
    Index("ix_rollout_members_device", "device_id"),
)

# Which control-plane process drives a rollout, until when (taken or renewed by one
# compare-and-set UPDATE … WHERE expires_at < now OR holder = me).
rollout_leases = Table(
    "rollout_leases",
    metadata,
    Column("rollout_id", Integer, ForeignKey("rollouts.id"), primary_key=True),
    Column("holder", String(NAME_LENGTH), nullable=False),
    Column("expires_at", Float, nullable=False),
)

# --- end of rollouts ---

# --- confirmation (migration 0012): confirm-within and confirm-or-rollback ---

# Each device's last apply guarded by a confirmation window, as its latest report says
# (trueup.server.confirmation): pending until `deadline`, confirmed, or rolled-back (why).
device_confirmation = Table(
    "device_confirmation",
    metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("version", Integer, nullable=True),
    # pending | confirmed | rolled-back
    Column("state", String(KIND_LENGTH), nullable=False),
    Column("deadline", Float, nullable=True),
    Column("reason", Text, nullable=False),
    # The revision a rollback returns to, and the version the rollback took on the device.
    Column("rollback_to", Integer, nullable=True),
    Column("rolled_back_to_version", Integer, nullable=True),
    # When a report first said this state for this version, and when one last changed it
    # (a heartbeat that repeats the record writes nothing).
    Column("since", Float, nullable=False),
    Column("reported_at", Float, nullable=False),
)

# --- end of confirmation ---
