"""The fleet plan: what a change would do to every device, before anything is stored.

`Planner.plan(tenant_id, selector=…, change=…)` renders the devices a change
touches — a proposed profile (edit, create or removal), a device's variables or
own layer, a device's labels — from the stored inputs with the change applied
in memory, and compares each rendered document with the device's current
desired revision. Without a change it plans the stored inputs as they are
(what publishing would send now) over every device, or those `selector` picks.

Per device the plan gives one of:

- a target: the rendered document, its digest and provenance, and the paths
  that change (old → new) against the desired revision it was planned against;
- a refusal: the inputs do not render (each problem names the profile, the
  variable and the path), or the agent's last report lists the sections it
  supports and the rendered document uses one it does not (it is never sent);
- unchanged: the rendered document is the desired one.

Compatibility: a device with no stored inputs takes its current desired
document's spec as its own layer, so it renders to exactly that document until
a profile selects it; a device with neither inputs nor a profile selecting it
is not rendered at all (unchanged).

`Planner.publish` stores each target as the device's next desired revision
(its provenance recorded), one transaction per device, each expecting the
version the plan was made against: a device changed since then is refused
(reported), the others are stored. A device without stored inputs gets them in
the same transaction (its previous desired spec as its own layer), so later
profile changes keep applying to it. Rollouts (part of a later change) publish
a plan's targets wave by wave instead.

The units this composes (profiles, device inputs, labels, revisions) are
passed in; it reads the devices, desired revisions and last reports itself,
in one read for the whole tenant.

Why this module is over 400 lines: it is one procedure — load a tenant's
inputs, apply the proposed change, render, compare, publish — whose steps share
the loaded state; and it declares the interfaces (Protocols) of the units it is
given, so that they stay independent of each other and of it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from sqlalchemy import Connection, and_, select

from trueup.model.document import DocumentError, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.layering import (
    DeviceInputs,
    Profile,
    Renderer,
    RenderError,
    Selector,
    diff_documents,
    parse_selector,
)
from trueup.model.layering.types import ProvenanceJSON
from trueup.server.fleet import agent_support
from trueup.server.service.errors import Busy, Conflict, Invalid, NotFound
from trueup.server.service.fleettypes import (
    Change,
    LabelsChange,
    Plan,
    ProfileEdit,
    ProfileRemoval,
    Published,
    Refusal,
    Target,
    VariablesChange,
)
from trueup.server.service.planio import checked_selector, own_from
from trueup.server.service.store import Store
from trueup.server.tables import device_state, devices, revisions

__all__ = ["Planner"]


class _StoredProfile(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int: ...

    def profile(self) -> Profile: ...


class _ProfileSource(Protocol):
    def vouched_in(self, conn: Connection, tenant_id: int) -> Sequence[_StoredProfile]: ...

    def last_version_in(self, conn: Connection, tenant_id: int, name: str) -> int: ...


class _Inputs(Protocol):
    @property
    def variables(self) -> JSONObject: ...  # the operator's values, by variable name

    @property
    def own(self) -> JSONObject | None: ...  # a partial spec, checked when rendered

    @property
    def version(self) -> int: ...


class _InputSource(Protocol):
    def all_in(self, conn: Connection, tenant_id: int) -> Mapping[int, _Inputs]: ...

    def has_row(self, conn: Connection, device_id: int) -> bool: ...

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
    ) -> Any: ...


class _LabelSource(Protocol):
    def devices_matching(
        self, tenant_id: int, selector: Selector
    ) -> Sequence[tuple[int, str, Mapping[str, str]]]: ...


class _RevisionWriter(Protocol):
    def insert_revision(
        self,
        conn: Connection,
        *,
        tenant_id: int,
        device_id: int,
        device: str,
        expected_version: int,
        document: Any,
        author: str,
        comment: str = "",
        provenance: ProvenanceJSON | None = None,
        confirm_within: int | None = None,
        at: float | None = None,
    ) -> Any: ...


@dataclass
class _Device:
    device_id: int
    name: str
    desired_version: int
    desired_text: str | None  # the desired revision's document, as stored
    desired_hash: str | None
    report_text: str | None  # the agent's last report, as stored
    labels: dict[str, str]
    inputs: _Inputs | None

    # Parsed only for the devices a plan renders (a one-variable change renders one).
    @cached_property
    def desired(self) -> JSONObject | None:  # the stored document
        return dict(json.loads(self.desired_text)) if self.desired_text else None

    @cached_property
    def report(self) -> JSONObject | None:  # as the agent sent it
        if not self.report_text:
            return None
        try:
            loaded = json.loads(self.report_text)
        except ValueError:
            return None
        return loaded if isinstance(loaded, dict) else None


def _without_version(document: Mapping[str, Any] | None) -> JSONObject | None:
    if document is None:
        return None
    body = json.loads(json.dumps(document))
    if isinstance(body.get("metadata"), dict):
        body["metadata"].pop("version", None)
    return dict(body)


@functools.cache
def _default_sections() -> JSONObject:
    """Each section's value in a document that does not name it (the model's defaults)."""
    minimal = {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "d"},
        "spec": {"management": {"interface": "mgmt0", "addresses": ["192.0.2.1/24"]}},
    }
    spec = dict(parse_document(minimal).canonical()["spec"])
    return {k: v for k, v in spec.items() if k != "management"}


def used_sections(document: Mapping[str, Any]) -> JSONObject:
    """`document` with only the sections it uses: a rendered document is canonical (every
    section, defaults filled in), and an agent that lacks a section the document leaves
    at its default can still apply it."""
    defaults = _default_sections()
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        return dict(document)
    used = {k: v for k, v in spec.items() if k not in defaults or v != defaults[k]}
    return {**document, "spec": used}


class Planner:
    def __init__(
        self,
        store: Store,
        *,
        profiles: _ProfileSource,
        inputs: _InputSource,
        labels: _LabelSource | None,
        revisions: _RevisionWriter,
        busy: Callable[[int], Mapping[int, tuple[int, str]]] | None = None,
    ) -> None:
        self.store = store
        self.profiles = profiles
        self.inputs = inputs
        self.labels = labels
        self.revisions = revisions
        # Devices a running rollout holds -> (rollout id, state): refused here, kind "busy",
        # naming the rollout; none when not given.
        self.busy = busy
        # The same, inside a publish's write (the device's row locked): a rollout that took
        # the device after the plan was made is seen. Raises Busy; set by the ControlPlane.
        self.refuse_busy: Callable[[Connection, int, str], None] | None = None

    # -- planning -----------------------------------------------------------------------------

    def plan(
        self,
        tenant_id: int,
        *,
        selector: Selector | str | None = None,
        change: Change | None = None,
    ) -> Plan:
        """Render the devices `change` touches (every device without one; only those
        `selector` picks when given) and compare each with its desired revision."""
        if isinstance(selector, str):
            selector = checked_selector(selector)
        labelled = (
            {
                int(device_id): dict(labels)
                for device_id, _name, labels in self.labels.devices_matching(
                    tenant_id, parse_selector("")
                )
            }
            if self.labels is not None
            else {}
        )
        with self.store.db.read() as conn:
            stored = [(p.name, p.profile()) for p in self.profiles.vouched_in(conn, tenant_id)]
            # A proposed profile is shown at the version storing it would give it.
            proposed_version = (
                self.profiles.last_version_in(conn, tenant_id, change.profile.name) + 1
                if isinstance(change, ProfileEdit)
                else 0
            )
            fleet = self._devices(conn, tenant_id, labelled)
        before = [p for _, p in stored]
        after = self._profiles_after(stored, change, proposed_version)
        self._apply(fleet, change)
        busy = self.busy(tenant_id) if self.busy is not None else {}
        renderer = Renderer(after)
        touched = self._touched(fleet, before, after, change)
        targets: list[Target] = []
        refused: list[Refusal] = []
        unchanged = 0
        for device in sorted(fleet.values(), key=lambda d: d.name):
            if selector is not None and not selector.matches(device.labels):
                continue
            if device.device_id not in touched:
                unchanged += 1
                continue
            outcome = self._plan_device(renderer, after, device)
            if outcome is None:
                unchanged += 1
            elif isinstance(outcome, Refusal):
                refused.append(outcome)
            elif device.device_id in busy:
                rollout_id, state = busy[device.device_id]
                refused.append(
                    Refusal(
                        device.device_id,
                        device.name,
                        "busy",
                        (
                            f"rollout {rollout_id} ({state}) is changing this device; wait "
                            f"for it or abort it: `trueup fleet rollout abort {rollout_id}`",
                        ),
                    )
                )
            else:
                targets.append(outcome)
        return Plan(targets=tuple(targets), refused=tuple(refused), unchanged=unchanged)

    def _devices(
        self, conn: Connection, tenant_id: int, labelled: Mapping[int, dict[str, str]]
    ) -> dict[int, _Device]:
        stored_inputs = self.inputs.all_in(conn, tenant_id)
        rows = conn.execute(
            select(
                devices.c.id,
                devices.c.name,
                devices.c.desired_version,
                revisions.c.document,
                revisions.c.content_hash,
                device_state.c.report,
            )
            .select_from(devices)
            .outerjoin(
                revisions,
                and_(
                    revisions.c.device_id == devices.c.id,
                    revisions.c.version == devices.c.desired_version,
                ),
            )
            .outerjoin(device_state, device_state.c.device_id == devices.c.id)
            .where(devices.c.tenant_id == tenant_id)
        ).all()
        fleet = {}
        for row in rows:
            fleet[int(row.id)] = _Device(
                device_id=int(row.id),
                name=str(row.name),
                desired_version=int(row.desired_version),
                desired_text=row.document,
                desired_hash=row.content_hash,
                report_text=row.report,
                labels=dict(labelled.get(int(row.id), {})),
                inputs=stored_inputs.get(int(row.id)),
            )
        return fleet

    @staticmethod
    def _profiles_after(
        stored: list[tuple[str, Profile]], change: Change | None, proposed_version: int
    ) -> list[Profile]:
        by_name = dict(stored)
        if isinstance(change, ProfileEdit):
            by_name[change.profile.name] = change.profile.with_version(proposed_version)
        elif isinstance(change, ProfileRemoval):
            if change.name not in by_name:
                raise NotFound(f"profile {change.name!r} not found")
            del by_name[change.name]
        return [by_name[name] for name in sorted(by_name)]

    @staticmethod
    def _apply(fleet: dict[int, _Device], change: Change | None) -> None:
        if not isinstance(change, VariablesChange | LabelsChange):
            return
        device = next((d for d in fleet.values() if d.name == change.device), None)
        if device is None:
            raise NotFound(f"device {change.device!r} not found")
        if isinstance(change, LabelsChange):
            for key, value in change.labels.items():
                if value is None:
                    device.labels.pop(key, None)
                else:
                    device.labels[key] = value
            return
        current = device.inputs
        variables = dict(current.variables) if current is not None else {}
        for name, value in change.variables.items():
            if value is None:
                variables.pop(name, None)
            else:
                variables[name] = value
        if change.replace_own:
            own = dict(change.own) if change.own is not None else None
        elif current is not None:
            own = current.own
        else:
            own = own_from(device.desired)
        device.inputs = _Proposed(variables, own, current.version if current else 0)

    @staticmethod
    def _touched(
        fleet: Mapping[int, _Device],
        before: Sequence[Profile],
        after: Sequence[Profile],
        change: Change | None,
    ) -> set[int]:
        """The devices to render: those the change can affect (every one without a change)."""
        if change is None:
            return set(fleet)
        if isinstance(change, VariablesChange | LabelsChange):
            return {d.device_id for d in fleet.values() if d.name == change.device}
        name = change.profile.name if isinstance(change, ProfileEdit) else change.name
        selectors = [p.selector for p in (*before, *after) if p.name == name]
        return {d.device_id for d in fleet.values() if any(s.matches(d.labels) for s in selectors)}

    def _plan_device(
        self, renderer: Renderer, profiles: Sequence[Profile], device: _Device
    ) -> Target | Refusal | None:
        stored = device.inputs
        if stored is None and not any(p.selector.matches(device.labels) for p in profiles):
            return None  # only its own document: nothing to render (compatibility)
        own = stored.own if stored is not None else own_from(device.desired)
        variables = stored.variables if stored is not None else {}
        try:
            rendered = renderer.render(
                DeviceInputs(name=device.name, labels=device.labels, variables=variables, own=own)
            )
        except RenderError as exc:
            return Refusal(
                device.device_id, device.name, "render", tuple(str(p) for p in exc.problems)
            )
        if device.desired_hash is not None and rendered.digest == device.desired_hash:
            return None
        support = agent_support(device.report, used_sections(rendered.document))
        if support["unsupported"]:
            version = support["version"] or "an unknown version"
            return Refusal(
                device.device_id,
                device.name,
                "agent-version",
                tuple(
                    f"{item['path']}: {item['detail']} (agent {version}); not sent"
                    for item in support["unsupported"]
                ),
            )
        changes = diff_documents(_without_version(device.desired), rendered.document)
        return Target(
            device_id=device.device_id,
            device=device.name,
            from_version=device.desired_version,
            document=rendered.document,
            digest=rendered.digest,
            provenance=rendered.provenance,
            changes=tuple(changes),
        )

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self,
        tenant_id: int,
        plan: Plan,
        *,
        actor: str,
        comment: str = "",
        confirm_within: int | None = None,
        expect: Mapping[str, str] | None = None,
    ) -> Published:
        """Store every target of `plan` as its device's next desired revision, one
        transaction each; a device whose desired version moved since is refused, and so
        is one whose digest is not the one `expect` (device: digest, as shown) names."""
        stored: list[tuple[str, int]] = []
        refused: list[Refusal] = []
        for target in plan.targets:
            if expect is not None and expect.get(target.device) != target.digest:
                shown = expect.get(target.device)
                refused.append(
                    Refusal(
                        target.device_id,
                        target.device,
                        "changed",
                        (
                            f"the plan shown gave {shown or 'no change'}; it is now "
                            f"{target.digest}: plan again",
                        ),
                    )
                )
                continue
            try:
                with self.store.write() as conn:
                    revision = self.store_target(
                        conn,
                        tenant_id,
                        target,
                        actor=actor,
                        comment=comment,
                        confirm_within=confirm_within,
                    )
            except Conflict as exc:
                refused.append(Refusal(target.device_id, target.device, "concurrent", (str(exc),)))
                continue
            except Busy as exc:
                refused.append(Refusal(target.device_id, target.device, "busy", (str(exc),)))
                continue
            stored.append((target.device, int(revision.version)))
        return Published(stored=tuple(stored), refused=tuple(refused))

    def store_target(
        self,
        conn: Connection,
        tenant_id: int,
        target: Target,
        *,
        actor: str,
        comment: str = "",
        confirm_within: int | None = None,
    ) -> Any:
        """Store one target as its device's next desired revision inside the caller's
        transaction (a rollout marks its member sent in the same one): its stored inputs
        when it has none, the revision with its provenance, expecting the planned version
        (Conflict when it moved). Returns the revision."""
        try:
            document = parse_document(target.document, source=f"device {target.device}")
        except DocumentError as exc:
            raise Invalid(exc.problems) from None
        if self.refuse_busy is not None:
            self.refuse_busy(conn, target.device_id, target.device)
        self.adopt_inputs(
            conn, tenant_id, target.device_id, target.device, target.from_version, actor
        )
        return self.revisions.insert_revision(
            conn,
            tenant_id=tenant_id,
            device_id=target.device_id,
            device=target.device,
            expected_version=target.from_version,
            document=document,
            author=actor,
            comment=comment,
            provenance=target.provenance.as_json(),
            confirm_within=confirm_within,
        )

    def adopt_inputs(
        self,
        conn: Connection,
        tenant_id: int,
        device_id: int,
        device: str,
        from_version: int,
        actor: str,
    ) -> None:
        """A device without stored inputs keeps its previous desired spec (at `from_version`)
        as its own layer, inside the caller's transaction: called before a rendered revision
        is stored (published, or sent by a rollout), so that the next plan renders the
        profiles over that layer instead of over the rendered document."""
        if self.inputs.has_row(conn, device_id):
            return
        row = (
            conn.execute(
                select(revisions.c.document).where(
                    and_(
                        revisions.c.device_id == device_id,
                        revisions.c.version == from_version,
                    )
                )
            )
            .scalars()
            .one_or_none()
        )
        own = own_from(json.loads(row)) if row is not None else None
        self.inputs.write_in(
            conn,
            tenant_id=tenant_id,
            device_id=device_id,
            device=device,
            expected_version=0,
            variables={},
            own=own,
            actor=actor,
            reason=f"own layer from desired revision {from_version}"
            if row is not None
            else "first rendered revision",
        )


@dataclass(frozen=True)
class _Proposed:
    variables: JSONObject
    own: JSONObject | None
    version: int
