"""The console's management override (`management-override.json`): facts set by hand, kept.

Who calls this: `trueup management set` writes it after putting the
management facts on the kernel itself (the agent stopped, hung or
crash-looping); the startup orchestrator brings management up from it first;
the engine lays it over the applied revision (so no heal or recovery takes
the operator's address away) and clears it once a committed revision carries
the same facts; status reports it as version skew until then.

```
{"interface": "mgmt0", "addresses": ["198.51.100.2/24"], "gateway": "198.51.100.1" | null,
 "set_at": ISO, "actor": "console:0", "reason": TEXT, "writer_lock": "held" | "bypassed: …",
 "replaced": {"source": …, "interface": …, "addresses": […], "gateway": …}}
```

Standard library only (besides the atomic write): the fast boot path may
read it before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path
from typing import Any

from trueup.journal.atomic import StateFileError, fsync_dir, read_json, write_json

__all__ = [
    "OVERRIDE_FILE",
    "clear_override",
    "override_facts",
    "read_override",
    "same_facts",
    "write_override",
]

OVERRIDE_FILE = "management-override.json"


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "not a management override"
    interface = record.get("interface")
    if not isinstance(interface, str) or not 0 < len(interface) < 16 or "/" in interface:
        return "interface: not an interface name"
    addresses = record.get("addresses")
    if not isinstance(addresses, list) or not addresses:
        return "addresses: not a non-empty list"
    try:
        for prefix in addresses:
            if not isinstance(prefix, str) or "/" not in prefix:
                return f"addresses: {prefix!r} is not an address/prefix"
            ipaddress.ip_interface(prefix)
        gateway = record.get("gateway")
        if gateway is not None and not isinstance(gateway, str):
            return "gateway: not an address"
        if gateway is not None:
            ipaddress.ip_address(gateway)
    except ValueError as exc:
        return str(exc)
    return None


def override_facts(record: dict[str, Any]) -> dict[str, Any]:
    """The management facts of an override record: interface, addresses, gateway."""
    return {
        "interface": record["interface"],
        "addresses": list(record["addresses"]),
        "gateway": record.get("gateway"),
    }


def same_facts(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two sets of management facts name the same interface, addresses and gateway."""
    return (
        a.get("interface") == b.get("interface")
        and sorted(a.get("addresses") or []) == sorted(b.get("addresses") or [])
        and a.get("gateway") == b.get("gateway")
    )


def read_override(root: Path) -> dict[str, Any] | None:
    """The override record; None when there is none.

    Raises `StateFileError` naming the file when it exists but is not a
    usable override (torn, edited, not UTF-8).
    """
    path = Path(root) / OVERRIDE_FILE
    record = read_json(path)
    if record is None:
        return None
    problem = _problem(record)
    if problem is not None:
        raise StateFileError(path, problem)
    return dict(record)


def write_override(root: Path, record: dict[str, Any]) -> None:
    """Replace the override atomically and durably; raises OSError naming the file."""
    problem = _problem(record)
    if problem is not None:
        raise ValueError(f"management override: {problem}")
    write_json(Path(root) / OVERRIDE_FILE, record)


def clear_override(root: Path) -> bool:
    """Remove the override; True when there was one."""
    path = Path(root) / OVERRIDE_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):
        fsync_dir(path.parent)
    return True
