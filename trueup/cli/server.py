"""`trueup server …`: run the control plane and administer it.

Why this module is over 400 lines: one short command per administrative
operation, plus the fleet view's two renderers, which `trueup fleet` shares.

Administration commands work directly on the database (as the operator who
runs the server), and every write they make is audited like an API write,
with the actor `cli:<login>`.

The control plane's libraries (SQLAlchemy, Alembic, psycopg, cryptography) are
the `server` extra, which a router agent does not install: this module imports
them only inside commands, after `_require_server_extra()` has said clearly
what is missing, so `trueup --help` and the agent's commands work without them.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trueup.cli.fleet import agent_lines, check_filters, check_selector, labels_text
from trueup.model.digests import sha256_digest
from trueup.server.tokens import Role

if TYPE_CHECKING:
    from trueup.server.service import ControlPlane

__all__ = ["fleet_app", "render_fleet_device", "render_fleet_table", "server_app"]

DEFAULT_DB = "sqlite:///trueup-server.db"
DEFAULT_LISTEN = "127.0.0.1:8443"
# Every `server run` option can come from the environment (containers): TRUEUP_SERVER_<OPTION>.
# The administrative commands read the database, key file, data directory and
# create-key settings from the same variables.
DATA_DIR_ENV = "TRUEUP_SERVER_DATA_DIR"
CREATE_KEY_ENV = "TRUEUP_SERVER_CREATE_KEY"

server_app = typer.Typer(help="The trueup control plane.", no_args_is_help=True)
tenant_app = typer.Typer(help="Tenants.", no_args_is_help=True)
user_app = typer.Typer(help="Users and roles (viewer, operator, admin).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
device_app = typer.Typer(help="Devices and enrollment.", no_args_is_help=True)
audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)
fleet_app = typer.Typer(
    help="The fleet view: each device's state as the control plane derives it.",
    no_args_is_help=True,
)
server_app.add_typer(tenant_app, name="tenant")
server_app.add_typer(user_app, name="user")
server_app.add_typer(token_app, name="token")
server_app.add_typer(device_app, name="device")
server_app.add_typer(audit_app, name="audit")
server_app.add_typer(fleet_app, name="fleet")

# The database URL (it may hold a password) can come from a file instead, e.g. a mounted
# Secret, so that it is not in the container's configuration (`podman inspect`).
DB_FILE_ENV = "TRUEUP_SERVER_DB_FILE"


def _db_url(ctx: typer.Context, value: str) -> str:
    """--db, else TRUEUP_SERVER_DB, else the first line of the file TRUEUP_SERVER_DB_FILE names."""
    path = os.environ.get(DB_FILE_ENV, "")
    source = ctx.get_parameter_source("db")
    if not path or (source is not None and source.name != "DEFAULT"):
        return value
    try:
        url = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise typer.BadParameter(
            f"{DB_FILE_ENV}={path}: {reason}; expected a file holding the database URL",
            param_hint="'--db'",
        ) from None
    if not url:
        raise typer.BadParameter(
            f"{DB_FILE_ENV}={path}: empty; expected the database URL (postgresql://…)",
            param_hint="'--db'",
        )
    return url


DbOption = typer.Option(
    DEFAULT_DB,
    "--db",
    envvar="TRUEUP_SERVER_DB",
    callback=_db_url,
    help=f"sqlite:///PATH or postgresql://… (or a file holding it: {DB_FILE_ENV})",
)
KeyOption = typer.Option(
    None,
    "--key-file",
    envvar="TRUEUP_SERVER_KEY_FILE",
    help="server key (created if missing); default: next to a SQLite database",
)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"trueup server: {message}", err=True)
    return typer.Exit(code)


# Import names of the `server` extra's distributions (pyproject.toml).
_SERVER_EXTRA = ("sqlalchemy", "alembic", "psycopg", "cryptography")


def _require_server_extra() -> None:
    """Fail with one clear line, not an ImportError traceback, without the `server` extra."""
    missing = [name for name in _SERVER_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise _fail(
            "the control plane needs `pip install trueup[server]` "
            f"(not installed: {', '.join(missing)})"
        )


def _key_file(db: str, key_file: Path | None) -> Path:
    _require_server_extra()
    from trueup.server.db import normalise_url

    if key_file is not None:
        return key_file
    url = normalise_url(db)
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :] + ".key")
    raise _fail(
        "--key-file (or TRUEUP_SERVER_KEY_FILE) is required with PostgreSQL: every server "
        "process sharing the database needs the same key file"
    )


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise _fail(f"{name}={value}: expected true or false")


def _env_data_dir() -> Path | None:
    value = os.environ.get(DATA_DIR_ENV, "")
    return Path(value) if value else None


def _plane(db: str, key_file: Path | None, *, stale_intervals: int = 3) -> ControlPlane:
    """The control plane over this database. Commands call it before importing from
    trueup.server, so a missing `server` extra is reported in one line."""
    _require_server_extra()
    from trueup.server.db import Database, DatabaseURLError
    from trueup.server.keys import load_or_create_server_key
    from trueup.server.service import ControlPlane

    # The environment is checked before anything is opened: bad input changes nothing.
    create = _env_flag(CREATE_KEY_ENV, True)
    try:
        database = Database(db)
        key = load_or_create_server_key(
            _key_file(db, key_file), create=create, data_dir=_env_data_dir()
        )
        database.migrate()
    except (DatabaseURLError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    return ControlPlane(database, key, stale_intervals=stale_intervals)


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return f"cli:uid{os.getuid()}"


def _tenant(plane: ControlPlane, tenant: str) -> int:
    from trueup.server.service import NotFound

    try:
        return plane.tenant_id(tenant)
    except NotFound as exc:
        raise _fail(f"{exc}; create it with `trueup server tenant create {tenant}`") from None


def certificate_fingerprint(cert_file: Path) -> str:
    """`sha256:<hex>` of the certificate's DER form (what the agent pins)."""
    _require_server_extra()
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return sha256_digest(cert.public_bytes(Encoding.DER))


