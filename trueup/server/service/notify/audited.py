"""The security-relevant fields of notification targets and allowlists, in one place.

Routing writes these into the audit entries that create a target or set an
allowlist (`notify.target.create`, `notify.allowlist.set`), so that whoever
compares the live rows with the audit log (audit verification) reads the same
list: a field that changes where webhooks go, or what they carry, is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trueup.model.jsontypes import JSONObject

__all__ = ["ALLOWLIST_AUDITED_FIELDS", "TARGET_AUDITED_FIELDS", "audited"]

# notify_targets columns: where the webhook goes, and which sealed secrets it carries.
TARGET_AUDITED_FIELDS = (
    "name",
    "url",
    "secret_id",
    "auth_header_name",
    "auth_header_secret_id",
)
# notify_allowlists columns: the internal receivers the tenant's targets may reach.
ALLOWLIST_AUDITED_FIELDS = ("entries",)


def audited(values: Mapping[str, Any], fields: tuple[str, ...]) -> JSONObject:
    """The audited fields of a row's values (a field not given is recorded as None): the
    columns the lists above name, as the audit entry records them in JSON."""
    return {name: values.get(name) for name in fields}
