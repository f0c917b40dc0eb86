"""`trueup fleet profile|vars|plan|publish` — the fleet's inputs and the fleet plan, over the API.

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

Connection options are `trueup fleet`'s (`--server`, `--token-file`,
`--ca-file`, or their environment variables); `-o json|yaml` prints the API's
answer as is.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import typer

from trueup.cli.fleet import CaFileOpt, OutputOpt, ServerOpt, TokenFileOpt
from trueup.cli.output import emit, readable

__all__ = ["add_commands", "parse_assignments", "profile_app", "render_plan"]

profile_app = typer.Typer(
    help="Profiles: partial device documents with typed variables, versioned (If-Match).",
    no_args_is_help=True,
)

SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "-l", "--selector", help="only devices whose labels match (site=ams,role in (edge))"
    ),
]
CommentOpt = Annotated[str, typer.Option("--comment", help="why (kept with the version)")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"trueup fleet: {message}", err=True)
    raise typer.Exit(1)


def _conn(ctx: typer.Context, **given: Any) -> dict[str, Any]:
    """The command's own connection options, else those given to `trueup fleet`."""
    found: dict[str, Any] = {}
    context: typer.Context | None = ctx
    while context is not None:
        for key, value in (context.obj or {}).items():
            found.setdefault(key, value)
        context = context.parent  # type: ignore[assignment]
    return {k: v if v is not None else found.get(k) for k, v in given.items()}


