"""The report an agent sends its control plane, built from its status; when the next is due.

`report_from_status(body)` reads the agent's status document
(`trueup.model.status.Status`, the body `/v1/status` serves) and builds the
`trueup.model.report.AgentReport` the control plane validates with the same
model: a report the control plane would refuse fails here, in the agent's
log, not as a 422 the agent cannot explain. `ReportPacer` says when the next
report is due (coalesced changes, the heartbeat, a 429's back-off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trueup import __version__
from trueup.model.digests import json_digest
from trueup.model.document import SUPPORTED_API_VERSIONS, supported_sections
from trueup.model.jsontypes import JSONObject
from trueup.model.report import AckReport, AgentReport, DriftReport, SubsystemReport
from trueup.model.status import Status, SubsystemStatus

__all__ = ["REPORTED_DRIFT", "ReportPacer", "drift_and_acks", "report_from_status"]

REPORTED_DRIFT = 20  # drift records a report carries (ongoing first, then the newest ended)
REPORTED_PATHS = 50  # paths per drift record
REPORTED_ATTRIBUTION = 5  # notifications per drift record (the newest)


REPORTED_GATEWAYS = 32  # uplinks a report names (`spec.gateways.uplinks`)


def _gateways(system: JSONObject | None) -> dict[str, object]:
    """The gateways' states in the report (`gateways`, `gateways_all_down`): the control
    plane's `gateway_down` and `gateways_all_down` notifications read them."""
    listed = (system or {}).get("gateways")
    if not isinstance(listed, list):
        return {}
    gateways = [
        {k: str(g.get(k))[:64] for k in ("name", "state", "since") if g.get(k) is not None}
        | {"active": bool(g.get("active"))}
        for g in listed[:REPORTED_GATEWAYS]
        if isinstance(g, dict)
    ]
    return {"gateways": gateways, "gateways_all_down": bool((system or {}).get("all_down"))}


def _subsystem_report(sub: SubsystemStatus) -> SubsystemReport:
    """A subsystem in the report: health and reason, and (when the agent has them) the
    circuit breaker and the local acknowledgement's expiry (the dashboard shows them), and
    the gateways' states."""
    extra = sub.model_extra or {}
    kept: dict[str, object] = {
        k: extra[k] for k in ("breaker", "acknowledged_until") if isinstance(extra.get(k), str)
    }
    kept.update(_gateways(sub.system))
    return SubsystemReport(health=sub.health, reason=sub.reason or None, **kept)


def _restore_summary(record: JSONObject | None) -> JSONObject | None:
    """A restore in the report: `pending` while it runs, `failed` when it rolled back or is
    stuck on a problem, `completed`; the control plane's notifications read `state`;
    the dashboard reads `pending` (the record's own fields are kept beside it)."""
    if not record or not record.get("state"):
        return None
    phase = str(record["state"])
    if phase == "rolled_back" or (record.get("pending") and record.get("problem")):
        state = "failed"
    elif record.get("pending"):
        state = "pending"
    else:
        state = "completed"
    summary = {k: record.get(k) for k in ("id", "since", "mode", "pending", "next")}
    return {**summary, "state": state, "phase": phase}


def _agent_identity(status: Status) -> dict[str, str | list[str]]:
    """The agent's version and what documents it understands (the report's identity fields)."""
    version = (status.agent or {}).get("version")
    return {
        "agent_version": version if isinstance(version, str) and version else __version__,
        "supported_api_versions": list(SUPPORTED_API_VERSIONS),
        "supported_sections": supported_sections(),
    }


def _writer(event: JSONObject) -> str | None:
    """Who an attribution entry names as the writer, in words (None: nobody known)."""
    sender = event.get("sender")
    if not sender or sender == "kernel" or str(sender).startswith("trueup"):
        return None  # the kernel's own, or this agent's write (the heal itself)
    return f"{event.get('message') or 'a change'} from {sender}"


