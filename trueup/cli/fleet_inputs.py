"""`trueup fleet vars|plan|publish` — a device's inputs and the fleet plan, over the API.

Profiles (partial device documents with typed variables and a selector) and a
device's variables and own layer are stored on the control plane, versioned:
each write sends the version it replaces (If-Match), so two operators editing
the same profile cannot overwrite each other (the second is told to edit
again). Storing them changes no device. `trueup fleet plan` shows, per device,
what a change would do — the paths old -> new against its desired revision,
and the devices that would refuse it — and exits 0 (no change), 2 (changes)
or 1 (refusals, or the server refused the request), like `terraform plan
-detailed-exitcode`. `trueup fleet publish` stores the stored inputs' plan as
the devices' next desired revisions (only the devices the plan shown listed,
with the digests it showed).

`trueup fleet profile …` is fleet_profiles.py. Connection options are `trueup fleet`'s (`--server`, `--token-file`,
`--ca-file`, or their environment variables); `-o json|yaml` prints the API's
answer as is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from trueup.cli.exitcodes import DetailedExitCommand
from trueup.cli.fleet import CaFileOpt, OutputOpt, ServerOpt, TokenFileOpt, hint_unknown_keys
from trueup.cli.fleet_profiles import CommentOpt, profile_app
from trueup.cli.fleetapi import call, checked, conn, fail, read_document
from trueup.cli.output import emit

if TYPE_CHECKING:
    from trueup.cli.fleetbodies import FleetPlan, PlanRequest, ProposedChange, VariablesUpdate
    from trueup.model.jsontypes import JSONObject

__all__ = ["add_commands", "parse_assignments", "render_plan"]

SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "-l", "--selector", help="only devices whose labels match (site=ams,role in (edge))"
    ),
]

# -- variables ---------------------------------------------------------------------------------


def parse_assignments(items: list[str]) -> dict[str, object]:
    """`k=v` (v as JSON when it reads as JSON — 9000, true, ["a","b"] — else as text) and
    `k-` (remove: None). Exits 1 naming an item that is neither."""
    found: dict[str, object] = {}
    for item in items:
        if "=" in item:
            key, text = item.split("=", 1)
            try:
                value: object = json.loads(text)
            except ValueError:
                value = text
            if value is None:
                value = text
        elif item.endswith("-") and len(item) > 1:
            key, value = item[:-1], None
        else:
            fail(f"{item!r}: expected NAME=VALUE, or NAME- to remove it")
        if not key:
            fail(f"{item!r}: the name is empty")
        found[key] = value
    return found


def fleet_vars(
    ctx: typer.Context,
    device: Annotated[str, typer.Argument(help="device name")],
    assignments: Annotated[
        list[str] | None, typer.Argument(help="NAME=VALUE to set, NAME- to remove")
    ] = None,
    own: Annotated[
        Path | None,
        typer.Option("--own", help="the device's own layer: a partial spec (or a document)"),
    ] = None,
    clear_own: Annotated[bool, typer.Option("--clear-own", help="remove the own layer")] = False,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """A device's variables and own layer: show them, or change them (If-Match).

    NAME=VALUE takes VALUE as JSON when it reads as JSON (9000, true, ["a","b"]), else as
    text; NAME- removes NAME. --own FILE replaces the own layer (a partial spec, or a
    whole document's spec). No device changes until a plan is published.
    """
    if own is not None and clear_own:
        fail("--own FILE replaces the own layer and --clear-own removes it: give one of them")
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    url = f"/api/v1/devices/{quote(device, safe='')}/variables"
    status, body, _ = call(c, "GET", url)
    current = checked(status, body, f"device {device}")
    if assignments or own is not None or clear_own:
        variables = dict(current["variables"])
        for key, value in parse_assignments(assignments or []).items():
            if value is None:
                variables.pop(key, None)
            else:
                variables[key] = value
        # Without --own/--clear-own the own layer is left out: the server keeps the one the
        # plan uses (for a device without stored inputs, its desired document's spec).
        put: VariablesUpdate = {"variables": variables}
        if clear_own:
            put["own"] = None
        elif own is not None:
            put["own"] = _own_layer(read_document(own), own)
        status, body, _ = call(
            c,
            "PUT",
            url,
            body=put,
            headers={"If-Match": str(current["version"])},
        )
        current = checked(status, body, f"the variables of device {device}")
    if output != "table":
        emit(current, output)
        return
    typer.echo(f"device {device}: variables version {current['version']}")
    for key, value in sorted(current["variables"].items()):
        typer.echo(f"  {key} = {json.dumps(value)}")
    sections = sorted(current["own"] or {})
    if current["version"] == 0:
        typer.echo("own layer: none stored (plans take the desired document's spec as its own)")
    else:
        typer.echo("own layer: " + (", ".join(sections) if sections else "none"))


_INPUTS_KEYS = {"device", "labels", "variables", "own"}


def _own_layer(data: Any, path: Path) -> JSONObject:
    """A partial spec, or a whole document's spec (as read: the server validates it)."""
    if isinstance(data, dict) and data.get("kind") == "DeviceState":
        data = data.get("spec")
    if isinstance(data, dict) and "own" in data and set(data) <= _INPUTS_KEYS:
        fail(
            f"{path}: a device's inputs ({', '.join(sorted(data))}), not an own layer: "
            "expected a partial spec (its `own:` part alone); set labels with `trueup fleet "
            "label DEVICE KEY=VALUE` and variables with `trueup fleet vars DEVICE NAME=VALUE`"
        )
    if not isinstance(data, dict):
        fail(f"{path}: expected a partial spec (sections: management, interfaces, …)")
    return data


# -- the plan ----------------------------------------------------------------------------------


def _value(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value, sort_keys=True)


def render_plan(plan: FleetPlan) -> str:
    """Per device the paths old -> new, then the refusals, then the counts."""
    lines: list[str] = []
    marks = {"add": "+", "remove": "-", "change": "~"}
    for target in plan["targets"]:
        lines.append(f"{target['device']}: desired version {target['from_version']} -> new")
        for change in target["changes"]:
            mark = marks.get(change["op"], "~")
            lines.append(
                f"  {mark} {change['path']}: {_value(change['old'])} -> {_value(change['new'])}"
            )
    for refusal in plan["refused"]:
        lines.append(f"{refusal['device']}: REFUSED ({refusal['kind']})")
        lines += [f"  {p}" for p in refusal["problems"]]
    counts = plan["counts"]
    lines.append(
        f"Plan: {counts['changed']} to change, {counts['refused']} refused, "
        f"{counts['unchanged']} unchanged."
    )
    return "\n".join(lines)


def fleet_plan(
    ctx: typer.Context,
    assignments: Annotated[
        list[str] | None,
        typer.Argument(help="NAME=VALUE (NAME- removes) for --vars or --label"),
    ] = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="a proposed profile (new or edited)")
    ] = None,
    delete_profile: Annotated[
        str | None, typer.Option("--delete-profile", help="a proposed profile deletion")
    ] = None,
    vars_device: Annotated[
        str | None, typer.Option("--vars", help="DEVICE whose variables the arguments set")
    ] = None,
    label_device: Annotated[
        str | None, typer.Option("--label", help="DEVICE whose labels the arguments set")
    ] = None,
    selector: SelectorOpt = None,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """What a change would do to each device: exit 0 no change, 2 changes, 1 refusals.

    Without a change, the stored inputs as they are (what `trueup fleet publish` would
    send). Per device: the paths that change, old -> new, against its desired revision;
    the devices that refuse it (a variable, a merge or the document model; an agent that
    does not support a section used); the count of the rest. Nothing is stored.
    """
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    chosen = [o for o in (profile, delete_profile, vars_device, label_device) if o is not None]
    if len(chosen) > 1:
        fail("propose one change: --profile, --delete-profile, --vars or --label")
    if assignments and vars_device is None and label_device is None:
        fail("NAME=VALUE arguments go with --vars DEVICE or --label DEVICE")
    change: ProposedChange | None = None
    if profile is not None:
        change = {"kind": "profile", "document": read_document(profile)}
    elif delete_profile is not None:
        change = {"kind": "profile-delete", "name": delete_profile}
    elif vars_device is not None:
        change = {
            "kind": "variables",
            "device": vars_device,
            "variables": parse_assignments(assignments or []),
        }
    elif label_device is not None:
        change = {
            "kind": "labels",
            "device": label_device,
            "labels": parse_assignments(assignments or []),
        }
    body: PlanRequest = {"selector": selector or ""}
    if change is not None:
        body["change"] = change
    status, answer, _ = call(c, "POST", "/api/v1/plan", body=body)
    planned = checked(status, answer, "plan")
    if output == "table":
        typer.echo(render_plan(planned))
    else:
        emit(planned, output)
    if selector and not any(planned["counts"].values()):
        hint_unknown_keys(c["server"], c["token_file"], c["ca_file"], selector)
    raise typer.Exit(int(planned["exit_code"]))


