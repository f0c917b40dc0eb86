"""The service's error vocabulary, and the name rules every unit checks input against.

The HTTP API maps each error to one status code (app.py); the CLI prints it::

    ServiceError
    ├── NotFound        the named thing does not exist in this tenant      404
    ├── Invalid         bad input; `problems` names each path              422
    ├── Conflict        If-Match was stale (STATE_CONCURRENT_MODIFICATION) 409
    ├── Busy            a device is in an unfinished rollout                 409
    ├── WrongState      an action its object's state does not allow          409
    ├── Tampered        stored data contradicts the audit log: not served  409
    └── Unauthorized    a token that is unknown, revoked, expired or used  401
"""

from __future__ import annotations

import re
from typing import Literal, NotRequired, TypedDict

from trueup.model.reasons import CORRECTIVE_ACTIONS, ReasonCode

__all__ = [
    "Busy",
    "BusyBody",
    "Conflict",
    "ConflictBody",
    "Invalid",
    "NotFound",
    "ServiceError",
    "Tampered",
    "Unauthorized",
    "WrongState",
    "check_name",
    "device_name_problems",
]

_NAME_PATTERN = "letters, digits, '_', '.', '-' (1-200 characters, starting with a letter or digit)"


class ServiceError(Exception):
    pass


class ConflictBody(TypedDict):
    """A 409 for a stale If-Match: the device (or the profile) and both versions."""

    reason: str
    detail: str
    device: NotRequired[str]
    profile: NotRequired[str]
    expected_version: int
    current_version: int
    action: str


class BusyBody(TypedDict):
    """A 409 for devices an unfinished rollout holds."""

    reason: str
    detail: str
    devices: list[str]
    rollout: int
    rollout_state: str


class NotFound(ServiceError):
    pass


class Invalid(ServiceError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class Conflict(ServiceError):
    """If-Match named another version than the current one of a device (or of a
    profile, a device's inputs: `kind`); the body names it under that kind."""

    def __init__(
        self,
        device: str,
        expected: int,
        current: int,
        *,
        kind: Literal["device", "profile"] = "device",
        what: str | None = None,
    ) -> None:
        self.device = device
        self.expected = expected
        self.current = current
        self.kind = kind
        subject = what or f"{kind} {device}"
        super().__init__(
            f"{ReasonCode.CONCURRENT_MODIFICATION}: {subject} is at version {current}, "
            f"not {expected}; nothing was changed"
        )

    def body(self) -> ConflictBody:
        reason = ReasonCode.CONCURRENT_MODIFICATION
        if self.kind == "profile":  # the same keys, in the same order, the subject's named
            return {
                "reason": reason.value,
                "detail": str(self),
                "profile": self.device,
                "expected_version": self.expected,
                "current_version": self.current,
                "action": CORRECTIVE_ACTIONS[reason],
            }
        return {
            "reason": reason.value,
            "detail": str(self),
            "device": self.device,
            "expected_version": self.expected,
            "current_version": self.current,
            "action": CORRECTIVE_ACTIONS[reason],
        }


class Busy(ServiceError):
    """A change to devices that an unfinished rollout holds: refused, never queued."""

    def __init__(self, devices: list[str], rollout_id: int, state: str) -> None:
        self.devices = devices
        self.rollout_id = rollout_id
        self.state = state
        shown = ", ".join(devices[:5]) + (
            f" and {len(devices) - 5} more" if len(devices) > 5 else ""
        )
        super().__init__(
            f"{ReasonCode.CONCURRENT_MODIFICATION}: {shown} "
            f"{'is' if len(devices) == 1 else 'are'} in rollout {rollout_id} ({state}); "
            f"nothing was changed (wait for it to complete, or abort it: "
            f"`trueup fleet rollout abort {rollout_id}`)"
        )

    def body(self) -> BusyBody:
        return {
            "reason": ReasonCode.CONCURRENT_MODIFICATION.value,
            "detail": str(self),
            "devices": self.devices,
            "rollout": self.rollout_id,
            "rollout_state": self.state,
        }


class WrongState(ServiceError):
    """An action the object's current state does not allow (approve a running rollout)."""


class Unauthorized(ServiceError):
    pass


class Tampered(ServiceError):
    """What would be served (an evidence bundle) differs from what the audit log recorded."""


def check_name(kind: str, value: str) -> None:
    """Tenant, user and secret names. Raises Invalid naming `kind`."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}", value or ""):
        raise Invalid([f"{kind}: {value!r} is not a valid name ({_NAME_PATTERN})"])


def device_name_problems(name: str) -> list[str]:
    # Device names may be longer (up to 253, a DNS name's length); the message is the same.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}", name or ""):
        return [f"name: {name!r} is not a valid device name ({_NAME_PATTERN})"]
    return []