def _drift_record(name: str, record: JSONObject) -> DriftReport:
    attribution = [a for a in record.get("attribution") or [] if isinstance(a, dict)]
    changed_by = sorted({w for w in map(_writer, attribution) if w})
    paths = [str(p) for p in record.get("paths") or []]
    return DriftReport.model_validate(
        {
            "subsystem": name,
            "paths": paths[:REPORTED_PATHS],
            "paths_total": len(paths),
            "since": record.get("since"),
            "healed_at": record.get("ended_at"),
            "detected_by": record.get("detected_by"),
            "changed_by": changed_by[:REPORTED_ATTRIBUTION],
            "attribution": attribution[-REPORTED_ATTRIBUTION:],
            "healed_by": record.get("healed_by"),
        }
    )


# What the report model (`trueup.model.report.AckReport`) takes of each text: an
# acknowledgement's reason and actor are whatever `trueup ack` (or an API client) gave,
# unbounded; one longer than the model takes would fail every report until it is gone.
_ACK_TEXT = {"by": 200, "reason": 10_000, "until": 64, "at": 64, "ended_at": 64}


def _bounded_ack(ack: JSONObject) -> AckReport:
    for key, limit in _ACK_TEXT.items():
        value = ack.get(key)
        if value is not None and not isinstance(value, str):
            value = str(value)
        if isinstance(value, str) and len(value) > limit:
            value = value[: limit - 1] + "…"
        ack[key] = value
    return AckReport.model_validate(ack)


def drift_and_acks(status: Status) -> tuple[list[DriftReport], list[AckReport]]:
    """The report's drift history and the router's own acknowledgements.

    `drift_history`: drift going on now (`healed_at` None) and recently ended
    drift, newest first, each with its paths, who changed it (`changed_by`, from
    the notifications that explain it: `attribution`) and who put it back
    (`healed_by`: trueup's heal and its transaction; None when something else
    did). `acknowledgements`: `trueup ack` holds on healing, active and
    recently ended (`state`: active, expired or withdrawn). Bounded in size.
    """
    history = [
        _drift_record(str(r.get("subsystem")), r)
        for r in status.drift_history or []
        if isinstance(r, dict)
    ]
    extras = {name: sub.model_extra or {} for name, sub in status.subsystems.items()}
    if not history:
        # An older status without the history: what each subsystem shows.
        for name, extra in extras.items():
            for key in ("drift", "last_drift"):
                if isinstance(extra.get(key), dict):
                    history.append(_drift_record(name, {"ended_at": None, **extra[key]}))
    acknowledgements: list[AckReport] = []
    for name, extra in sorted(extras.items()):
        ack = extra.get("acknowledgement")
        if isinstance(ack, dict):
            acknowledgements.append(
                _bounded_ack(
                    {
                        "subsystem": name,
                        "until": ack.get("until_at"),
                        "by": ack.get("actor"),
                        "reason": ack.get("reason"),
                        "at": ack.get("at"),
                        "state": "active",
                    }
                )
            )
    for ended in status.acknowledgements_ended or []:
        if isinstance(ended, dict):
            acknowledgements.append(
                _bounded_ack(
                    {
                        **{k: ended.get(k) for k in ("subsystem", "until", "by", "reason", "at")},
                        "state": ended.get("ended") or "expired",
                        "ended_at": ended.get("ended_at"),
                    }
                )
            )
    return history[:REPORTED_DRIFT], acknowledgements[:REPORTED_DRIFT]


def _confirmation(record: JSONObject | None) -> JSONObject | None:
    """The last guarded apply in the report: {version, state, deadline (epoch), reason, …}."""
    if not isinstance(record, dict) or record.get("state") not in (
        "pending",
        "confirmed",
        "rolled-back",
    ):
        return None
    out = {
        k: record.get(k)
        for k in ("version", "state", "deadline", "reason", "rollback_to", "origin", "at")
    }
    rolled_to = record.get("rolled_back_to_version")
    if rolled_to is not None:
        out["rolled_back_to_version"] = rolled_to
    if isinstance(out["reason"], str):
        out["reason"] = out["reason"][:1000]
    return out


def _diff_summary(status: Status, differences: Mapping[str, list[JSONObject]]) -> JSONObject:
    subsystems = status.subsystems
    return {
        "paths": sorted(str(d.get("path")) for diffs in differences.values() for d in diffs),
        "subsystems": {name: len(diffs) for name, diffs in differences.items()},
        # Known limitations and the differences they cover (accepted, not drift).
        "accepted": sorted(str(d.get("path")) for sub in subsystems.values() for d in sub.accepted),
        "limitations": [
            {k: item.get(k) for k in ("id", "subsystem", "path", "reason", "reviewed_by", "ticket")}
            for item in status.limitations
        ],
    }


