"""`ControlPlane`: the service's units composed over one database and one server key.

It holds no logic. Each unit owns one job (see the package docstring) and
shares a `Store`; the names below are the flat API that the HTTP routes, the
`trueup server` CLI, scripts and tests call, each one a unit's own method.
To add an operation, write it in the unit that owns the job and name it here.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from trueup.model.layering import parse_selector
from trueup.server.db import Database
from trueup.server.keys import ServerKey
from trueup.server.limits import BACKUP_KEEP, EVIDENCE_KEEP
from trueup.server.service.audittrail import AuditTrail
from trueup.server.service.auth import Authenticator
from trueup.server.service.backups import DeviceBackups
from trueup.server.service.deviceinputs import DeviceInputRecords
from trueup.server.service.enrollment import Enrollment
from trueup.server.service.evidence import DeviceEvidence
from trueup.server.service.fleetview import Fleet
from trueup.server.service.identity import Identity
from trueup.server.service.labels import DeviceLabels
from trueup.server.service.notify import Allowlists, Deliveries, Engine, Notifier, Routing
from trueup.server.service.planner import Planner
from trueup.server.service.profiles import Profiles
from trueup.server.service.revisions import DesiredRevisions
from trueup.server.service.rolloutcontrol import RolloutController
from trueup.server.service.rollouts import Rollouts
from trueup.server.service.secrets import TenantSecrets
from trueup.server.service.store import Store

__all__ = ["ControlPlane"]


class ControlPlane:
    """The control plane's operations over one database and one server key."""

    def __init__(
        self,
        database: Database,
        server_key: ServerKey,
        *,
        stale_intervals: int = 3,
        auth_cache_seconds: float = 2.0,
        backup_keep: int = BACKUP_KEEP,
        notify: dict[str, float] | None = None,
        evidence_keep: int = EVIDENCE_KEEP,
        rollout: dict[str, float] | None = None,
    ) -> None:
        self.db = database
        self.key = server_key
        store = Store(database, server_key)
        self.auth = Authenticator(store, cache_seconds=auth_cache_seconds)
        self.identity = Identity(store, credentials_changed=self.auth.forget)
        self.enrollment = Enrollment(store, credentials_changed=self.auth.forget)
        self.desired_revisions = DesiredRevisions(store)
        self.tenant_secrets = TenantSecrets(store)
        self.fleet_view = Fleet(store, stale_intervals=stale_intervals)
        self.audit_trail = AuditTrail(store)
        self.device_backups = DeviceBackups(store, keep=backup_keep)
        self._compose_notifications(store, dict(notify or {}), stale_intervals)
        self.device_evidence = DeviceEvidence(store, keep=evidence_keep)
        self.device_labels = DeviceLabels(store)
        self.profiles = Profiles(store)
        self.device_inputs = DeviceInputRecords(store)
        self.planner = Planner(
            store,
            profiles=self.profiles,
            inputs=self.device_inputs,
            labels=self.device_labels,
            revisions=self.desired_revisions,
        )
        self._compose_rollouts(store, dict(rollout or {}))
        self._name_device_operations()
        self._name_fleet_operations()

    def _compose_notifications(
        self, store: Store, tunables: dict[str, float], stale_intervals: int
    ) -> None:
        """Notifications: `tunables` holds the Notifier's and Deliveries' settings."""
        self.notify_routing = Routing(store)
        self.notify_allowlists = Allowlists(store)
        self.notify_engine = Engine(store, stale_intervals=stale_intervals)
        self.notify_deliveries = Deliveries(
            store,
            base_delay=tunables.get("base_delay", 5.0),
            max_delay=tunables.get("max_delay", 600.0),
            max_attempts=int(tunables.get("max_attempts", 8)),
            lease_seconds=tunables.get("lease_seconds", 60.0),
        )
        self.notifier = Notifier(
            self.notify_engine,
            self.notify_deliveries,
            poll_seconds=tunables.get("poll_seconds", 1.0),
            scan_seconds=tunables.get("scan_seconds", 5.0),
            timeout=tunables.get("timeout", 10.0),
        )

    def _compose_rollouts(self, store: Store, rollout_tunables: dict[str, float]) -> None:
        """Rollouts: the unit, and the controller thread (`rollout_tunables` holds its
        settings); a device an unfinished rollout holds refuses `put_desired`."""

        def rollout_insert(conn: Connection, **revision: Any) -> Any:
            """A rollout's revision; a rendered one (with provenance) adopts the device's
            previous document as its own layer first, as publishing a plan does."""
            if revision.get("provenance") is not None:
                self.planner.adopt_inputs(
                    conn,
                    revision["tenant_id"],
                    revision["device_id"],
                    revision["device"],
                    revision["expected_version"],
                    revision["author"],
                )
            return self.desired_revisions.insert_revision(conn, **revision)

        self.rollout_unit = Rollouts(
            store,
            rollout_insert,
            matching=lambda tenant_id, text: [
                name
                for _id, name, _labels in self.device_labels.devices_matching(
                    tenant_id, parse_selector(text)
                )
            ],
        )
        self.rollout_controller = RolloutController(
            store,
            rollout_insert,
            tick_seconds=rollout_tunables.get("tick_seconds", 1.0),
            lease_seconds=rollout_tunables.get("lease_seconds", 15.0),
        )
        self.desired_revisions.busy = self.rollout_unit.refuse_busy
        self.planner.busy = self.rollout_unit.busy_holders  # a plan refuses them (kind busy)
        self.planner.refuse_busy = self.rollout_unit.refuse_busy  # and so does publishing

    def _name_device_operations(self) -> None:
        """The flat names of tenants, users, devices and what each device holds."""
        # identity: tenants, users, roles, user tokens
        self.tenant_id = self.identity.tenant_id
        self.create_tenant = self.identity.create_tenant
        self.create_user = self.identity.create_user
        self.set_role = self.identity.set_role
        self.list_users = self.identity.list_users
        self.create_token = self.identity.create_token
        self.revoke_token = self.identity.revoke_token
        self.list_tokens = self.identity.list_tokens
        # authentication
        self.cached_principal = self.auth.cached_principal
        self.authenticate = self.auth.authenticate
        # devices and enrollment
        self.device_id = self.enrollment.device_id
        self.create_device = self.enrollment.create_device
        self.enroll = self.enrollment.enroll
        self.exchange_enrollment = self.enrollment.exchange_enrollment
        # device labels
        self.labels = self.device_labels.labels
        self.set_labels = self.device_labels.set_labels
        self.devices_matching = self.device_labels.devices_matching
        # desired revisions
        self.put_desired = self.desired_revisions.put_desired
        self.desired = self.desired_revisions.desired
        self.revision = self.desired_revisions.revision
        self.revisions = self.desired_revisions.revisions
        self.desired_after = self.desired_revisions.desired_after
        self.revisions_since = self.desired_revisions.revisions_since
        self.max_revision_id = self.desired_revisions.max_revision_id
        # secrets
        self.put_secret = self.tenant_secrets.put_secret
        self.secret_names = self.tenant_secrets.secret_names
        self.device_secrets = self.tenant_secrets.device_secrets
        # the fleet view: derived state, reports, acknowledgements
        self.fleet = self.fleet_view.fleet
        self.device_view = self.fleet_view.device
        self.last_report = self.fleet_view.last_report
        self.report_history = self.fleet_view.report_history
        self.drift_history = self.fleet_view.drift_history
        self.confirmation_of = self.fleet_view.confirmation_of
        self.acknowledge = self.fleet_view.acknowledge

    def _name_fleet_operations(self) -> None:
        """The flat names of backups, notifications, evidence, fleet inputs, rollouts and
        the audit log."""
        # device backups
        self.store_backup = self.device_backups.store_backup
        self.backups = self.device_backups.backups
        self.backup = self.device_backups.backup
        self.backup_content = self.device_backups.backup_content
        self.delete_backup = self.device_backups.delete_backup
        # notifications
        self.create_notify_target = self.notify_routing.create_target
        self.notify_targets = self.notify_routing.targets
        self.delete_notify_target = self.notify_routing.delete_target
        self.create_notify_rule = self.notify_routing.create_rule
        self.notify_rules = self.notify_routing.rules
        self.delete_notify_rule = self.notify_routing.delete_rule
        self.notify_allowlist = self.notify_allowlists.allowlist
        self.set_notify_allowlist = self.notify_allowlists.set_allowlist
        self.notify_delivery_log = self.notify_deliveries.deliveries
        self.redeliver_notification = self.notify_deliveries.redeliver
        self.discard_notification = self.notify_deliveries.discard
        # device evidence bundles
        self.store_evidence = self.device_evidence.store_evidence
        self.request_evidence = self.device_evidence.request_evidence
        self.pending_evidence_request = self.device_evidence.pending_request
        self.evidence_list = self.device_evidence.evidence_list
        self.evidence_bundle = self.device_evidence.evidence_bundle
        self.evidence_content = self.device_evidence.evidence_content
        self.audit_evidence_download = self.device_evidence.audit_download
        # fleet inputs: profiles, device variables and own layers; the fleet plan
        self.put_profile = self.profiles.put
        self.create_profile = self.profiles.create
        self.update_profile = self.profiles.update
        self.delete_profile = self.profiles.delete
        self.profile = self.profiles.show
        self.profile_list = self.profiles.list
        self.profile_history = self.profiles.history
        self.device_variables = self.device_inputs.get
        self.put_device_variables = self.device_inputs.put
        self.plan = self.planner.plan
        self.publish_plan = self.planner.publish
        # rollouts
        self.start_rollout = self.rollout_unit.start
        self.rollouts = self.rollout_unit.list
        self.rollout = self.rollout_unit.get
        self.pause_rollout = self.rollout_unit.pause
        self.resume_rollout = self.rollout_unit.resume
        self.approve_rollout = self.rollout_unit.approve
        self.abort_rollout = self.rollout_unit.abort
        self.busy_devices = self.rollout_unit.busy_devices
        # the audit log
        self.audit_entries = self.audit_trail.audit_entries
        self.verify_audit = self.audit_trail.verify_audit
        self.reanchor_audit = self.audit_trail.reanchor
        self.unvouched_credentials = self.audit_trail.unvouched_credentials
