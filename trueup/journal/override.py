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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trueup.journal.atomic import StateFileError, fsync_dir, read_json, write_json

__all__ = [
    "OVERRIDE_FILE",
    "ManagementFacts",
    "ManagementOverride",
    "ReplacedFacts",
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


@dataclass(frozen=True)
class ManagementFacts:
    """The management facts: interface, addresses, gateway."""

    interface: str
    addresses: tuple[str, ...]
    gateway: str | None = None

    @classmethod
    def from_json(cls, body: Any) -> ManagementFacts:
        """The facts of a JSON object holding interface, addresses and (optionally) gateway."""
        return cls(
            interface=body.get("interface"),
            addresses=tuple(body.get("addresses") or ()),
            gateway=body.get("gateway"),
        )

    def to_json(self) -> dict[str, object]:
        """The facts as files and documents hold them."""
        return {
            "interface": self.interface,
            "addresses": list(self.addresses),
            "gateway": self.gateway,
        }


@dataclass(frozen=True)
class ReplacedFacts:
    """The management facts an override replaced, and where they came from."""

    source: str | None
    facts: ManagementFacts

    @classmethod
    def from_json(cls, body: Any) -> ReplacedFacts:
        return cls(source=body.get("source"), facts=ManagementFacts.from_json(body))

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, **self.facts.to_json()}


_OWN_KEYS = (
    "interface",
    "addresses",
    "gateway",
    "set_at",
    "actor",
    "reason",
    "writer_lock",
    "replaced",
)


@dataclass(frozen=True)
class ManagementOverride:
    """`management-override.json`: management facts set by hand, who set them, and why."""

    facts: ManagementFacts
    set_at: str | None = None
    actor: str | None = None
    reason: str | None = None
    writer_lock: str | None = None
    replaced: ReplacedFacts | None = None
    extra: dict[str, object] = field(default_factory=dict)  # a newer agent's fields, kept

    @classmethod
    def from_json(cls, body: Any) -> ManagementOverride:
        """The override a valid JSON body holds; raises ValueError naming what is wrong."""
        problem = _problem(body)
        if problem is not None:
            raise ValueError(problem)
        replaced = body.get("replaced")
        return cls(
            facts=ManagementFacts.from_json(body),
            set_at=body.get("set_at"),
            actor=body.get("actor"),
            reason=body.get("reason"),
            writer_lock=body.get("writer_lock"),
            replaced=ReplacedFacts.from_json(replaced) if isinstance(replaced, dict) else None,
            extra={k: v for k, v in body.items() if k not in _OWN_KEYS},
        )

    def to_json(self) -> dict[str, object]:
        """The override as its file holds it."""
        return {
            **self.facts.to_json(),
            "set_at": self.set_at,
            "actor": self.actor,
            "reason": self.reason,
            "writer_lock": self.writer_lock,
            "replaced": self.replaced.to_json() if self.replaced is not None else None,
            **self.extra,
        }


def override_facts(record: ManagementOverride) -> ManagementFacts:
    """The management facts of an override record: interface, addresses, gateway."""
    return record.facts


def same_facts(a: ManagementFacts, b: ManagementFacts) -> bool:
    """Whether two sets of management facts name the same interface, addresses and gateway."""
    return (
        a.interface == b.interface
        and sorted(a.addresses) == sorted(b.addresses)
        and a.gateway == b.gateway
    )


def read_override(root: Path) -> ManagementOverride | None:
    """The override record; None when there is none.

    Raises `StateFileError` naming the file when it exists but is not a
    usable override (torn, edited, not UTF-8).
    """
    path = Path(root) / OVERRIDE_FILE
    record = read_json(path)
    if record is None:
        return None
    try:
        return ManagementOverride.from_json(record)
    except ValueError as exc:
        raise StateFileError(path, str(exc)) from None


def write_override(root: Path, record: ManagementOverride) -> None:
    """Replace the override atomically and durably; raises OSError naming the file."""
    body = record.to_json()
    problem = _problem(body)
    if problem is not None:
        raise ValueError(f"management override: {problem}")
    write_json(Path(root) / OVERRIDE_FILE, body)


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
