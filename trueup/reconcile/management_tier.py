"""The management tier on its own, outside any transaction: phase 1, the console, the fallback heal.

Who calls this: the startup orchestrator's phase 1 (management up from
persisted facts, before the writer lock and before anything else), `trueup
management set` (the console's recovery path, with the agent stopped, hung or
crash-looping), the engine (a console override laid over the applied
revision) and the reconcile loop when the state directory refuses
transactions (damaged, read-only, full) but management must still be kept.

It converges only the management subsystem, through its own plan and
execute, and never removes an address trueup did not assign: what it may
remove is what `scope_for(document, previous)` says trueup owns.
"""

from __future__ import annotations

import re
import socket
from typing import TYPE_CHECKING, Any

from trueup.journal.management import api_bind_address
from trueup.model.document import DeviceState, parse_document
from trueup.subsystems.base import Plan, Step, StepError
from trueup.subsystems.registry import scope_for

if TYPE_CHECKING:
    from trueup.reconcile.transaction import Engine

__all__ = [
    "audit_restored",
    "converge_management",
    "document_from_facts",
    "management_facts_of",
    "plan_management",
    "with_management",
]

_PASSES = 3
_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def management_facts_of(document: DeviceState) -> dict[str, Any]:
    """A document's management facts: interface, addresses, gateway."""
    mgmt = document.spec.management
    return {
        "interface": mgmt.interface,
        "addresses": list(mgmt.addresses),
        "gateway": mgmt.gateway,
    }


def _device_name() -> str:
    name = socket.gethostname().split(".")[0]
    return name if _DEVICE.match(name) else "unknown"


def document_from_facts(facts: dict[str, Any], *, source: str) -> DeviceState:
    """A document holding only `spec.management` (for phase 1, before any revision is readable).

    `facts` holds interface, addresses, gateway and optionally api ({port, bind}).
    Raises `DocumentError` naming `source` and the path when the facts are not valid.
    """
    management: dict[str, Any] = {
        "interface": facts.get("interface"),
        "addresses": list(facts.get("addresses") or []),
    }
    if facts.get("gateway") is not None:
        management["gateway"] = facts["gateway"]
    api = facts.get("api")
    if isinstance(api, dict):
        settings = {k: v for k, v in api.items() if v is not None}
        if settings.get("bind") is not None and _virtual_bind(facts):
            # A saved bind on an HA virtual address is never bound: the wildcard serves.
            del settings["bind"]
        management["api"] = settings
    return parse_document(
        {
            "apiVersion": "trueup/v1",
            "kind": "DeviceState",
            "metadata": {"device": _device_name()},
            "spec": {"management": management},
        },
        source,
    )


def _virtual_bind(facts: dict[str, Any]) -> bool:
    """Whether the facts' API bind names one of their HA virtual addresses (`virtual`)."""
    try:
        return bool(facts.get("virtual")) and api_bind_address(facts) is None
    except (IndexError, KeyError, TypeError, AttributeError):
        return False


def with_management(document: DeviceState, facts: dict[str, Any], *, source: str) -> DeviceState:
    """`document` with its management interface, addresses and gateway replaced by `facts`.

    The API listener settings and every other section stay. Raises
    `DocumentError` when the result is not a valid document (an override
    address another interface of the revision also holds, …).
    """
    body = document.canonical()
    management = dict(body["spec"]["management"])
    management["interface"] = facts["interface"]
    management["addresses"] = list(facts["addresses"])
    management.pop("gateway", None)
    if facts.get("gateway") is not None:
        management["gateway"] = facts["gateway"]
    body["spec"]["management"] = management
    return parse_document(body, source)


def audit_restored(engine: Engine, steps: list[Step], actor: str, **details: Any) -> str | None:
    """Audit `management_restored`; best effort: why it was not written, or None.

    A read-only or full state directory must not keep management down, nor
    make restoring it look failed; the problem is noted as damaged state.
    """
    try:
        engine.state.audit.append(
            "management_restored", actor, steps=[s.describe() for s in steps], **details
        )
    except OSError as exc:
        engine.check.note(engine.state.audit.path, f"cannot be appended to: {exc}")
        return str(exc)
    return None


def plan_management(
    engine: Engine, document: DeviceState, previous: DeviceState | None = None
) -> Plan:
    """What converging the management tier to `document` would do now."""
    sub = engine.by_name["management"]
    scope = scope_for(document, previous)
    with engine.sources() as net:
        return sub.plan(sub.desired(document, scope), sub.observe(net, scope), scope)


def converge_management(
    engine: Engine, document: DeviceState, previous: DeviceState | None = None
) -> list[Step]:
    """Converge the management subsystem alone to `document`; the steps it ran.

    `previous` names management state trueup assigned before (its addresses
    and default route may be removed once the new ones are on: make before
    break). Raises `StepError` (or `NetlinkError`) when a step fails or the
    kernel still differs after a few passes.
    """
    sub = engine.by_name["management"]
    scope = scope_for(document, previous)
    desired = sub.desired(document, scope)
    done: list[Step] = []
    with engine.sources() as net:
        for _ in range(_PASSES):
            plan = sub.plan(desired, sub.observe(net, scope), scope)
            if not plan.steps:
                return done
            for step in plan.steps:
                sub.execute(net, step)
                done.append(step)
        plan = sub.plan(desired, sub.observe(net, scope), scope)
        if plan.steps:
            raise StepError(
                plan.steps[0],
                f"still differs after {_PASSES} passes: "
                + ", ".join(sorted({step.path for step in plan.steps})),
            )
    return done
