"""The control plane's limits, in one place: request models, columns and the body limits use them.

Every string column in `tables.py` is declared with one of these lengths and
every request model field that reaches it is bounded by the same constant, so
a request the API accepts always fits storage (PostgreSQL refuses a longer
value, or a NUL, with an error; SQLite would store it). Integers are bounded by
`MAX_INT32`, what an INTEGER column holds. The report and document bounds are
the agent's own (`trueup.model.limits`).

Composite strings are sized from their parts: an actor is `user:TENANT/USER` or
`device:TENANT/DEVICE`, an audit target at most `device:DEVICE/secret:NAME`.
"""

from __future__ import annotations

from trueup.model.limits import (
    CONTROL_CHARACTERS,
    DIGEST_LENGTH,
    DOCUMENT_BYTES,
    EXCERPT_CHARS,
    MAX_DEPTH,
    MAX_INT32,
    MAX_VERSION,
    ORIGIN_LENGTH,
    REPORT_BYTES,
    excerpt,
    has_control_characters,
)

__all__ = [
    "ACTION_LENGTH",
    "ACTOR_LENGTH",
    "AGENT_VERSION_LENGTH",
    "BACKUP_BODY_BYTES",
    "BACKUP_CHUNK_BYTES",
    "BACKUP_KEEP",
    "BACKUP_METADATA_LENGTH",
    "CONTROL_CHARACTERS",
    "DEFAULT_BODY_BYTES",
    "DEVICE_NAME_LENGTH",
    "DIGEST_LENGTH",
    "DOCUMENT_BYTES",
    "EVIDENCE_BODY_BYTES",
    "EVIDENCE_KEEP",
    "EXCERPT_CHARS",
    "HEADER_NAME_LENGTH",
    "HEADER_VALUE_LENGTH",
    "KIND_LENGTH",
    "LABELS_MAX",
    "LABEL_KEY_LENGTH",
    "LABEL_VALUE_LENGTH",
    "MAX_DEPTH",
    "MAX_INT32",
    "MAX_VERSION",
    "NAME_LENGTH",
    "ORIGIN_LENGTH",
    "QUERY_LENGTH",
    "REPORT_BYTES",
    "SECRET_BODY_BYTES",
    "SECRET_VALUE_LENGTH",
    "SELECTOR_LENGTH",
    "SUBSYSTEM_LENGTH",
    "TARGET_LENGTH",
    "TEXT_LENGTH",
    "TOKEN_HASH_LENGTH",
    "TOKEN_LABEL_LENGTH",
    "URL_LENGTH",
    "excerpt",
    "has_control_characters",
]

NAME_LENGTH = 200  # tenant, user and secret names
DEVICE_NAME_LENGTH = 253  # a DNS name's length
TOKEN_LABEL_LENGTH = 200
TOKEN_HASH_LENGTH = 64
KIND_LENGTH = 20  # token kinds and roles
SUBSYSTEM_LENGTH = 100  # an acknowledgement's subsystem
ACTION_LENGTH = 60
# "device:" + tenant + "/" + device = 461, "user:" + tenant + "/" + user = 406.
ACTOR_LENGTH = 512
# "device:" + device + "/secret:" + secret name = 468.
TARGET_LENGTH = 512
TEXT_LENGTH = 10_000  # free text stored in a Text column: comments, ack reasons
SECRET_VALUE_LENGTH = 65_536
URL_LENGTH = 2048  # a webhook URL
HEADER_NAME_LENGTH = 100  # a webhook target's secret header: its name
HEADER_VALUE_LENGTH = 8192  # ... and its value (sealed)
QUERY_LENGTH = 200  # free-form query parameters (filters)
# Device labels (service/labels.py): a key is [DNS subdomain prefix (253) "/"] name (63),
# a value at most 63 (the Kubernetes rules); a device carries at most LABELS_MAX of them;
# a label selector in a query is at most SELECTOR_LENGTH characters.
LABEL_KEY_LENGTH = 317
LABEL_VALUE_LENGTH = 63
LABELS_MAX = 64
SELECTOR_LENGTH = 2048

# Request bodies, checked before they are read (Content-Length) and while they are.
DEFAULT_BODY_BYTES = 64 * 1024
# A secret value of 65,536 characters, JSON-escaped (`\uXXXX` is 6 bytes a character).
SECRET_BODY_BYTES = 6 * SECRET_VALUE_LENGTH + 1024

# Device backups (service/backups.py): the upload's body limit (configurable, Settings),
# the chunk rows the content is stored in, the per-device retention, and the metadata the
# uploader sends as one JSON header.
BACKUP_BODY_BYTES = 256 * 1024 * 1024
BACKUP_CHUNK_BYTES = 1024 * 1024
BACKUP_KEEP = 10
BACKUP_METADATA_LENGTH = 4096
AGENT_VERSION_LENGTH = 64

# Device evidence bundles (service/evidence.py): the upload's body limit (configurable,
# Settings) and the per-device retention; chunks and metadata as for backups.
EVIDENCE_BODY_BYTES = 64 * 1024 * 1024
EVIDENCE_KEEP = 5

assert len("device:") + NAME_LENGTH + 1 + DEVICE_NAME_LENGTH <= ACTOR_LENGTH
assert len("user:") + 2 * NAME_LENGTH + 1 <= ACTOR_LENGTH
assert len("device:/secret:") + DEVICE_NAME_LENGTH + NAME_LENGTH <= TARGET_LENGTH
