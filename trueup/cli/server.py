"""`trueup server …`: run the control plane and administer it.

Administration commands work directly on the database (as the operator who
runs the server), and every write they make is audited like an API write,
with the actor `cli:<login>`. Each one is its essence inside `admin`
(serveradmin.py), which opens the control plane and turns the service's
refusals into one line and exit 1. `trueup server fleet` is server_fleet.py,
`trueup server notify` server_notify.py.

Why this module is over 400 lines: `server run` has seventeen options, each
declared once here with its environment variable and help, and every other
command is a short function of its own (what they share is serveradmin.py).

The control plane's libraries (SQLAlchemy, Alembic, psycopg, cryptography) are
the `server` extra, which a router agent does not install: these modules import
them only inside commands, after `require_server_extra()` has said clearly
what is missing, so `trueup --help` and the agent's commands work without them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trueup.cli.server_fleet import fleet_app, render_fleet_device, render_fleet_table
from trueup.cli.serveradmin import (
    CREATE_KEY_ENV,
    DATA_DIR_ENV,
    DbOption,
    KeyOption,
    admin,
    certificate_fingerprint,
    fail,
    key_file_for,
    require_server_extra,
)
from trueup.server.tokens import Role

if TYPE_CHECKING:
    from trueup.server.app import Settings

__all__ = [
    "certificate_fingerprint",
    "fleet_app",
    "render_fleet_device",
    "render_fleet_table",
    "server_app",
]

DEFAULT_LISTEN = "127.0.0.1:8443"

server_app = typer.Typer(help="The trueup control plane.", no_args_is_help=True)
tenant_app = typer.Typer(help="Tenants.", no_args_is_help=True)
user_app = typer.Typer(help="Users and roles (viewer, operator, admin).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
device_app = typer.Typer(help="Devices and enrollment.", no_args_is_help=True)
audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)
server_app.add_typer(tenant_app, name="tenant")
server_app.add_typer(user_app, name="user")
server_app.add_typer(token_app, name="token")
server_app.add_typer(device_app, name="device")
server_app.add_typer(audit_app, name="audit")
server_app.add_typer(fleet_app, name="fleet")

# -- server run ------------------------------------------------------------------------------

_ListenOption = typer.Option(
    DEFAULT_LISTEN, "--listen", envvar="TRUEUP_SERVER_LISTEN", help="HOST:PORT"
)
_DataDirOption = typer.Option(
    None,
    "--data-dir",
    envvar=DATA_DIR_ENV,
    help="writable directory for the audit checkpoint and upload spool "
    "(default: the key file's directory)",
)
_CreateKeyOption = typer.Option(
    True,
    "--create-key/--no-create-key",
    envvar=CREATE_KEY_ENV,
    help="create the key file when missing (off: a missing key is an error)",
)
_PublicUrlOption = typer.Option(
    "",
    "--public-url",
    envvar="TRUEUP_SERVER_PUBLIC_URL",
    help="URL agents and operators use (enrollment bundles; the dashboard's own origin)",
)
_TlsCertOption = typer.Option(
    None, "--tls-cert", envvar="TRUEUP_SERVER_TLS_CERT", help="PEM certificate; enables TLS"
)
_TlsKeyOption = typer.Option(
    None, "--tls-key", envvar="TRUEUP_SERVER_TLS_KEY", help="PEM private key"
)
_WorkersOption = typer.Option(
    1,
    "--workers",
    min=1,
    envvar="TRUEUP_SERVER_WORKERS",
    help="server processes (share the DB)",
)
_StaleIntervalsOption = typer.Option(
    3, "--stale-intervals", min=1, envvar="TRUEUP_SERVER_STALE_INTERVALS"
)
_IngestOption = typer.Option(
    "batch", "--ingest", envvar="TRUEUP_SERVER_INGEST", help="batch (default) or naive"
)
_BackupKeepOption = typer.Option(
    10,
    "--backup-keep",
    min=1,
    envvar="TRUEUP_SERVER_BACKUP_KEEP",
    help="backups each device keeps (the newest)",
)
_BackupMaxOption = typer.Option(
    256,
    "--backup-max-mib",
    min=1,
    envvar="TRUEUP_SERVER_BACKUP_MAX_MIB",
    help="largest backup upload, MiB",
)
_SpoolDirOption = typer.Option(
    "",
    "--spool-dir",
    envvar="TRUEUP_SERVER_SPOOL_DIR",
    help="where uploads are spooled (default: the data directory)",
)
_NotifyRetryOption = typer.Option(
    5.0,
    "--notify-retry-base",
    min=0.01,
    envvar="TRUEUP_SERVER_NOTIFY_RETRY_BASE",
    help="first webhook retry delay, s (doubles)",
)
_NotifyAttemptsOption = typer.Option(
    8,
    "--notify-max-attempts",
    min=1,
    envvar="TRUEUP_SERVER_NOTIFY_MAX_ATTEMPTS",
    help="webhook attempts before the dead letters",
)
_LogLevelOption = typer.Option("warning", "--log-level", envvar="TRUEUP_SERVER_LOG_LEVEL")


@server_app.command("run")
def run(
    db: str = DbOption,
    listen: str = _ListenOption,
    key_file: Path | None = KeyOption,
    data_dir: Path | None = _DataDirOption,
    create_key: bool = _CreateKeyOption,
    public_url: str = _PublicUrlOption,
    tls_cert: Path | None = _TlsCertOption,
    tls_key: Path | None = _TlsKeyOption,
    workers: int = _WorkersOption,
    stale_intervals: int = _StaleIntervalsOption,
    ingest: str = _IngestOption,
    backup_keep: int = _BackupKeepOption,
    backup_max_mib: int = _BackupMaxOption,
    spool_dir: str = _SpoolDirOption,
    notify_retry_base: float = _NotifyRetryOption,
    notify_max_attempts: int = _NotifyAttemptsOption,
    log_level: str = _LogLevelOption,
) -> None:
    """Serve the control plane API."""
    require_server_extra()
    from trueup.server.app import Settings

    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise fail(f"--listen {listen}: expected HOST:PORT (e.g. 127.0.0.1:8443)")
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    if ingest not in ("batch", "naive"):
        raise fail(f"--ingest {ingest}: use batch or naive")
    if data_dir is not None and not data_dir.is_dir():
        raise fail(f"--data-dir {data_dir}: not a directory (create it, writable by the server)")
    key_path = _prepare_storage(db, key_file, data_dir, create_key)
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
    _serve(settings, host, int(port_text), workers, log_level, tls_cert, tls_key)


def _prepare_storage(
    db: str, key_file: Path | None, data_dir: Path | None, create_key: bool
) -> Path:
    """Check the data directory is writable, load (or create) the key, migrate the schema;
    the key file's path."""
    from trueup.server.db import Database, DatabaseURLError
    from trueup.server.keys import load_or_create_server_key

    try:
        key_path = key_file_for(db, key_file)
        writable = data_dir or key_path.resolve().parent
        if not os.access(writable, os.W_OK) and (data_dir or key_path.exists()):
            raise fail(
                f"{writable}: not writable; the audit checkpoint and upload spool live "
                "there (a key on a read-only mount needs --data-dir or TRUEUP_SERVER_DATA_DIR "
                "naming a writable directory)"
            )
        load_or_create_server_key(key_path, create=create_key, data_dir=data_dir)
        Database(db).migrate()
    except (DatabaseURLError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    return key_path


def _serve(
    settings: Settings,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Run uvicorn's workers, each building the application from `settings` (passed in the
    environment)."""
    import uvicorn

    from trueup.server.app import SETTINGS_ENV

    os.environ[SETTINGS_ENV] = settings.to_env()
    uvicorn.run(
        "trueup.server.app:create_app_from_env",
        factory=True,
        host=host.strip("[]"),
        port=port,
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


# -- administration --------------------------------------------------------------------------


@server_app.command("migrate")
def migrate(db: str = DbOption) -> None:
    """Create or upgrade the database schema."""
    require_server_extra()
    from trueup.server.db import Database, DatabaseURLError

    try:
        Database(db).migrate()
    except (DatabaseURLError, OSError) as exc:
        raise fail(str(exc)) from None
    typer.echo("schema is current")


@tenant_app.command("create")
def tenant_create(
    name: str = typer.Argument(..., help="tenant name"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Create a tenant (with its own secret key)."""
    with admin(db, key_file) as run:
        run.plane.create_tenant(name, run.actor)
        run.say(f"tenant {name} created")


@user_app.command("create")
def user_create(
    tenant: str = typer.Option(..., "--tenant"),
    user: str = typer.Option(..., "--user"),
    role: Role = typer.Option(Role.VIEWER, "--role"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Create a user with a role."""
    with admin(db, key_file) as run:
        run.plane.create_user(run.tenant(tenant), user, role, run.actor)
        run.say(f"user {tenant}/{user} created with role {role.value}")


@user_app.command("role")
def user_role(
    tenant: str = typer.Option(..., "--tenant"),
    user: str = typer.Option(..., "--user"),
    role: Role = typer.Option(..., "--role"),
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Change a user's role."""
    with admin(db, key_file) as run:
        run.plane.set_role(run.tenant(tenant), user, role, run.actor)
        run.say(f"user {tenant}/{user} now has role {role.value}")


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
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        if user not in {u["name"] for u in run.plane.list_users(tenant_id)}:
            run.plane.create_user(tenant_id, user, role, run.actor)
        _token_id, token = run.plane.create_token(tenant_id, user, run.actor, label)
        run.say(token)


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
    with admin(db, key_file) as run:
        run.plane.revoke_token(run.tenant(tenant), token_id, run.actor)
        run.say(f"token {token_id} revoked")


def _labels(given: list[str] | None) -> dict[str, str]:
    """`--label KEY=VALUE`s; the same key twice with two values is refused."""
    labels: dict[str, str] = {}
    for item in given or []:
        key, equals, value = item.partition("=")
        if not equals:
            raise fail(f"--label {item!r}: expected KEY=VALUE")
        if key in labels and labels[key] != value:
            raise fail(f"--label {item!r}: label {key!r} is given twice")
        labels[key] = value
    return labels


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
    labels = _labels(label)
    with admin(db, key_file) as run:
        fingerprint = certificate_fingerprint(tls_cert) if tls_cert else None
        tenant_id = run.tenant(tenant)
        bundle = run.plane.enroll(
            tenant_id, device, run.actor, url=url, fingerprint=fingerprint, labels=labels or None
        )
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(bundle, handle, indent=2)
        handle.write("\n")
    typer.echo(f"enrollment bundle for {tenant}/{device} written to {out}")


@audit_app.command("verify")
def audit_verify(db: str = DbOption, key_file: Path | None = KeyOption) -> None:
    """Check the audit chain, its checkpoint and the tables it vouches for; list every
    problem. Exit 0 intact, 1 problems ("not covered" lines alone are not problems)."""
    with admin(db, key_file) as run:
        found = run.plane.verify_audit()
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
        raise fail(
            "re-anchoring accepts the database's audit chain as it is; run "
            "`trueup server audit verify` first, then again with --yes"
        )
    with admin(db, key_file) as run:
        checkpoint = run.plane.reanchor_audit(run.actor)
        run.say(f"audit chain anchored at seq={checkpoint.seq}")
        unvouched = run.plane.unvouched_credentials()
    if unvouched:
        # Re-anchoring accepts the chain's end; it cannot vouch across a break inside it.
        typer.echo(
            f"{len(unvouched)} credential(s) stay refused (the chain is broken after they were "
            "issued); reissue them — `trueup server audit verify` names each"
        )


def main() -> None:
    server_app(prog_name="trueup server")


if __name__ == "__main__":
    main()
