"""The one name for a JSON object whose shape is not trueup's.

Records trueup defines carry their own types (dataclasses, pydantic models,
enums). What remains is the edge: a body parsed from the wire or a file and
handed on unread (a desired-state document before validation, a webhook's
payload, a daemon's configuration as the daemon wants it). Those are
`JSONObject`; a `dict[str, Any]` anywhere else is a record still waiting for
its type.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JSONObject"]

JSONObject: TypeAlias = dict[str, Any]
