"""Every control-plane operation, shared by the HTTP API and the `trueup server` CLI.

Each write runs in one transaction together with its audit entry. Every query
that takes a tenant-visible name (device, user, token) is filtered by the
caller's tenant; a name from another tenant is simply not found.

One unit per job, each over the shared `Store`; `ControlPlane` composes them::

    store.py        Store: the database, the server key, the audit writer, tenant-scoped lookups
    errors.py       ServiceError and its subclasses; name rules
    identity.py     Identity: tenants, users, roles, user tokens
    auth.py         Authenticator: token -> Principal, the per-process token cache
    enrollment.py   Enrollment: devices, enrollment bundles, device credentials
    revisions.py    DesiredRevisions: put_desired (If-Match), history, the long-poll lookups
    secrets.py      TenantSecrets: sealed per tenant, opened only for their device
    fleetview.py    Fleet: derived fleet state, reports, drift history, acknowledgements
    labels.py       DeviceLabels: a device's labels (audited), the devices a selector matches
    labelrows.py    the label rows, read and written inside a caller's transaction (shared)
    blobs.py        Blobs: the chunked blob store backups and evidence share (shared)
    backups.py      DeviceBackups: archives agents upload, per-device retention, downloads
    evidence.py     DeviceEvidence: evidence bundles agents upload, operator requests
    audittrail.py   AuditTrail: list a tenant's entries, verify the chain
    profiles.py     Profiles: versioned partial documents with typed variables (If-Match)
    deviceinputs.py DeviceInputRecords: a device's variables and own layer (If-Match)
    planner.py      Planner: the fleet plan of a change, and publishing it (composes the
                    units it is given: profiles, device inputs, labels, revisions)
    rollouts.py     Rollouts: a plan published wave by wave (rolloutplan.py: spec, waves,
                    gates; rolloutrows.py: shared rows; rolloutcontrol.py: the controller)
    plane.py        ControlPlane: the units composed, one flat API

The units never import each other (import-linter checks it): what one needs
from another is passed in, like `credentials_changed`.
"""

from trueup.server.service.auth import Principal
from trueup.server.service.backups import BackupGone
from trueup.server.service.errors import (
    Busy,
    Conflict,
    Invalid,
    NotFound,
    ServiceError,
    Tampered,
    Unauthorized,
    WrongState,
)
from trueup.server.service.fleetview import agent_acknowledgements
from trueup.server.service.plane import ControlPlane
from trueup.server.service.revisions import Revision

__all__ = [
    "BackupGone",
    "Busy",
    "Conflict",
    "ControlPlane",
    "Invalid",
    "NotFound",
    "Principal",
    "Revision",
    "ServiceError",
    "Tampered",
    "Unauthorized",
    "WrongState",
    "agent_acknowledgements",
]