@server_app.command("run")
def run(
    db: str = DbOption,
    listen: str = typer.Option(
        DEFAULT_LISTEN, "--listen", envvar="TRUEUP_SERVER_LISTEN", help="HOST:PORT"
    ),
    key_file: Path | None = KeyOption,
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        envvar=DATA_DIR_ENV,
        help="writable directory for the audit checkpoint and upload spool "
        "(default: the key file's directory)",
    ),
    create_key: bool = typer.Option(
        True,
        "--create-key/--no-create-key",
        envvar=CREATE_KEY_ENV,
        help="create the key file when missing (off: a missing key is an error)",
    ),
    public_url: str = typer.Option(
        "",
        "--public-url",
        envvar="TRUEUP_SERVER_PUBLIC_URL",
        help="URL agents and operators use (enrollment bundles; the dashboard's own origin)",
    ),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", envvar="TRUEUP_SERVER_TLS_CERT", help="PEM certificate; enables TLS"
    ),
    tls_key: Path | None = typer.Option(
        None, "--tls-key", envvar="TRUEUP_SERVER_TLS_KEY", help="PEM private key"
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        min=1,
        envvar="TRUEUP_SERVER_WORKERS",
        help="server processes (share the DB)",
    ),
    stale_intervals: int = typer.Option(
        3, "--stale-intervals", min=1, envvar="TRUEUP_SERVER_STALE_INTERVALS"
    ),
    ingest: str = typer.Option(
        "batch", "--ingest", envvar="TRUEUP_SERVER_INGEST", help="batch (default) or naive"
    ),
    backup_keep: int = typer.Option(
        10,
        "--backup-keep",
        min=1,
        envvar="TRUEUP_SERVER_BACKUP_KEEP",
        help="backups each device keeps (the newest)",
    ),
    backup_max_mib: int = typer.Option(
        256,
        "--backup-max-mib",
        min=1,
        envvar="TRUEUP_SERVER_BACKUP_MAX_MIB",
        help="largest backup upload, MiB",
    ),
    spool_dir: str = typer.Option(
        "",
        "--spool-dir",
        envvar="TRUEUP_SERVER_SPOOL_DIR",
        help="where uploads are spooled (default: the data directory)",
    ),
    notify_retry_base: float = typer.Option(
        5.0,
        "--notify-retry-base",
        min=0.01,
        envvar="TRUEUP_SERVER_NOTIFY_RETRY_BASE",
        help="first webhook retry delay, s (doubles)",
    ),
    notify_max_attempts: int = typer.Option(
        8,
        "--notify-max-attempts",
        min=1,
        envvar="TRUEUP_SERVER_NOTIFY_MAX_ATTEMPTS",
        help="webhook attempts before the dead letters",
    ),
    log_level: str = typer.Option("warning", "--log-level", envvar="TRUEUP_SERVER_LOG_LEVEL"),
) -> None:
    """Serve the control plane API."""
    _require_server_extra()
    import uvicorn

    from trueup.server.app import SETTINGS_ENV, Settings
    from trueup.server.db import Database, DatabaseURLError
    from trueup.server.keys import load_or_create_server_key

    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise _fail(f"--listen {listen}: expected HOST:PORT (e.g. 127.0.0.1:8443)")
    if (tls_cert is None) != (tls_key is None):
        raise _fail("--tls-cert and --tls-key go together")
    if ingest not in ("batch", "naive"):
        raise _fail(f"--ingest {ingest}: use batch or naive")
    if data_dir is not None and not data_dir.is_dir():
        raise _fail(f"--data-dir {data_dir}: not a directory (create it, writable by the server)")
    try:
        key_path = _key_file(db, key_file)
        writable = data_dir or key_path.resolve().parent
        if not os.access(writable, os.W_OK) and (data_dir or key_path.exists()):
            raise _fail(
                f"{writable}: not writable; the audit checkpoint and upload spool live "
                "there (a key on a read-only mount needs --data-dir or TRUEUP_SERVER_DATA_DIR "
                "naming a writable directory)"
            )
        load_or_create_server_key(key_path, create=create_key, data_dir=data_dir)
        Database(db).migrate()
    except (DatabaseURLError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    scheme = "https" if tls_cert else "http"
    settings = Settings(
        db_url=db,
        key_file=str(key_path),
        data_dir=str(data_dir) if data_dir else "",
        create_key=create_key,
        public_url=public_url or f"{scheme}://{host}:{port_text}",
        stale_intervals=stale_intervals,
        ingest_mode=ingest,
        migrate=False,
        backup_keep=backup_keep,
        backup_max_bytes=backup_max_mib * 1024 * 1024,
        spool_dir=spool_dir,
        notify_base_delay=notify_retry_base,
        notify_max_attempts=notify_max_attempts,
    )
    os.environ[SETTINGS_ENV] = settings.to_env()
    uvicorn.run(
        "trueup.server.app:create_app_from_env",
        factory=True,
        host=host.strip("[]"),
        port=int(port_text),
        workers=workers,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        access_log=False,
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
        timeout_keep_alive=75,
        # Long polls and idle keep-alive (TLS) connections must not hold up a shutdown.
        timeout_graceful_shutdown=3,
        backlog=4096,
    )


@server_app.command("migrate")
def migrate(db: str = DbOption) -> None:
    """Create or upgrade the database schema."""
    _require_server_extra()
    from trueup.server.db import Database, DatabaseURLError

    try:
        Database(db).migrate()
    except (DatabaseURLError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo("schema is current")


@tenant_app.command("create")
def tenant_create(
    name: str = typer.Argument(..., help="tenant name"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Create a tenant (with its own secret key)."""
    plane = _plane(db, key_file)
    from trueup.server.service import Invalid

    try:
        plane.create_tenant(name, _actor())
    except Invalid as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"tenant {name} created")


@user_app.command("create")
def user_create(
    tenant: str = typer.Option(..., "--tenant"),
    user: str = typer.Option(..., "--user"),
    role: Role = typer.Option(Role.VIEWER, "--role"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Create a user with a role."""
    plane = _plane(db, key_file)
    from trueup.server.service import Invalid

    try:
        plane.create_user(_tenant(plane, tenant), user, role, _actor())
    except Invalid as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"user {tenant}/{user} created with role {role.value}")


@user_app.command("role")
def user_role(
    tenant: str = typer.Option(..., "--tenant"),
    user: str = typer.Option(..., "--user"),
    role: Role = typer.Option(..., "--role"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Change a user's role."""
    plane = _plane(db, key_file)
    from trueup.server.service import NotFound

    try:
        plane.set_role(_tenant(plane, tenant), user, role, _actor())
    except NotFound as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"user {tenant}/{user} now has role {role.value}")


@token_app.command("create")
def token_create(
    tenant: str = typer.Option(..., "--tenant"),
    user: str = typer.Option(..., "--user", help="created with --role if it does not exist"),
    role: Role = typer.Option(Role.VIEWER, "--role"),
    label: str = typer.Option("", "--label"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Create an API token; prints it once (only its hash is stored)."""
    plane = _plane(db, key_file)
    from trueup.server.service import Invalid, NotFound

    tenant_id = _tenant(plane, tenant)
    try:
        if user not in {u["name"] for u in plane.list_users(tenant_id)}:
            plane.create_user(tenant_id, user, role, _actor())
        _token_id, token = plane.create_token(tenant_id, user, _actor(), label)
    except (Invalid, NotFound) as exc:
        raise _fail(str(exc)) from None
    typer.echo(token)


@token_app.command("revoke")
def token_revoke(
    tenant: str = typer.Option(..., "--tenant"),
    token_id: int = typer.Argument(
        ..., min=1, max=2**31 - 1, help="token id (see `GET /api/v1/tokens`)"
    ),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Revoke a token."""
    plane = _plane(db, key_file)
    from trueup.server.service import NotFound

    try:
        plane.revoke_token(_tenant(plane, tenant), token_id, _actor())
    except NotFound as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"token {token_id} revoked")


@device_app.command("enroll")
def device_enroll(
    tenant: str = typer.Option(..., "--tenant"),
    device: str = typer.Option(..., "--device"),
    url: str = typer.Option(..., "--url", help="control-plane URL the agent will use"),
    out: Path = typer.Option(..., "--out", help="where to write the enrollment bundle (0600)"),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", help="the server's certificate: its fingerprint goes in the bundle"
    ),
    label: list[str] | None = typer.Option(
        None, "--label", help="KEY=VALUE: a label for the device (repeat; merged, audited)"
    ),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Write a one-time enrollment bundle. Revokes the device's current credential."""
    labels: dict[str, str] = {}
    for item in label or []:
        key, equals, value = item.partition("=")
        if not equals:
            raise _fail(f"--label {item!r}: expected KEY=VALUE")
        if key in labels and labels[key] != value:
            raise _fail(f"--label {item!r}: label {key!r} is given twice")
        labels[key] = value
    plane = _plane(db, key_file)
    from trueup.server.service import Invalid

    fingerprint = certificate_fingerprint(tls_cert) if tls_cert else None
    try:
        bundle = plane.enroll(
            _tenant(plane, tenant),
            device,
            _actor(),
            url=url,
            fingerprint=fingerprint,
            labels=labels or None,
        )
    except Invalid as exc:
        raise _fail(str(exc)) from None
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(bundle, handle, indent=2)
        handle.write("\n")
    typer.echo(f"enrollment bundle for {tenant}/{device} written to {out}")


@audit_app.command("verify")
def audit_verify(db: str = DbOption, key_file: Path | None = KeyOption) -> None:
    """Check the audit chain, its checkpoint and the tables it vouches for; list every
    problem. Exit 0 intact, 1 problems ("not covered" lines alone are not problems)."""
    plane = _plane(db, key_file)
    found = plane.verify_audit()
    problems = [p for p in found if not p.gap]
    for problem in found:
        typer.echo(str(problem))
    if problems:
        typer.echo(f"{len(problems)} problem(s) found", err=True)
        raise typer.Exit(1)
    gaps = len(found) - len(problems)
    typer.echo("audit log intact" + (f" ({gaps} item(s) not covered)" if gaps else ""))


@audit_app.command("reanchor")
def audit_reanchor(
    db: str = DbOption,
    key_file: Path | None = KeyOption,
    yes: bool = typer.Option(
        False, "--yes", help="confirm: the database was restored on purpose and checked"
    ),
) -> None:
    """Accept the stored chain after restoring a backup: checkpoint its newest row (audited).

    Until then a chain behind its checkpoint suspends authentication."""
    if not yes:
        raise _fail(
            "re-anchoring accepts the database's audit chain as it is; run "
            "`trueup server audit verify` first, then again with --yes"
        )
    plane = _plane(db, key_file)
    from trueup.server.anchor import CheckpointError

    try:
        checkpoint = plane.reanchor_audit(_actor())
    except CheckpointError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"audit chain anchored at seq={checkpoint.seq}")
    unvouched = plane.unvouched_credentials()
    if unvouched:
        # Re-anchoring accepts the chain's end; it cannot vouch across a break inside it.
        typer.echo(
            f"{len(unvouched)} credential(s) stay refused (the chain is broken after they were "
            "issued); reissue them — `trueup server audit verify` names each"
        )


# -- fleet view ------------------------------------------------------------------------------

OutputOption = typer.Option("table", "-o", "--output", help="table | json | yaml")
StaleOption = typer.Option(
    3, "--stale-intervals", min=1, help="as given to `trueup server run` (default 3)"
)

_DIGEST_MARK = {True: "✓", False: "✗", None: "?"}


def _version(value: int | None) -> str:
    return "-" if value is None else str(value)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def render_fleet_table(entries: list[dict[str, Any]]) -> str:
    """One line per device; DIGEST is ✓ (applied document = desired), ✗ or ? (unknown)."""
    header = (
        "DEVICE",
        "STATUS",
        "DESIRED",
        "APPLIED",
        "DIGEST",
        "ORIGIN",
        "REPORTED",
        "REASONS",
        "LABELS",
    )
    rows = [header]
    for e in entries:
        rows.append(
            (
                e["device"],
                e["status"],
                _version(e["desired_version"]),
                _version(e["applied_version"]),
                _DIGEST_MARK[e.get("digest_match")],
                e.get("applied_origin") or "-",
                e.get("last_report_at") or "never",
                ",".join(e["reason_codes"]) or "-",
                labels_text(e.get("labels")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_fleet_device(entry: dict[str, Any]) -> str:
    match = entry.get("digest_match")
    if match is None:
        digest = "? unknown (the agent or the revision reports no digest; versions compared)"
    elif match:
        digest = "✓ the applied document is the desired one"
    elif entry["applied_version"] == entry["desired_version"]:
        digest = "✗ differs: same version number, different document"
    else:
        digest = "✗ differs"
    lines = [
        f"device:        {entry['device']}",
        f"status:        {entry['status']}"
        + (
            f"   (conditions: {', '.join(entry['conditions'])})"
            if len(entry["conditions"]) > 1
            else ""
        ),
        f"desired:       version {_version(entry['desired_version'])}"
        f"   {entry.get('desired_digest') or '-'}",
        f"applied:       version {_version(entry['applied_version'])}"
        f"   {entry.get('applied_digest') or '-'}"
        f"   origin {entry.get('applied_origin') or '-'}",
        f"digest:        {digest}",
    ]
    override = entry.get("override")
    if override:
        lines.append(
            f"override:      local version {override.get('version', '-')}"
            f" by {override.get('actor') or '-'} at {override.get('at') or '-'}"
        )
        if override.get("reason"):
            lines.append(f"               reason: {override['reason']}")
        lines.append("               the next desired revision from the control plane replaces it")
    interval = entry.get("heartbeat_interval")
    lines.append(
        f"last report:   {entry.get('last_report_at') or 'never'}"
        + (f" ({_age(entry.get('heartbeat_age'))})" if entry.get("last_report_at") else "")
        + (f" (every {interval:g}s, {entry['missed_heartbeats']} missed)" if interval else "")
    )
    if entry.get("in_sync_since"):
        lines.append(f"in sync since: {entry['in_sync_since']}")
    lines.append(f"labels:        {labels_text(entry.get('labels'))}")
    lines.extend(agent_lines(entry))
    lines.append(f"reason codes:  {', '.join(entry['reason_codes']) or '-'}")
    for ack in entry.get("acknowledgements", []):
        lines.append(
            f"acknowledged:  {ack['subsystem']} until {ack.get('expires_at') or '-'}: "
            f"{ack['reason']}"
        )
    return "\n".join(lines)


@fleet_app.command("list")
def fleet_list(
    tenant: str = typer.Option(..., "--tenant"),
    status: str | None = typer.Option(
        None, "--status", help="only devices with this condition (e.g. local_override)"
    ),
    reason: str | None = typer.Option(None, "--reason", help="only devices with this reason code"),
    selector: str | None = typer.Option(
        None, "-l", "--selector", help="only devices whose labels this selector matches"
    ),
    output: str = OutputOption,
    stale_intervals: int = StaleOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Every device: status, desired/applied version, digest match (✓/✗/?), origin."""
    from trueup.cli.output import emit

    check_filters("trueup server fleet list", status=status, reason=reason)
    check_selector("trueup server fleet list", selector)
    plane = _plane(db, key_file, stale_intervals=stale_intervals)
    entries = plane.fleet(_tenant(plane, tenant), status=status, reason=reason, selector=selector)
    if output == "table":
        typer.echo(render_fleet_table(entries))
    else:
        emit({"devices": entries, "count": len(entries)}, output)


@fleet_app.command("show")
def fleet_show(
    device: str = typer.Argument(..., help="device name"),
    tenant: str = typer.Option(..., "--tenant"),
    output: str = OutputOption,
    stale_intervals: int = StaleOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """One device: both revisions' identities, the digest comparison and any local override."""
    from trueup.cli.output import emit

    plane = _plane(db, key_file, stale_intervals=stale_intervals)
    from trueup.server.service import NotFound

    try:
        entry = plane.device_view(_tenant(plane, tenant), device)
    except NotFound as exc:
        raise _fail(str(exc)) from None
    if output == "table":
        typer.echo(render_fleet_device(entry))
    else:
        emit(entry, output)


def main() -> None:
    server_app(prog_name="trueup server")


if __name__ == "__main__":
    main()
