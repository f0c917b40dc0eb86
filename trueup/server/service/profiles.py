"""Profiles: partial device documents with typed variables and a selector, versioned.

Every write adds a row: version 1 creates a profile, each update adds the
next version, a delete adds a version marked deleted (its document the last
one's), so every version stays readable (`history`, `show(version=N)`). Writes
carry the version they replace, like desired revisions: `If-Match: 0` creates
(Conflict when the profile exists), `If-Match: N` updates or deletes version N
(Conflict when it is not the newest). A deleted profile can be created again;
its versions continue the same numbering.

Storing a profile changes no device: devices get a new desired revision only
when a plan is published (service/planner.py), so a change can be planned
first. Deleting a profile that devices were rendered from is therefore allowed;
`trueup fleet plan` shows what the devices lose, and publishing it applies that.

Each write is audited (`profile.create`, `profile.update`, `profile.delete`)
with the version, its digest and who wrote it; `audit verify` compares every
stored version with its entry (coverchecks.py).
"""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, func, select
from sqlalchemy.exc import IntegrityError

from trueup.model.digests import json_digest
from trueup.model.jsontypes import JSONObject
from trueup.model.layering import Profile, ProfileError, parse_profile
from trueup.server.limits import TEXT_LENGTH
from trueup.server.service.errors import Conflict, Invalid, NotFound, Tampered
from trueup.server.service.records import ProfileSummary
from trueup.server.service.store import Store
from trueup.server.tables import profiles

__all__ = ["ProfileVersion", "Profiles", "profile_problems"]


@dataclass(frozen=True)
class ProfileVersion:
    """One stored version of a profile."""

    name: str
    version: int
    digest: str
    created_by: str
    created_at: float
    comment: str
    deleted: bool
    document: JSONObject  # the profile as its author wrote it (parse_profile checks it)

    def summary(self) -> ProfileSummary:
        return {
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "comment": self.comment,
            "deleted": self.deleted,
        }

    def profile(self) -> Profile:
        """The stored document parsed again (it was valid when stored), with its version."""
        return parse_profile(self.document, source=f"profile {self.name}", version=self.version)


