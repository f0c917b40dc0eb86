"""A device's rendering inputs: its variable values and its own layer, versioned.

The own layer is a partial `spec` applied after every profile (the device's
overrides); a device no profile selects renders from it alone. Writes carry
the version they replace (If-Match; 0 for a device that has none yet) and
are audited as `device.variables` with the digests of both values, which
`audit verify` compares with the stored row (coverchecks.py). Like profiles,
storing inputs changes no desired revision until a plan is published.

A device without a row has no variables and no own layer; the planner then
takes its current desired document as its own layer (a device with only its
own document behaves as before), and publishing writes that row (`adopt`).
A write that leaves the own layer out (`keep_own`) keeps the one the planner uses:
the stored one, or for a device without a row its desired document's spec — so
setting a variable never drops what a device's own document set.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, select, update
from sqlalchemy.exc import IntegrityError

from trueup.model.digests import json_digest
from trueup.model.document import supported_sections
from trueup.model.jsontypes import JSONObject
from trueup.server.service.errors import Conflict, Invalid, Tampered
from trueup.server.service.planio import own_from
from trueup.server.service.records import InputsDetail, InputsSummary
from trueup.server.service.store import Store
from trueup.server.tables import device_inputs, devices, revisions

__all__ = [
    "MAX_VARIABLES",
    "VARIABLE_NAME_PATTERN",
    "DeviceInputRecords",
    "StoredInputs",
    "inputs_problems",
    "own_digest",
]

VARIABLE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
VARIABLE_NAME = re.compile(VARIABLE_NAME_PATTERN)
MAX_VARIABLES = 500


@dataclass(frozen=True)
class StoredInputs:
    """What is stored for one device (version 0: nothing yet)."""

    device: str
    variables: JSONObject  # the operator's values, by variable name
    own: JSONObject | None  # a partial spec (checked when rendered)
    version: int
    updated_by: str | None = None
    updated_at: float | None = None

    def summary(self) -> InputsSummary:
        return {
            "device": self.device,
            "version": self.version,
            "variables": self.variables,
            "own": self.own,
            "updated_by": self.updated_by,
            "updated_at": self.updated_at,
        }


def own_digest(own: Mapping[str, Any] | None) -> str | None:
    return None if own is None else json_digest(dict(own))


def inputs_problems(variables: Any, own: Any) -> list[str]:
    """Why `variables` (name -> JSON value) or `own` (a partial spec, or null) cannot be
    stored; each problem names its path. Types are the profiles' to check, at render time."""
    problems = []
    if not isinstance(variables, Mapping):
        problems.append("variables: expected an object of name: value")
    else:
        if len(variables) > MAX_VARIABLES:
            problems.append(f"variables: more than {MAX_VARIABLES} variables")
        for name, value in variables.items():
            if not isinstance(name, str) or not VARIABLE_NAME.fullmatch(name):
                problems.append(
                    f"variables.{name}: not a variable name (a letter or '_', then letters, "
                    "digits, '_'; at most 63)"
                )
            elif value is None:
                problems.append(f"variables.{name}: null is not a value (remove the variable)")
    if own is not None:
        if not isinstance(own, Mapping):
            problems.append("own: expected a partial spec (an object of sections), or null")
        else:
            known = set(supported_sections())
            for section in own:
                if section not in known:
                    problems.append(
                        f"own.{section}: not a section of a device document (known: "
                        + ", ".join(sorted(known))
                        + ")"
                    )
    return problems


def _stored(device: str, row: RowMapping | None) -> StoredInputs:
    if row is None:
        return StoredInputs(device=device, variables={}, own=None, version=0)
    return StoredInputs(
        device=device,
        variables=json.loads(row["variables"]),
        own=json.loads(row["own"]) if row["own"] is not None else None,
        version=int(row["version"]),
        updated_by=row["updated_by"],
        updated_at=row["updated_at"],
    )


