"""Database engines: SQLite (the default; WAL, writes serialised) and PostgreSQL (psycopg 3).

`Database.write()` opens a write transaction. On SQLite it is `BEGIN IMMEDIATE`
behind a process-wide lock, so writers queue instead of failing with "database is
locked" and a compare-and-set sees the latest committed row; readers use plain
deferred transactions and never wait for writers (WAL). On PostgreSQL both are
ordinary READ COMMITTED transactions; compare-and-set updates re-check their
WHERE clause after a row lock, which is what makes If-Match safe across
several server processes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import NullPool

__all__ = [
    "Database",
    "DatabaseURLError",
    "is_transient",
    "is_unavailable",
    "normalise_url",
    "original_error",
]

_MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x74727565  # "true": serialises migrations of concurrently starting servers


# SQLite's primary result codes that say the database, not a report, is at fault.
_SQLITE_UNAVAILABLE = {
    5,  # SQLITE_BUSY
    6,  # SQLITE_LOCKED
    7,  # SQLITE_NOMEM
    8,  # SQLITE_READONLY
    10,  # SQLITE_IOERR
    11,  # SQLITE_CORRUPT
    13,  # SQLITE_FULL
    14,  # SQLITE_CANTOPEN
    15,  # SQLITE_PROTOCOL
    26,  # SQLITE_NOTADB
}


def original_error(exc: BaseException) -> BaseException | None:
    return exc.orig if isinstance(exc, sa_exc.DBAPIError) else None


def is_transient(exc: BaseException) -> bool:
    """A deadlock or serialization failure: the same transaction may well succeed again."""
    return isinstance(original_error(exc), psycopg.errors.TransactionRollback)


def is_unavailable(exc: BaseException) -> bool:
    """The database cannot be reached or refuses all work: no report is at fault."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True
    orig = original_error(exc)
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        return code is None or code & 0xFF in _SQLITE_UNAVAILABLE
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return not is_transient(exc)
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


class DatabaseURLError(ValueError):
    pass


def normalise_url(url: str) -> str:
    """Accept `sqlite:///PATH` and `postgresql://…`; return the SQLAlchemy URL to use."""
    if url.startswith("sqlite:///"):
        if url == "sqlite:///" or url.startswith("sqlite:///:memory:"):
            raise DatabaseURLError(
                f"--db {url}: an in-memory database cannot be shared; name a file (sqlite:///PATH)"
            )
        return url
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise DatabaseURLError(
        f"--db {url}: unsupported database URL; use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


def _sqlite_engine(url: str, immediate: bool) -> Engine:
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 60},
        poolclass=NullPool if immediate else None,
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before the response that depends on it is sent.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _private_sqlite_files(path: Path) -> None:
    """Create the database file 0600 (it holds token hashes and sealed secrets), and narrow
    an existing one and its -wal/-shm. SQLite gives -wal and -shm the database's mode."""
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if file.stat().st_mode & 0o077:
                os.chmod(file, 0o600)
        except FileNotFoundError:
            pass


class Database:
    """Engines for one database URL, plus the schema migrations."""

    def __init__(self, url: str) -> None:
        self.url = normalise_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        if self.is_sqlite:
            path = Path(self.url[len("sqlite:///") :])
            if not path.parent.is_dir():
                raise DatabaseURLError(f"--db {url}: directory {path.parent} does not exist")
            _private_sqlite_files(path)
            self._reader = _sqlite_engine(self.url, immediate=False)
            self._writer = _sqlite_engine(self.url, immediate=True)
        else:
            self._reader = create_engine(
                self.url, pool_size=10, max_overflow=30, pool_pre_ping=True
            )
            self._writer = self._reader
        self._write_lock = threading.Lock() if self.is_sqlite else None

    @property
    def engine(self) -> Engine:
        return self._writer

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._reader.begin() as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        if self._write_lock is None:
            with self._writer.begin() as conn:
                yield conn
            return
        with self._write_lock, self._writer.begin() as conn:
            yield conn

    def migrate(self) -> None:
        """Bring the schema to the newest migration. Safe when several servers start at once."""
        config = Config()
        config.set_main_option("script_location", str(_MIGRATIONS))
        with self.write() as conn:
            if not self.is_sqlite:
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def dispose(self) -> None:
        self._reader.dispose()
        if self._writer is not self._reader:
            self._writer.dispose()