def _version(row: RowMapping) -> ProfileVersion:
    return ProfileVersion(
        name=row["name"],
        version=row["version"],
        digest=row["digest"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        comment=row["comment"],
        deleted=bool(row["deleted"]),
        document=json.loads(row["document"]),
    )


def profile_problems(
    data: Any, *, name: str | None = None
) -> tuple[Profile | None, builtins.list[str]]:
    """`data` parsed as a profile (and its metadata.name checked against `name`), or every
    problem naming its path."""
    source = f"profile {name}" if name else "profile"
    try:
        profile = parse_profile(data, source=source)
    except ProfileError as exc:
        return None, list(exc.problems)
    if name is not None and profile.name != name:
        return None, [
            f"metadata.name: {profile.name!r} does not match the profile in the URL ({name!r})"
        ]
    return profile, []


class Profiles:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- reads --------------------------------------------------------------------------------

    @staticmethod
    def _newest(conn: Connection, tenant_id: int, name: str) -> RowMapping | None:
        return (
            conn.execute(
                select(profiles)
                .where(and_(profiles.c.tenant_id == tenant_id, profiles.c.name == name))
                .order_by(profiles.c.version.desc())
                .limit(1)
            )
            .mappings()
            .one_or_none()
        )

    def show(self, tenant_id: int, name: str, version: int | None = None) -> ProfileVersion:
        """The profile's newest version (NotFound once deleted), or version `version`."""
        with self.store.db.read() as conn:
            if version is None:
                row = self._newest(conn, tenant_id, name)
                if row is None or row["deleted"]:
                    raise NotFound(f"profile {name!r} not found")
            else:
                row = (
                    conn.execute(
                        select(profiles).where(
                            and_(
                                profiles.c.tenant_id == tenant_id,
                                profiles.c.name == name,
                                profiles.c.version == version,
                            )
                        )
                    )
                    .mappings()
                    .one_or_none()
                )
                if row is None:
                    raise NotFound(f"profile {name!r} has no version {version}")
        return _version(row)

    def history(self, tenant_id: int, name: str) -> builtins.list[ProfileVersion]:
        """Every version of the profile, oldest first (deletions included)."""
        with self.store.db.read() as conn:
            rows = list(
                conn.execute(
                    select(profiles)
                    .where(and_(profiles.c.tenant_id == tenant_id, profiles.c.name == name))
                    .order_by(profiles.c.version)
                ).mappings()
            )
        if not rows:
            raise NotFound(f"profile {name!r} not found")
        return [_version(r) for r in rows]

    def list(self, tenant_id: int) -> builtins.list[ProfileVersion]:
        """The newest version of every profile not deleted, by name."""
        with self.store.db.read() as conn:
            return self.current_in(conn, tenant_id)

    def current_in(self, conn: Connection, tenant_id: int) -> builtins.list[ProfileVersion]:
        newest = (
            select(profiles.c.name, func.max(profiles.c.version).label("version"))
            .where(profiles.c.tenant_id == tenant_id)
            .group_by(profiles.c.name)
            .subquery()
        )
        rows = conn.execute(
            select(profiles)
            .join(
                newest,
                and_(profiles.c.name == newest.c.name, profiles.c.version == newest.c.version),
            )
            .where(and_(profiles.c.tenant_id == tenant_id, profiles.c.deleted == 0))
            .order_by(profiles.c.name)
        ).mappings()
        return [_version(r) for r in rows]

    def last_version_in(self, conn: Connection, tenant_id: int, name: str) -> int:
        """The newest stored version of `name`, deleted or not (0: never stored): a new
        version of it is this plus one."""
        row = self._newest(conn, tenant_id, name)
        return int(row["version"]) if row is not None else 0

    def vouched_in(self, conn: Connection, tenant_id: int) -> builtins.list[ProfileVersion]:
        """The current profiles, each checked against the audit log: its version is the
        newest audited one of its name, with the audited digest, and its document hashes to
        it; no audited live profile is missing; the chain holds after them. Raises Tampered
        naming the profile otherwise: a plan is never rendered from what the log does not
        vouch for (an edited row would reach every device it selects)."""
        current = self.current_in(conn, tenant_id)
        facts = self.store.covered(conn)
        audited: dict[str, tuple[int, bool, int]] = {}
        for (tenant, name, version), fact in facts.profiles.items():
            if tenant == tenant_id and version > audited.get(name, (0, False, 0))[0]:
                audited[name] = (version, fact.deleted, fact.seq)
        verify = "; not used (run `trueup server audit verify`)"
        for stored in current:
            vouched = facts.profiles.get((tenant_id, stored.name, stored.version))
            what = f"profile {stored.name} version {stored.version}"
            if vouched is None:
                raise Tampered(f"{what} has no audit entry{verify}")
            if vouched.digest != stored.digest or json_digest(stored.document) != vouched.digest:
                raise Tampered(f"{what}: its document differs from the audited one{verify}")
            newest = audited[stored.name][0]
            if newest > stored.version:
                raise Tampered(
                    f"{what}: the audit log's newest version is {newest}: rolled back "
                    f"behind the server's back{verify}"
                )
        live = {v.name for v in current}
        for name, (version, deleted, _seq) in sorted(audited.items()):
            if not deleted and name not in live:
                raise Tampered(f"profile {name} version {version} is audited but missing{verify}")
        if audited:
            broken = self.store.audit_break_after(min(seq for _, _, seq in audited.values()))
            if broken is not None:
                raise Tampered(
                    f"the audit log does not hold together at seq={broken}, after profiles "
                    f"were audited: a newer version may have been removed{verify}"
                )
        return current

    def current(self, tenant_id: int) -> builtins.list[Profile]:
        """The tenant's profiles as the renderer takes them (each with its version)."""
        return [v.profile() for v in self.list(tenant_id)]

    # -- writes -------------------------------------------------------------------------------

    def create(self, tenant_id: int, data: Any, *, actor: str, comment: str = "") -> ProfileVersion:
        """Store a new profile (its metadata.name must not name one that exists)."""
        profile, problems = profile_problems(data)
        if profile is None:
            raise Invalid(problems)
        return self._write(tenant_id, profile, 0, actor=actor, comment=comment)

    def put(
        self,
        tenant_id: int,
        name: str,
        expected_version: int,
        data: Any,
        *,
        actor: str,
        comment: str = "",
    ) -> ProfileVersion:
        """Create (expected_version 0) or update the profile `name` at `expected_version`.

        Raises Invalid (every problem naming its path; nothing stored), Conflict, NotFound.
        """
        profile, problems = profile_problems(data, name=name)
        if profile is None:
            raise Invalid(problems)
        return self._write(tenant_id, profile, expected_version, actor=actor, comment=comment)

    def update(
        self,
        tenant_id: int,
        name: str,
        expected_version: int,
        data: Any,
        *,
        actor: str,
        comment: str = "",
    ) -> ProfileVersion:
        """Store the next version of an existing profile (`expected_version` ≥ 1)."""
        if expected_version < 1:
            raise Invalid(["If-Match: an update names the version it replaces (1 or more)"])
        return self.put(tenant_id, name, expected_version, data, actor=actor, comment=comment)

    def delete(
        self, tenant_id: int, name: str, expected_version: int, *, actor: str, comment: str = ""
    ) -> ProfileVersion:
        """Mark the profile deleted (a new version; every earlier one stays readable)."""
        _check_comment(comment)
        with self.store.write() as conn:
            row = self._newest(conn, tenant_id, name)
            if row is None or row["deleted"]:
                raise NotFound(f"profile {name!r} not found")
            if row["version"] != expected_version:
                raise Conflict(name, expected_version, int(row["version"]), kind="profile")
            return self._insert(
                conn,
                tenant_id,
                name=name,
                version=int(row["version"]) + 1,
                document=json.loads(row["document"]),
                digest=row["digest"],
                actor=actor,
                comment=comment,
                deleted=True,
                action="profile.delete",
            )

    def _write(
        self, tenant_id: int, profile: Profile, expected: int, *, actor: str, comment: str
    ) -> ProfileVersion:
        _check_comment(comment)
        with self.store.write() as conn:
            row = self._newest(conn, tenant_id, profile.name)
            live = row is not None and not row["deleted"]
            current = int(row["version"]) if live and row is not None else 0
            if expected == 0 and live:
                raise Conflict(profile.name, 0, current, kind="profile")
            if expected != 0 and not live:
                raise NotFound(f"profile {profile.name!r} not found")
            if expected != current:
                raise Conflict(profile.name, expected, current, kind="profile")
            last = int(row["version"]) if row is not None else 0
            return self._insert(
                conn,
                tenant_id,
                name=profile.name,
                version=last + 1,
                document=dict(profile.as_json()),
                digest=profile.digest,
                actor=actor,
                comment=comment,
                deleted=False,
                action="profile.update" if live else "profile.create",
            )

    def _insert(
        self,
        conn: Connection,
        tenant_id: int,
        *,
        name: str,
        version: int,
        document: JSONObject,
        digest: str,
        actor: str,
        comment: str,
        deleted: bool,
        action: str,
    ) -> ProfileVersion:
        now = time.time()
        try:
            conn.execute(
                profiles.insert().values(
                    tenant_id=tenant_id,
                    name=name,
                    version=version,
                    document=json.dumps(document, sort_keys=True),
                    digest=digest,
                    created_by=actor,
                    created_at=now,
                    comment=comment,
                    deleted=1 if deleted else 0,
                )
            )
        except IntegrityError:  # another writer stored this version first
            raise Conflict(name, version - 1, version, kind="profile") from None
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action=action,
            target=f"profile:{name}",
            detail={
                "name": name,
                "version": version,
                "digest": digest,
                "deleted": deleted,
                "comment": comment,
            },
            at=now,
        )
        return ProfileVersion(
            name=name,
            version=version,
            digest=digest,
            created_by=actor,
            created_at=now,
            comment=comment,
            deleted=deleted,
            document=document,
        )


def _check_comment(comment: str) -> None:
    if len(comment) > TEXT_LENGTH:
        raise Invalid([f"comment: longer than {TEXT_LENGTH} characters"])
