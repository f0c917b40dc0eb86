"""The management guard: what a document would take away from management access.

Who calls this: the engine (`trueup.reconcile.engine`), once, for every
apply and rollback. A change that removes the management address, moves the
management interface or changes its default route — or whose subsystems find
it would cut management off (`Subsystem.management_risks`: a firewall that
drops the API port) — is refused unless the caller arranged a confirmation
(`--confirm-within`), which rolls it back when nobody confirms in time.
"""

from __future__ import annotations

from collections.abc import Iterable

from trueup.model.document import DeviceState
from trueup.model.virtual import is_virtual, virtual_addresses
from trueup.subsystems.base import Subsystem

__all__ = ["management_guard", "subsystem_risks", "unsafe_management_changes"]


def unsafe_management_changes(previous: DeviceState | None, document: DeviceState) -> list[str]:
    """What `document` would take away from management access that `previous` gave."""
    if previous is None:
        return []
    old, new = previous.spec.management, document.spec.management
    out: list[str] = []
    if old.interface != new.interface:
        out.append(f"moves management from {old.interface} to {new.interface}")
    virtual = virtual_addresses(document)
    for address in old.addresses:
        if old.interface != new.interface or address not in new.addresses:
            if is_virtual(address, virtual):
                # Told apart: a virtual address is held only while the HA role holds it.
                out.append(
                    f"removes management address {address} from {old.interface} "
                    "(it becomes an HA virtual address, held only while this node's role "
                    "holds it)"
                )
            else:
                out.append(f"removes management address {address} from {old.interface}")
    if old.gateway is not None and new.gateway != old.gateway:
        change = f"replaces it with {new.gateway}" if new.gateway else "removes it"
        out.append(f"management default route via {old.gateway}: {change}")
    return out


def subsystem_risks(
    subsystems: Iterable[Subsystem],
    previous: DeviceState | None,
    document: DeviceState,
    api_port: int | None,
) -> list[str]:
    """What `document` would newly do to management access through subsystems (a firewall
    that drops the API port): findings the applied revision `previous` already had were
    confirmed with it and are not asked about again."""
    out: list[str] = []
    for sub in subsystems:
        found = sub.management_risks(document, api_port)
        if found and previous is not None:
            known = set(sub.management_risks(previous, api_port))
            found = [f for f in found if f not in known]
        out += found
    return out


def management_guard(
    previous: DeviceState | None, document: DeviceState, risks: Iterable[str] = ()
) -> str | None:
    """Why `document` may not be applied without `--confirm-within`, or None when it may."""
    unsafe = unsafe_management_changes(previous, document) + list(risks)
    if not unsafe:
        return None
    return (
        "; ".join(unsafe) + " — management could become unreachable. Nothing was changed. "
        "Re-run with --confirm-within SECONDS (with the agent running): the change is rolled "
        "back unless `trueup confirm` arrives in time"
    )
