"""What routes answer besides success, as OpenAPI `responses=`, and the bounded path parameters.

Every status a route can return is documented with the body it carries
(`answers(…)`): the error bodies are `{"detail": …}`, 422 adds `problems`
(one `path: message` each), 409 is the concurrent-modification body. Path
parameters are bounded like the columns they are looked up in.
"""

from __future__ import annotations

from trueup.model.jsontypes import JSONObject
from trueup.server.inputs import DevicePath, IdPath, NamePath

__all__ = ["DEVICE", "NAME_PARAM", "TOKEN_ID", "USER", "answers"]

# The bodies below are JSON Schema and the answers OpenAPI response objects, the shapes
# FastAPI's `responses=` takes (JSONObject: those standards', not trueup's).

# Path parameters, as the input layer declares them (trueup.server.inputs).
DEVICE = DevicePath
USER = NamePath
NAME_PARAM = NamePath
TOKEN_ID = IdPath

_DETAIL: JSONObject = {
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"type": "string"}},
}
_PROBLEMS: JSONObject = {
    "type": "object",
    "required": ["detail", "problems"],
    "properties": {
        "detail": {"type": "string"},
        "problems": {"type": "array", "items": {"type": "string"}},
    },
}


_REFUSED_NOW = {
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {"type": "string"},
        "reason": {"type": "string"},
        "devices": {"type": "array", "items": {"type": "string"}},
        "rollout": {"type": "integer"},
        "rollout_state": {"type": "string"},
    },
}


_REFUSED_NOW_TEXT = (
    "refused in the current state, nothing changed: a stale version, devices a rollout "
    "holds, an action the rollout's state does not take, or a plan that changed since it "
    "was shown (`detail` says which)"
)


def _conflict(kind: str) -> JSONObject:
    """The 409 body naming the device (or the profile) whose version was stale; for
    `kind` "state", any refusal of what the current state does not allow: a stale
    version, devices a rollout holds, an action the rollout's state does not take, a
    plan that changed since it was shown (`detail` says which)."""
    if kind == "state":
        return _REFUSED_NOW
    return {
        "type": "object",
        "required": ["reason", "detail", kind, "expected_version", "current_version", "action"],
        "properties": {
            "reason": {"type": "string", "enum": ["STATE_CONCURRENT_MODIFICATION"]},
            "detail": {"type": "string"},
            kind: {"type": "string"},
            "expected_version": {"type": "integer"},
            "current_version": {"type": "integer"},
            "action": {"type": "string"},
        },
    }


_CONFLICT = _conflict("device")

_ANSWERS: dict[int, tuple[str, JSONObject]] = {
    400: ("the request cannot be read (e.g. a body that is not UTF-8)", _DETAIL),
    401: ("no token, or a token that is unknown, revoked, expired or used", _DETAIL),
    403: ("the token does not have the role this route needs", _DETAIL),
    404: ("not found in the caller's tenant", _DETAIL),
    409: ("If-Match is stale: STATE_CONCURRENT_MODIFICATION, nothing changed", _CONFLICT),
    413: ("the request body is larger than this route takes", _DETAIL),
    422: ("invalid input, each problem with its path; nothing was changed", _PROBLEMS),
    428: ("If-Match is required", _DETAIL),
}
_EVERY_ROUTE = (400, 401, 403, 413, 422)


def answers(
    *codes: int, token: bool = True, conflict: str = "device"
) -> dict[int | str, JSONObject]:
    """OpenAPI `responses=`: `codes`, and for a route taking a token those every one has;
    a 409 body names the `conflict` kind (device or profile) whose version was stale."""
    common = _EVERY_ROUTE if token else ()
    return {
        code: {
            "description": _REFUSED_NOW_TEXT
            if code == 409 and conflict == "state"
            else _ANSWERS[code][0],
            "content": {
                "application/json": {
                    "schema": _conflict(conflict) if code == 409 else _ANSWERS[code][1]
                }
            },
        }
        for code in sorted({*codes, *common})
    }
