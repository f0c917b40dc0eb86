"""What every `trueup server …` administration command shares: the database and key-file
options, opening the control plane, and `admin`, the one wrapper around a command's body.

    with admin(db, key_file) as run:
        run.plane.create_tenant(name, run.actor)
        run.say(f"tenant {name} created")

`admin` opens the control plane over the database (as the operator who runs the server;
a missing `server` extra, a bad URL or key file is one line and exit 1), runs the body,
and turns a refusal of the service (NotFound, Invalid, Conflict, … and a re-anchoring
refused) into `trueup server: MESSAGE` on stderr with exit 1. Every write is audited like
an API write, with the actor `cli:<login>` (`run.actor`).

The control plane's libraries (SQLAlchemy, Alembic, psycopg, cryptography) are the
`server` extra, which a router agent does not install: this module imports them only
inside functions, after `require_server_extra()` has said clearly what is missing, so
`trueup --help` and the agent's commands work without them.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trueup.model.digests import sha256_digest

if TYPE_CHECKING:
    from trueup.server.service import ControlPlane

__all__ = [
    "CREATE_KEY_ENV",
    "DATA_DIR_ENV",
    "DB_FILE_ENV",
    "DEFAULT_DB",
    "Admin",
    "DbOption",
    "KeyOption",
    "OutputOption",
    "StaleOption",
    "actor",
    "admin",
    "certificate_fingerprint",
    "env_data_dir",
    "fail",
    "key_file_for",
    "open_plane",
    "require_server_extra",
    "tenant_id",
]

DEFAULT_DB = "sqlite:///trueup-server.db"
# Every `server run` option can come from the environment (containers): TRUEUP_SERVER_<OPTION>.
# The administrative commands read the database, key file, data directory and
# create-key settings from the same variables.
DATA_DIR_ENV = "TRUEUP_SERVER_DATA_DIR"
CREATE_KEY_ENV = "TRUEUP_SERVER_CREATE_KEY"
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
OutputOption = typer.Option("table", "-o", "--output", help="table | json | yaml")
StaleOption = typer.Option(
    3, "--stale-intervals", min=1, help="as given to `trueup server run` (default 3)"
)


def fail(message: str, code: int = 1) -> typer.Exit:
    """`trueup server: MESSAGE` on stderr; the Exit to raise."""
    typer.echo(f"trueup server: {message}", err=True)
    return typer.Exit(code)


# Import names of the `server` extra's distributions (pyproject.toml).
_SERVER_EXTRA = ("sqlalchemy", "alembic", "psycopg", "cryptography")


def require_server_extra() -> None:
    """Fail with one clear line, not an ImportError traceback, without the `server` extra."""
    missing = [name for name in _SERVER_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise fail(
            "the control plane needs `pip install trueup[server]` "
            f"(not installed: {', '.join(missing)})"
        )


def key_file_for(db: str, key_file: Path | None) -> Path:
    """--key-file, else the file next to a SQLite database (PostgreSQL needs one named)."""
    require_server_extra()
    from trueup.server.db import normalise_url

    if key_file is not None:
        return key_file
    url = normalise_url(db)
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :] + ".key")
    raise fail(
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
    raise fail(f"{name}={value}: expected true or false")


def env_data_dir() -> Path | None:
    value = os.environ.get(DATA_DIR_ENV, "")
    return Path(value) if value else None


def open_plane(db: str, key_file: Path | None, *, stale_intervals: int = 3) -> ControlPlane:
    """The control plane over this database. Commands call it before importing from
    trueup.server, so a missing `server` extra is reported in one line."""
    require_server_extra()
    from trueup.server.db import Database, DatabaseURLError
    from trueup.server.keys import load_or_create_server_key
    from trueup.server.service import ControlPlane

    # The environment is checked before anything is opened: bad input changes nothing.
    create = _env_flag(CREATE_KEY_ENV, True)
    try:
        database = Database(db)
        key = load_or_create_server_key(
            key_file_for(db, key_file), create=create, data_dir=env_data_dir()
        )
        database.migrate()
    except (DatabaseURLError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    return ControlPlane(database, key, stale_intervals=stale_intervals)


def actor() -> str:
    """`cli:<login>`: who the audit log names for a command's writes."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return f"cli:uid{os.getuid()}"


def tenant_id(plane: ControlPlane, tenant: str) -> int:
    """The tenant's id; a missing tenant fails naming the command that creates it."""
    from trueup.server.service import NotFound

    try:
        return plane.tenant_id(tenant)
    except NotFound as exc:
        raise fail(f"{exc}; create it with `trueup server tenant create {tenant}`") from None


def certificate_fingerprint(cert_file: Path) -> str:
    """`sha256:<hex>` of the certificate's DER form (what the agent pins)."""
    require_server_extra()
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return sha256_digest(cert.public_bytes(Encoding.DER))


@dataclass(frozen=True)
class Admin:
    """One administration command's run: the control plane, who acts, what it says."""

    plane: ControlPlane

    @property
    def actor(self) -> str:
        return actor()

    def tenant(self, name: str) -> int:
        return tenant_id(self.plane, name)

    @staticmethod
    def say(text: str) -> None:
        typer.echo(text)

    @staticmethod
    def show(data: Mapping[str, Any], output: str, table: list[str] | Callable[[], str]) -> None:
        """With `-o table` the table (its lines, or what renders it); else `data` as JSON
        or YAML."""
        from trueup.cli.output import emit

        if output != "table":
            emit(data, output)
        elif callable(table):
            typer.echo(table())
        else:
            typer.echo("\n".join(table))


@contextmanager
def admin(db: str, key_file: Path | None, *, stale_intervals: int = 3) -> Iterator[Admin]:
    """Open the control plane and run a command's body; a refusal of the service is
    `trueup server: MESSAGE` and exit 1 (see the module docstring)."""
    plane = open_plane(db, key_file, stale_intervals=stale_intervals)
    from trueup.server.anchor import CheckpointError
    from trueup.server.service import ServiceError

    try:
        yield Admin(plane)
    except (ServiceError, CheckpointError) as exc:
        raise fail(str(exc)) from None