def fleet_publish(
    ctx: typer.Context,
    selector: SelectorOpt = None,
    comment: CommentOpt = "",
    yes: Annotated[bool, typer.Option("--yes", help="publish without asking")] = False,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Plan the stored inputs, then store that plan's devices' new desired revisions.

    Only the devices the plan shown listed are published, each with the document shown
    (a device changed since is refused). Exit 0 published, 1 some device refused.
    """
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, answer, _ = call(c, "POST", "/api/v1/plan", body={"selector": selector or ""})
    planned = checked(status, answer, "plan")
    if output == "table":
        typer.echo(render_plan(planned))
    if not planned["targets"]:
        if output != "table":
            emit({**planned, "published": []}, output)
        raise typer.Exit(1 if planned["refused"] else 0)
    if not yes:
        if not os.isatty(0):
            fail("give --yes to publish without a terminal to ask on")
        if not typer.confirm(f"Publish {len(planned['targets'])} device(s)?"):
            raise typer.Exit(1)
    expect = {t["device"]: t["digest"] for t in planned["targets"]}
    status, answer, _ = call(
        c,
        "POST",
        "/api/v1/plan/publish",
        body={"selector": selector or "", "comment": comment, "expect": expect},
    )
    published = checked(status, answer, "publish")
    if output != "table":
        emit(published, output)
    else:
        for item in published["published"]:
            typer.echo(f"{item['device']}: desired version {item['version']} stored")
        for refusal in published["refused"]:
            if refusal["device"] in expect:
                typer.echo(f"{refusal['device']}: NOT published ({refusal['kind']})")
                typer.echo("\n".join(f"  {p}" for p in refusal["problems"]))
    raise typer.Exit(1 if published["refused"] else 0)


def add_commands(fleet: typer.Typer) -> None:
    """`trueup fleet profile …`, `vars`, `plan` and `publish`."""
    fleet.add_typer(profile_app, name="profile")
    fleet.command("vars")(fleet_vars)
    fleet.command("plan", cls=DetailedExitCommand)(fleet_plan)
    fleet.command("publish")(fleet_publish)
