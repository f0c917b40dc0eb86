"""The fleet-change forms of the dashboard: what a profile edit, a plan and a roll-out form
hold, checked the way the JSON API checks them (each problem naming its field); shared by
fleetroutes.py (profiles, the plan) and rolloutroutes.py (rollouts)."""

from __future__ import annotations

from typing import Any

from trueup.model.decode import DecodeError, decode_yaml
from trueup.model.layering import parse_selector
from trueup.server.dashboard.fleethtml import PlanView, RolloutForm
from trueup.server.dashboard.records import RolloutFormSpec, WaveSpec
from trueup.server.inputs import COMMENT, DEVICE, EXPECTED_VERSION, InputError
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import ControlPlane, Invalid, NotFound, Principal
from trueup.server.service.fleettypes import ProfileEdit
from trueup.server.service.planio import checked_selector, proposed_change
from trueup.server.service.rolloutplan import parse_spec

__all__ = [
    "change_name",
    "comment_of",
    "decoded",
    "expected_of",
    "is_operator",
    "plan_for",
    "problems_of",
    "profile_edit",
    "rollout_form",
    "rollout_id_of",
    "rollout_spec",
]


def is_operator(principal: Principal) -> bool:
    return principal.role in ("operator", "admin")


def problems_of(exc: Invalid) -> str:
    return "; ".join(exc.problems[:10])


def rollout_id_of(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 12:
        raise NotFound(f"rollout {raw!r} not found")
    return int(raw)


def decoded(text: str) -> Any:
    try:
        return decode_yaml(text, max_bytes=DOCUMENT_BYTES)
    except DecodeError as exc:
        raise Invalid([f"(document): {exc}"]) from None


def expected_of(form: dict[str, str]) -> int:
    try:
        return int(EXPECTED_VERSION.parse("expected", form.get("expected", "0") or "0"))
    except InputError as exc:
        raise Invalid([str(exc)]) from None


def comment_of(form: dict[str, str], name: str = "comment") -> str:
    try:
        return str(COMMENT.parse(name, form.get(name, "")))
    except InputError as exc:
        raise Invalid([str(exc)]) from None


def rollout_form(form: dict[str, str]) -> RolloutForm:
    return RolloutForm(
        canary_devices=form.get("canary_devices", ""),
        canary_selector=form.get("canary_selector", ""),
        percents=form.get("percents", ""),
        max_unavailable=form.get("max_unavailable", ""),
        soak_seconds=form.get("soak_seconds", ""),
        failure_budget=form.get("failure_budget", ""),
        confirm_within=form.get("confirm_within", ""),
        approval=form.get("approval") == "1",
        reason=form.get("reason", ""),
    )


def rollout_spec(f: RolloutForm) -> RolloutFormSpec:
    """The roll-out form as Rollouts.start's arguments; Invalid names each bad field."""
    problems: list[str] = []
    waves: list[WaveSpec] = []
    names = [n for n in f.canary_devices.replace(",", " ").split() if n]
    for name in names:
        problems.extend(DEVICE.problems("canary_devices", name))
    if names:
        waves.append({"devices": names})
    if f.canary_selector.strip():
        try:
            waves.append({"selector": parse_selector(f.canary_selector).text})
        except ValueError as exc:
            problems.append(f"canary_selector: {exc}")
    for part in [p.strip().removesuffix("%").strip() for p in f.percents.split(",")]:
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 100:
            problems.append(f"percents: {part!r} is not a percentage from 1 to 100")
        else:
            waves.append({"percent": int(part)})
    raw = f.max_unavailable.strip() or "25%"
    max_unavailable: int | str = int(raw) if raw.isdigit() else raw

    def number(name: str, text: str, integer: bool) -> float | None:
        if not text.strip():
            return None
        try:
            return int(text) if integer else float(text)
        except ValueError:
            problems.append(f"{name}: {text!r} is not a{'n integer' if integer else ' number'}")
            return None

    confirm_within = number("confirm_within", f.confirm_within, True)
    spec: RolloutFormSpec = {
        "waves": waves or None,
        "max_unavailable": max_unavailable,
        "soak_seconds": number("soak_seconds", f.soak_seconds, False) or 0.0,
        "failure_budget": int(number("failure_budget", f.failure_budget, True) or 0),
        "confirm_within": int(confirm_within) if confirm_within is not None else None,
        "approval": f.approval,
    }
    try:
        parse_spec(spec)
    except ValueError as exc:
        problems.extend(exc.args[0])
    if problems:
        raise Invalid(problems)
    return spec


def profile_edit(data: Any) -> ProfileEdit:
    """`data` as a proposed profile edit; Invalid names each problem's path."""
    change = proposed_change("profile", document=data)
    assert isinstance(change, ProfileEdit)  # what a "profile" change is
    return change


def change_name(data: Any) -> str:
    return profile_edit(data).profile.name


def plan_for(plane: ControlPlane, principal: Principal, form: dict[str, str]) -> PlanView:
    """The plan the form asks for: its proposed profile edit, else the stored inputs
    (of the devices `selector` picks). Raises Invalid."""
    text = form.get("document", "")
    if not text.strip():
        selector = form.get("selector", "")
        plan = plane.plan(principal.tenant_id, selector=checked_selector(selector))
        title = "Plan of the stored profiles and variables" + (
            f" for {selector}" if selector.strip() else ""
        )
        return PlanView(plan, title, selector=selector)
    change = profile_edit(decoded(text))
    plan = plane.plan(principal.tenant_id, change=change)
    name = change.profile.name
    return PlanView(
        plan,
        f"Plan of profile {name} as edited",
        document=text,
        expected=expected_of(form),
        comment=comment_of(form),
    )
