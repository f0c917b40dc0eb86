"""A fleet plan's outside form: the change as the API and the CLI give it, the plan as
they answer it, the selector checked. Shared by the planner and the HTTP routes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trueup.model.digests import json_digest
from trueup.model.document import DocumentError, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.layering import (
    ProfileError,
    Selector,
    SelectorError,
    label_problems,
    parse_profile,
    parse_selector,
)
from trueup.server.service.errors import Invalid, WrongState
from trueup.server.service.fleettypes import (
    Change,
    LabelsChange,
    Plan,
    ProfileEdit,
    ProfileRemoval,
    VariablesChange,
)
from trueup.server.service.records import PlanJSON

__all__ = ["checked_selector", "own_from", "plan_digest", "plan_json", "proposed_change", "unseen"]


def checked_selector(text: str) -> Selector | None:
    """`text` parsed as a label selector (None for ""); Invalid names the position."""
    if not text.strip():
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise Invalid([f"body.selector: {exc}"]) from None


def proposed_change(
    kind: str,
    *,
    document: Any = None,
    name: str | None = None,
    device: str | None = None,
    variables: Mapping[str, Any] | None = None,
    own: Mapping[str, Any] | None = None,
    replace_own: bool = False,
    labels: Mapping[str, str | None] | None = None,
) -> Change:
    """A change as the API and the CLI describe it, checked; Invalid names each problem."""
    if kind == "profile":
        if document is None:
            raise Invalid(["change.document: a profile document is required"])
        try:
            return ProfileEdit(parse_profile(document, source="change.document"))
        except ProfileError as exc:
            raise Invalid([f"change.document.{p}" for p in exc.problems]) from None
    if kind == "profile-delete":
        if not name:
            raise Invalid(["change.name: the profile to delete is required"])
        return ProfileRemoval(name)
    if not device:
        raise Invalid([f"change.device: a {kind} change names its device"])
    if kind == "variables":
        return VariablesChange(device, dict(variables or {}), own, replace_own)
    if kind == "labels":
        given = dict(labels or {})
        # A removal (None) is checked as a key only.
        problems = label_problems({k: "" if v is None else v for k, v in given.items()})
        if problems:
            raise Invalid([f"change.{p}" for p in problems])
        return LabelsChange(device, given)
    raise Invalid([f"change.kind: {kind!r} is not profile, profile-delete, variables or labels"])


def plan_digest(plan: Plan) -> str:
    """What a plan would send, as one digest: each target's device, the version it was
    planned against and the digest of its new document. A rollout started with
    `expect_digest` is refused when the plan it would send is no longer the one shown."""
    return json_digest(sorted([t.device, t.from_version, t.digest] for t in plan.targets))


def unseen(plan: Plan, expect_digest: str | None) -> None:
    """Refuse (WrongState, 409) a plan that is not the one shown (`expect_digest`)."""
    if expect_digest is None:
        return
    now = plan_digest(plan)
    if now != expect_digest:
        raise WrongState(
            f"the plan changed since it was shown (shown {expect_digest}, now {now}: "
            f"{len(plan.targets)} devices would change); nothing was started: plan again "
            "and roll out the plan you see"
        )


def plan_json(plan: Plan) -> PlanJSON:
    """The plan as the API answers it (and `trueup fleet plan -o json` prints it)."""
    return {
        "targets": [
            {
                "device": t.device,
                "from_version": t.from_version,
                "digest": t.digest,
                "provenance": t.provenance.as_json(),
                "changes": [
                    {"path": c.path, "op": c.op, "old": c.old, "new": c.new} for c in t.changes
                ],
            }
            for t in plan.targets
        ],
        "refused": [
            {"device": r.device, "kind": r.kind, "problems": list(r.problems)} for r in plan.refused
        ],
        "counts": {
            "changed": len(plan.targets),
            "refused": len(plan.refused),
            "unchanged": plan.unchanged,
        },
        "exit_code": plan.exit_code,
        "digest": plan_digest(plan),
    }


def own_from(document: Mapping[str, Any] | None) -> JSONObject | None:
    """A desired document's spec as an own layer: what it sets, without the defaults the
    model filled in (those would override every profile; validation fills them again)."""
    if document is None:
        return None
    try:
        state = parse_document(dict(document))
    except DocumentError:
        spec = document.get("spec")
        return dict(spec) if isinstance(spec, Mapping) else None
    body = state.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    spec = body.get("spec", {})
    return dict(spec) if isinstance(spec, Mapping) else {}
