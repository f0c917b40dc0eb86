"""What differs inside Kea's configuration, path by path (pure: no I/O).

Who uses this: `DhcpSubsystem.observe`, when Kea runs a configuration trueup
never set (a `config-set` through its socket, an edited file). The digest
alone says *that* it differs; this says *where*: each changed value of Kea's
configuration against what Kea answered when trueup last set it (the same
serialisation, so Kea's defaults never show as changes), named by the
document path it comes from when there is one
(`spec.dhcp.subnets[0].pools[0]`), else by its Kea path
(`spec.dhcp.dhcp4.config[Dhcp4.sanity-checks.lease-checks]`).
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.subsystems.dhcp.section import DhcpSection

__all__ = ["MAX_CHANGES", "ConfigChange", "config_changes"]

MAX_CHANGES = 20
_ABSENT = "absent"
_SUBNET = re.compile(r"^subnet[46]\[(\d+)\](.*)$")
_TOP = {
    "valid-lifetime": "lifetimes.valid",
    "renew-timer": "lifetimes.renew",
    "rebind-timer": "lifetimes.rebind",
    "preferred-lifetime": "lifetimes.preferred",
    "interfaces-config.interfaces": "interfaces",
}


def _leaves(want: Any, have: Any, path: str, out: list[tuple[str, Any, Any]], limit: int) -> None:
    if len(out) >= limit or want == have:
        return
    if isinstance(want, dict) and isinstance(have, dict):
        for key in [*want, *(k for k in have if k not in want)]:
            child = f"{path}.{key}" if path else str(key)
            _leaves(want.get(key, _ABSENT), have.get(key, _ABSENT), child, out, limit)
        return
    # Lists of scalars are one value (interfaces, flags); lists of objects go by index.
    if (
        isinstance(want, list)
        and isinstance(have, list)
        and any(isinstance(v, (dict, list)) for v in [*want, *have])
    ):
        for index in range(max(len(want), len(have))):
            _leaves(
                want[index] if index < len(want) else _ABSENT,
                have[index] if index < len(have) else _ABSENT,
                f"{path}[{index}]",
                out,
                limit,
            )
        return
    out.append((path, want, have))


def _document_path(
    section: DhcpSection | None, family: int, reference: JSONObject, kea_path: str
) -> str:
    """The document path a Kea path comes from, else the Kea path under `config`."""
    fallback = f"spec.dhcp.dhcp{family}.config[Dhcp{family}.{kea_path}]"
    if section is None:
        return fallback
    if kea_path in _TOP:
        return f"spec.dhcp.{_TOP[kea_path]}"
    if kea_path.startswith("option-data"):
        return "spec.dhcp.options"
    match = _SUBNET.match(kea_path)
    if match is None:
        return fallback
    subnets = reference.get(f"subnet{family}") or []
    position, rest = int(match.group(1)), match.group(2)
    if position >= len(subnets) or not isinstance(subnets[position], dict):
        return fallback
    kea_id = subnets[position].get("id")
    index = next(
        (
            i
            for i, subnet in enumerate(section.subnets)
            if subnet.family == family and section.subnet_id(i) == kea_id
        ),
        None,
    )
    if index is None:
        return fallback
    base = f"spec.dhcp.subnets[{index}]"
    pool = re.match(r"^\.pools\[(\d+)\]\.pool$", rest)
    if pool:
        return f"{base}.pools[{pool.group(1)}]"
    reservation = re.match(r"^\.reservations\[(\d+)\]\.(hw-address|duid|hostname)$", rest)
    if reservation:
        return f"{base}.reservations[{reservation.group(1)}].{reservation.group(2)}"
    reserved = re.match(r"^\.reservations\[(\d+)\]\.ip-address(?:es)?(?:\[\d+\])?$", rest)
    if reserved:
        return f"{base}.reservations[{reserved.group(1)}].ip-address"
    if rest.startswith(".option-data"):
        return f"{base}.options"
    if rest in (".subnet", ".valid-lifetime", ".interface"):
        return f"{base}{rest}"
    return fallback


class ConfigChange(TypedDict):
    """One value of Kea's running body that differs from what trueup set."""

    path: str  # the document's path when it names one, else Kea's
    desired: Any
    observed: Any


def config_changes(
    reference: JSONObject,
    running: JSONObject,
    family: int,
    section: DhcpSection | None,
    limit: int = MAX_CHANGES,
) -> list[ConfigChange]:
    """`[{"path", "desired", "observed"}]`: each value of Kea's running body (`Dhcp4`'s
    contents) that differs from `reference`, the body Kea answered when trueup set it."""
    found: list[tuple[str, Any, Any]] = []
    _leaves(reference, running, "", found, limit)
    return [
        {"path": _document_path(section, family, reference, kea_path), "desired": w, "observed": h}
        for kea_path, w, h in found
    ]
