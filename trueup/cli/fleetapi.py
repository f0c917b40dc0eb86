"""What `trueup fleet profile|vars|plan|publish` share: one request to the control plane.

The connection options are `trueup fleet`'s (`--server`, `--token-file`, `--ca-file`, or
their environment variables), given to the command or before it. A request that cannot
be made, a refused token or an answer that is not JSON is one line on stderr and exit 1;
so is a refusal (`checked`): each problem of a 422 with its path, a 409 with the version
the thing is at now.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypedDict
from urllib.parse import quote

import typer

from trueup.cli.output import readable

__all__ = [
    "Connection",
    "QueryParams",
    "call",
    "checked",
    "conn",
    "fail",
    "profile_url",
    "read_document",
    "several_documents",
    "table",
]


def fail(message: str) -> NoReturn:
    typer.echo(f"trueup fleet: {message}", err=True)
    raise typer.Exit(1)


QueryParams: TypeAlias = Mapping[str, str | int | None]
"""A request's query parameters; one that is None is left out."""


class Connection(TypedDict):
    """Which control plane and how to authenticate: `--server`, `--token-file`, `--ca-file`."""

    server: str | None
    token_file: Path | None
    ca_file: Path | None


def conn(
    ctx: typer.Context, *, server: str | None, token_file: Path | None, ca_file: Path | None
) -> Connection:
    """The command's own connection options, else those given to `trueup fleet`."""
    return {
        "server": server if server is not None else _nearest(ctx, "server"),
        "token_file": token_file if token_file is not None else _nearest(ctx, "token_file"),
        "ca_file": ca_file if ca_file is not None else _nearest(ctx, "ca_file"),
    }


def _nearest(ctx: typer.Context, key: str) -> Any:
    """`key` as the nearest enclosing command recorded it (`ctx.obj`), else None."""
    context: typer.Context | None = ctx
    while context is not None:
        recorded = context.obj or {}
        if key in recorded:
            return recorded[key]
        context = context.parent  # type: ignore[assignment]
    return None


def call(
    c: Connection,
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    params: QueryParams | None = None,
    timeout: float = 120.0,
    role: str = "has the role (viewer reads and plans; operator writes)",
    say: Callable[[str], NoReturn] = fail,
) -> tuple[int, Any, dict[str, str]]:
    """One request to the control plane: (status, JSON body, headers); exits 1 with one
    line (`say`, which names the command) when it cannot be made, the token is refused
    (the line asks whether it is current and `role`), or the answer is not JSON."""
    import httpx

    server, token_file, ca_file = c.get("server"), c.get("token_file"), c.get("ca_file")
    if not server:
        say("which control plane? give --server URL (or set TRUEUP_SERVER)")
    if token_file is None:
        say("give --token-file FILE holding an API token (or set TRUEUP_TOKEN_FILE)")
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        say(f"cannot read the token file {token_file}: {exc.strerror or exc}")
    if not token:
        say(f"the token file {token_file} is empty")
    verify: Any = True
    if ca_file is not None:
        import ssl

        try:
            verify = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            say(f"--ca-file {ca_file}: {exc}")
    try:
        response = httpx.request(
            method,
            str(server).rstrip("/") + path,
            json=body,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers={"Authorization": f"Bearer {token}", **(headers or {})},
            verify=verify,
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        say(f"{server} did not answer ({exc}); is the control plane running at that URL?")
    if response.status_code in (401, 403):
        say(
            f"{server} refused the token in {token_file} ({response.status_code}): check that "
            f"it is current and {role}"
        )
    try:
        answer = response.json()
    except ValueError:
        say(f"{server} answered {response.status_code}, not JSON: {response.text[:200]}")
    return response.status_code, answer, dict(response.headers)


def checked(status: int, body: Any, what: str) -> Any:
    """`body` when the request succeeded; else exit 1 naming why (each problem's path)."""
    if status < 400:
        return body
    detail = body.get("detail") if isinstance(body, dict) else None
    if status == 422 and isinstance(body, dict) and body.get("problems"):
        lines = [f"{what}: refused, nothing was changed:"]
        lines += [f"  {p}" for p in body["problems"]]
        fail("\n".join(lines))
    if status == 409 and isinstance(body, dict) and "current_version" in body:
        fail(
            f"{what}: it is now at version {body['current_version']}, not "
            f"{body['expected_version']} (someone else changed it since, or that is not its "
            "newest version): show it and try again with the version shown"
        )
    fail(f"{what}: {detail or readable(body, 300)} ({status})")


def read_document(path: Path) -> Any:
    from trueup.model.document import DocumentError, decode_text
    from trueup.model.limits import DOCUMENT_BYTES

    try:
        raw = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    if len(raw) > DOCUMENT_BYTES:
        fail(f"{path}: larger than {DOCUMENT_BYTES} bytes")
    try:
        return decode_text(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as exc:
        fail(f"{path}: not UTF-8 text (byte {exc.start})")
    except DocumentError as exc:
        several = several_documents(path, "; ".join(exc.problems), "profile")
        fail(several or f"{path}: " + "; ".join(exc.problems))


def several_documents(path: Path, message: str, what: str) -> str | None:
    """What to say when the YAML parser found a second document in `path`, else None."""
    found = re.search(r"found another document at line (\d+)", message)
    if found is None:
        return None
    return (
        f"{path}: holds more than one YAML document (the next one begins at line "
        f"{found.group(1)}); expected one document per file: put each {what} in its own file"
    )


def profile_url(name: str) -> str:
    return f"/api/v1/profiles/{quote(name, safe='')}"


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