def report_from_status(body: Mapping[str, Any]) -> JSONObject:
    """Turn the agent's `/v1/status` document into a control-plane report (its JSON body).

    The applied revision's identity goes along: `applied_digest` (document_digest
    of the applied document), `applied_origin` and `override` (a local apply
    overriding the control plane's revision). Status documents of older agents
    lack them; they are then None, and the control plane compares numbers only.

    Every report also says what this agent is: `agent_version` (status' `agent.version`,
    else this package's), `supported_api_versions` and `supported_sections` (so the
    control plane can tell when a desired revision uses something the agent lacks).
    """
    status = Status.read(body)
    versions = status.versions
    # What the document leaves out stays unreported (None), never a default.
    applied = versions.applied if "applied" in versions.model_fields_set else None
    management = status.management
    differences = {
        name: sub.differences for name, sub in status.subsystems.items() if sub.differences
    }
    findings = status.reason_codes
    history, acknowledgements = drift_and_acks(status)
    extra: JSONObject = {}
    confirmation = _confirmation(status.confirmation)
    if confirmation is not None:
        extra["confirmation"] = confirmation
    restore = _restore_summary(status.restore)
    if restore is not None:
        extra["restore"] = restore
    report = AgentReport.model_validate(
        {
            "applied_version": applied or None,
            "applied_digest": versions.applied_digest or None,
            "applied_origin": versions.origin or None,
            "override": versions.override.to_json() if versions.override else None,
            "observed_digest": json_digest({"applied": applied, "differences": differences}),
            "diff_summary": _diff_summary(status, differences),
            "subsystems": {n: _subsystem_report(sub) for n, sub in status.subsystems.items()},
            "reason_codes": sorted({f.code for f in findings}),
            "findings": [f.model_dump(mode="json") for f in findings],
            "journal": {
                "open": status.journal.open,
                "last": status.journal.last,
            },
            "management_ready": (
                management.ready if "ready" in management.model_fields_set else None
            ),
            **_agent_identity(status),
            **extra,
            "drift_history": history,
            "acknowledgements": acknowledgements,
        }
    )
    out: JSONObject = report.model_dump(mode="json")
    return out


class ReportPacer:
    """When the next report is due: coalesced changes, the heartbeat, a 429's back-off.

    A change asked for (`request`) is reported at once when the last report is
    at least `min_interval` old, else when it becomes so: at most one report
    per `min_interval`, and every change asked for meanwhile goes with that
    one (a report carries the state as it is when it is built, never an event
    of its own). Without a change the heartbeat is due `heartbeat` seconds
    after the last report. A refusal with 429 holds every report until its
    Retry-After has passed (at least `min_interval`); the change stays asked
    for, so the report after the back-off carries the latest state. Pure
    bookkeeping on a clock the caller gives: the unit tests drive it by hand.
    """

    def __init__(self, *, heartbeat: float, min_interval: float = 1.0) -> None:
        self.heartbeat = heartbeat
        self.min_interval = min_interval
        self.last_sent: float | None = None
        self.requested = True  # the first report goes out at once
        self.hold_until: float | None = None

    def request(self) -> None:
        self.requested = True

    def due_at(self) -> float:
        """The clock time at which the next report is due (0 when it is due now)."""
        if self.last_sent is None:
            earliest = 0.0
        else:
            wanted = self.min_interval if self.requested else self.heartbeat
            earliest = self.last_sent + wanted
        if self.hold_until is not None:
            earliest = max(earliest, self.hold_until)
        return earliest

    def sent(self, now: float) -> None:
        self.last_sent = now
        self.hold_until = None

    def taken(self) -> None:
        """The report about to be built carries every change asked for so far."""
        self.requested = False

    def throttled(self, now: float, retry_after: float | None) -> None:
        """A 429: nothing goes out before Retry-After; the state is reported after it."""
        self.requested = True
        self.hold_until = now + max(self.min_interval, retry_after or self.min_interval)
