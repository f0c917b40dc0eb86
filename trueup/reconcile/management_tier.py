"""Management facts and documents: what the management tier converges to outside a transaction.

Who calls this: the startup orchestrator (management up from persisted
facts in phase 1, before the writer lock and before anything else), `trueup
management set` (the console's recovery path, with the agent stopped, hung or
crash-looping), the engine (a console override laid over the applied
revision) and status.

The convergence itself is the engine's one converge
(`trueup.reconcile.engine.converge.converge_management`, policy
`MANAGEMENT_ONLY`): only the management subsystem, never away from an
address trueup did not assign (what it may remove is what
`scope_for(document, previous)` says trueup owns).
"""

from __future__ import annotations

import re
import socket
from typing import Any, cast

from trueup.journal.management import BootFacts, api_bind_address
from trueup.model.document import DeviceState, parse_document

__all__ = [
    "document_from_facts",
    "management_facts_of",
    "with_management",
]

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
        return bool(facts.get("virtual")) and api_bind_address(cast("BootFacts", facts)) is None
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