def _call(
    c: dict[str, Any],
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One request to the control plane: (status, JSON body, headers); exits 1 with one
    line when it cannot be made, the token is refused, or the answer is not JSON."""
    import httpx

    server, token_file, ca_file = c.get("server"), c.get("token_file"), c.get("ca_file")
    if not server:
        _fail("which control plane? give --server URL (or set TRUEUP_SERVER)")
    if token_file is None:
        _fail("give --token-file FILE holding an API token (or set TRUEUP_TOKEN_FILE)")
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        _fail(f"cannot read the token file {token_file}: {exc.strerror or exc}")
    if not token:
        _fail(f"the token file {token_file} is empty")
    verify: Any = True
    if ca_file is not None:
        import ssl

        try:
            verify = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            _fail(f"--ca-file {ca_file}: {exc}")
    try:
        response = httpx.request(
            method,
            str(server).rstrip("/") + path,
            json=body,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers={"Authorization": f"Bearer {token}", **(headers or {})},
            verify=verify,
            timeout=120.0,
        )
    except httpx.HTTPError as exc:
        _fail(f"{server} did not answer ({exc}); is the control plane running at that URL?")
    if response.status_code in (401, 403):
        _fail(
            f"{server} refused the token in {token_file} ({response.status_code}): check that "
            "it is current and has the role (viewer reads and plans; operator writes)"
        )
    try:
        answer = response.json()
    except ValueError:
        _fail(f"{server} answered {response.status_code}, not JSON: {response.text[:200]}")
    return response.status_code, answer, dict(response.headers)


def _checked(status: int, body: Any, what: str) -> Any:
    """`body` when the request succeeded; else exit 1 naming why (each problem's path)."""
    if status < 400:
        return body
    detail = body.get("detail") if isinstance(body, dict) else None
    if status == 422 and isinstance(body, dict) and body.get("problems"):
        lines = [f"{what}: refused, nothing was changed:"]
        lines += [f"  {p}" for p in body["problems"]]
        _fail("\n".join(lines))
    if status == 409 and isinstance(body, dict) and "current_version" in body:
        _fail(
            f"{what}: it is now at version {body['current_version']}, not "
            f"{body['expected_version']} (someone else changed it): show it and edit again"
        )
    _fail(f"{what}: {detail or readable(body, 300)} ({status})")


def _read_document(path: Path) -> Any:
    from trueup.model.document import DocumentError, decode_text
    from trueup.model.limits import DOCUMENT_BYTES

    try:
        raw = path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}")
    if len(raw) > DOCUMENT_BYTES:
        _fail(f"{path}: larger than {DOCUMENT_BYTES} bytes")
    try:
        return decode_text(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as exc:
        _fail(f"{path}: not UTF-8 text (byte {exc.start})")
    except DocumentError as exc:
        _fail(f"{path}: " + "; ".join(exc.problems))


def _profile_url(name: str) -> str:
    return f"/api/v1/profiles/{quote(name, safe='')}"


# -- profiles ---------------------------------------------------------------------------------


@profile_app.command("create")
def profile_create(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="the profile (YAML or JSON)")],
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Store a new profile (refused when one of its name exists). Changes no device."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    document = _read_document(file)
    metadata = document.get("metadata") if isinstance(document, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        _fail(f"{file}: metadata.name: a profile names itself (a DNS label)")
    status, body, _ = _call(
        c,
        "PUT",
        _profile_url(name),
        body=document,
        headers={"If-Match": "0", "X-Trueup-Comment": comment},
    )
    if status == 409:
        _fail(f"profile {name} exists (version {body.get('current_version')}): use edit")
    _stored(_checked(status, body, f"profile {name}"), output)


def _stored(body: dict[str, Any], output: str) -> None:
    if output != "table":
        emit(body, output)
        return
    typer.echo(
        f"profile {body['name']} version {body['version']} stored; no device changes until a "
        "plan is published (trueup fleet plan, trueup fleet publish)"
    )


@profile_app.command("edit")
def profile_edit(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    file: Annotated[
        Path | None, typer.Argument(help="the new profile (default: edit it in $EDITOR)")
    ] = None,
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Store the next version of a profile, replacing the version shown (If-Match)."""
    import yaml

    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = _call(c, "GET", _profile_url(name))
    shown = _checked(status, body, f"profile {name}")
    version = int(shown["version"])
    if file is not None:
        document = _read_document(file)
    else:
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        with tempfile.TemporaryDirectory(prefix="trueup-profile-") as tmp:
            path = Path(tmp) / f"{name}.yaml"
            text = yaml.safe_dump(shown["document"], sort_keys=False)
            path.write_text(text)
            if subprocess.call([*shlex.split(editor), str(path)]) != 0:
                _fail(f"{editor} failed; nothing was changed")
            if path.read_text() == text:
                typer.echo(f"profile {name}: no change (still version {version})")
                return
            document = _read_document(path)
    status, body, _ = _call(
        c,
        "PUT",
        _profile_url(name),
        body=document,
        headers={"If-Match": str(version), "X-Trueup-Comment": comment},
    )
    _stored(_checked(status, body, f"profile {name}"), output)


@profile_app.command("show")
def profile_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    version: Annotated[int | None, typer.Option("--version", help="an earlier version")] = None,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """A profile's newest version (or version N): who stored it, when, and its document."""
    import yaml

    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = _call(c, "GET", _profile_url(name), params={"version": version})
    shown = _checked(status, body, f"profile {name}")
    if output != "table":
        emit(shown, output)
        return
    state = "  (deleted)" if shown.get("deleted") else ""
    typer.echo(
        f"# profile {shown['name']} version {shown['version']}{state}, by {shown['created_by']}"
        f" at {shown['created_at']}" + (f": {shown['comment']}" if shown.get("comment") else "")
    )
    typer.echo(yaml.safe_dump(shown["document"], sort_keys=False).rstrip())


@profile_app.command("list")
def profile_list(
    ctx: typer.Context,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Every profile: its newest version, priority and selector."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = _call(c, "GET", "/api/v1/profiles")
    found = _checked(status, body, "profiles")
    if output != "table":
        emit(found, output)
        return
    rows = [("NAME", "VERSION", "PRIORITY", "SELECTOR", "BY")]
    for p in found["profiles"]:
        rows.append(
            (
                p["name"],
                str(p["version"]),
                str(p.get("priority")),
                p.get("selector") or '"" (every device)',
                p["created_by"],
            )
        )
    typer.echo(_table(rows))
    typer.echo(f"{len(found['profiles'])} profile(s)")


@profile_app.command("versions")
def profile_versions(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Every version of a profile, oldest first (its deletion included)."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = _call(c, "GET", _profile_url(name) + "/versions")
    found = _checked(status, body, f"profile {name}")
    if output != "table":
        emit(found, output)
        return
    rows = [("VERSION", "BY", "DIGEST", "COMMENT")]
    for v in found["versions"]:
        rows.append(
            (
                str(v["version"]) + (" (deleted)" if v["deleted"] else ""),
                v["created_by"],
                v["digest"],
                v.get("comment") or "-",
            )
        )
    typer.echo(_table(rows))


@profile_app.command("delete")
def profile_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    version: Annotated[int, typer.Option("--version", help="the version you delete (If-Match)")],
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Delete a profile (its versions stay readable). Devices change when a plan is published."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = _call(
        c,
        "DELETE",
        _profile_url(name),
        headers={"If-Match": str(version), "X-Trueup-Comment": comment},
    )
    deleted = _checked(status, body, f"profile {name}")
    if output != "table":
        emit(deleted, output)
        return
    typer.echo(f"profile {name} deleted (version {deleted['version']}); trueup fleet plan shows")


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# -- variables ---------------------------------------------------------------------------------


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`k=v` (v as JSON when it reads as JSON — 9000, true, ["a","b"] — else as text) and
    `k-` (remove: None). Exits 1 naming an item that is neither."""
    found: dict[str, Any] = {}
    for item in items:
        if "=" in item:
            key, text = item.split("=", 1)
            try:
                value: Any = json.loads(text)
            except ValueError:
                value = text
            if value is None:
                value = text
        elif item.endswith("-") and len(item) > 1:
            key, value = item[:-1], None
        else:
            _fail(f"{item!r}: expected NAME=VALUE, or NAME- to remove it")
        if not key:
            _fail(f"{item!r}: the name is empty")
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
    """A device's variables and own layer: show them, or change them (If-Match)."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    url = f"/api/v1/devices/{quote(device, safe='')}/variables"
    status, body, _ = _call(c, "GET", url)
    current = _checked(status, body, f"device {device}")
    if assignments or own is not None or clear_own:
        variables = dict(current["variables"])
        for key, value in parse_assignments(assignments or []).items():
            if value is None:
                variables.pop(key, None)
            else:
                variables[key] = value
        layer = current["own"]
        if clear_own:
            layer = None
        elif own is not None:
            layer = _own_layer(_read_document(own), own)
        status, body, _ = _call(
            c,
            "PUT",
            url,
            body={"variables": variables, "own": layer},
            headers={"If-Match": str(current["version"])},
        )
        current = _checked(status, body, f"the variables of device {device}")
    if output != "table":
        emit(current, output)
        return
    typer.echo(f"device {device}: variables version {current['version']}")
    for key, value in sorted(current["variables"].items()):
        typer.echo(f"  {key} = {json.dumps(value)}")
    sections = sorted(current["own"] or {})
    typer.echo("own layer: " + (", ".join(sections) if sections else "none"))


def _own_layer(data: Any, path: Path) -> dict[str, Any]:
    """A partial spec, or a whole document's spec."""
    if isinstance(data, dict) and data.get("kind") == "DeviceState":
        data = data.get("spec")
    if not isinstance(data, dict):
        _fail(f"{path}: expected a partial spec (sections: management, interfaces, …)")
    return data


# -- the plan ----------------------------------------------------------------------------------


def _value(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value, sort_keys=True)


def render_plan(plan: dict[str, Any]) -> str:
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
    """What a change would do to each device: exit 0 no change, 2 changes, 1 refusals."""
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    chosen = [o for o in (profile, delete_profile, vars_device, label_device) if o is not None]
    if len(chosen) > 1:
        _fail("propose one change: --profile, --delete-profile, --vars or --label")
    if assignments and vars_device is None and label_device is None:
        _fail("NAME=VALUE arguments go with --vars DEVICE or --label DEVICE")
    change: dict[str, Any] | None = None
    if profile is not None:
        change = {"kind": "profile", "document": _read_document(profile)}
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
    body: dict[str, Any] = {"selector": selector or ""}
    if change is not None:
        body["change"] = change
    status, answer, _ = _call(c, "POST", "/api/v1/plan", body=body)
    planned = _checked(status, answer, "plan")
    if output == "table":
        typer.echo(render_plan(planned))
    else:
        emit(planned, output)
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
    c = _conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, answer, _ = _call(c, "POST", "/api/v1/plan", body={"selector": selector or ""})
    planned = _checked(status, answer, "plan")
    if output == "table":
        typer.echo(render_plan(planned))
    if not planned["targets"]:
        if output != "table":
            emit({**planned, "published": []}, output)
        raise typer.Exit(1 if planned["refused"] else 0)
    if not yes:
        if not os.isatty(0):
            _fail("give --yes to publish without a terminal to ask on")
        if not typer.confirm(f"Publish {len(planned['targets'])} device(s)?"):
            raise typer.Exit(1)
    expect = {t["device"]: t["digest"] for t in planned["targets"]}
    status, answer, _ = _call(
        c,
        "POST",
        "/api/v1/plan/publish",
        body={"selector": selector or "", "comment": comment, "expect": expect},
    )
    published = _checked(status, answer, "publish")
    if output != "table":
        emit(published, output)
    else:
        for item in published["published"]:
            typer.echo(f"{item['device']}: desired version {item['version']} stored")
        for refusal in published["refused"]:
            if refusal["device"] in expect:
                typer.echo(f"{refusal['device']}: NOT published ({refusal['kind']})")
                typer.echo("".join(f"  {p}" for p in refusal["problems"]))
    raise typer.Exit(1 if published["refused"] else 0)


def add_commands(fleet: typer.Typer) -> None:
    """`trueup fleet profile …`, `vars`, `plan` and `publish`."""
    fleet.add_typer(profile_app, name="profile")
    fleet.command("vars")(fleet_vars)
    fleet.command("plan")(fleet_plan)
    fleet.command("publish")(fleet_publish)