class DeviceInputRecords:
    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, tenant_id: int, device: str) -> StoredInputs:
        """The device's stored inputs (version 0 when it has none). Raises NotFound."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            return _stored(device, self._row(conn, int(row["id"])))

    @staticmethod
    def _row(conn: Connection, device_id: int) -> RowMapping | None:
        return (
            conn.execute(select(device_inputs).where(device_inputs.c.device_id == device_id))
            .mappings()
            .one_or_none()
        )

    def _planned_own(self, conn: Connection, device_id: int) -> JSONObject | None:
        current = self._row(conn, device_id)
        if current is not None:
            return json.loads(current["own"]) if current["own"] is not None else None
        document = (
            conn.execute(
                select(revisions.c.document).where(
                    and_(
                        revisions.c.device_id == device_id,
                        revisions.c.device_id == devices.c.id,
                        revisions.c.version == devices.c.desired_version,
                    )
                )
            )
            .scalars()
            .one_or_none()
        )
        return own_from(json.loads(document)) if document is not None else None

    def has_row(self, conn: Connection, device_id: int) -> bool:
        return self._row(conn, device_id) is not None

    def all_in(self, conn: Connection, tenant_id: int) -> dict[int, StoredInputs]:
        """device id -> stored inputs, for every device of the tenant that has a row, each
        as its newest audited `device.variables` entry has it (Tampered otherwise: a plan
        never renders from inputs the log does not vouch for)."""
        rows = conn.execute(
            select(device_inputs).where(device_inputs.c.tenant_id == tenant_id)
        ).mappings()
        found = {int(r["device_id"]): _stored("", r) for r in rows}
        if not found:
            return found
        facts = self.store.covered(conn)
        verify = "; not used (run `trueup server audit verify`)"
        for device_id, stored in found.items():
            fact = facts.inputs.get(device_id)
            what = f"the variables of device id {device_id}"
            if fact is None:
                raise Tampered(f"{what} have no audit entry{verify}")
            if (
                fact.version != stored.version
                or fact.variables_digest != json_digest(stored.variables)
                or fact.own_digest != own_digest(stored.own)
            ):
                raise Tampered(f"{what} differ from the audited ones (seq={fact.seq}){verify}")
        return found

    def put(
        self,
        tenant_id: int,
        device: str,
        expected_version: int,
        *,
        variables: Any,
        own: Any,
        actor: str,
        keep_own: bool = False,
    ) -> StoredInputs:
        """Replace the device's variables and own layer if they are at `expected_version`;
        with `keep_own`, the own layer stays the one the planner uses now (the stored one;
        without a row, the desired document's spec).

        Raises NotFound, Invalid (each problem with its path; nothing stored) or Conflict.
        """
        problems = inputs_problems(variables, None if keep_own else own)
        if problems:
            raise Invalid(problems)
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            if keep_own:
                own = self._planned_own(conn, int(row["id"]))
            return self.write_in(
                conn,
                tenant_id=tenant_id,
                device_id=int(row["id"]),
                device=device,
                expected_version=expected_version,
                variables=dict(variables),
                own=dict(own) if own is not None else None,
                actor=actor,
            )

    def write_in(
        self,
        conn: Connection,
        *,
        tenant_id: int,
        device_id: int,
        device: str,
        expected_version: int,
        variables: JSONObject,
        own: JSONObject | None,
        actor: str,
        reason: str | None = None,
    ) -> StoredInputs:
        """Store the inputs inside the caller's transaction (compare-and-set, audit entry)."""
        now = time.time()
        current = self._row(conn, device_id)
        version = int(current["version"]) if current is not None else 0
        if version != expected_version:
            raise Conflict(
                device,
                expected_version,
                version,
                what=f"the variables of device {device}",
            )
        values = {
            "variables": json.dumps(variables, sort_keys=True),
            "own": json.dumps(own, sort_keys=True) if own is not None else None,
            "version": version + 1,
            "updated_by": actor,
            "updated_at": now,
        }
        if current is None:
            try:
                conn.execute(
                    device_inputs.insert().values(
                        device_id=device_id, tenant_id=tenant_id, **values
                    )
                )
            except IntegrityError:  # another writer created the row first
                raise Conflict(
                    device, expected_version, 1, what=f"the variables of device {device}"
                ) from None
        else:
            swapped = conn.execute(
                update(device_inputs)
                .where(
                    and_(
                        device_inputs.c.device_id == device_id,
                        device_inputs.c.version == version,
                    )
                )
                .values(**values)
            ).rowcount
            if swapped != 1:
                raise Conflict(
                    device, expected_version, -1, what=f"the variables of device {device}"
                )
        detail: InputsDetail = {
            "device_id": device_id,
            "version": version + 1,
            "variables_digest": json_digest(variables),
            "own_digest": own_digest(own),
            "names": sorted(variables),
        }
        if reason:
            detail["reason"] = reason
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action="device.variables",
            target=f"device:{device}",
            detail=detail,
            at=now,
        )
        return StoredInputs(device, variables, own, version + 1, actor, now)
