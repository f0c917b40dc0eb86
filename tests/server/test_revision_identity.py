"""Revision identity in the control plane: migration 0002 and the `trueup server fleet` view.

(The API, derivation and report tests are in test_api.py, test_fleet.py and
test_cpclient.py.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, select
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, create_pg_database, document, drop_pg_database
from trueup.cli.server import server_app
from trueup.server.db import _MIGRATIONS, Database
from trueup.server.ingest import PendingReport, ReportIngest
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tables import device_reports, device_state

OTHER = "sha256:" + "f" * 64
NEW_COLUMNS = {"applied_digest", "applied_origin", "override"}


def _alembic(database: Database, action: str, target: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    with database.write() as conn:
        config.attributes["connection"] = conn
        getattr(command, action)(config, target)


@pytest.mark.parametrize("backend", BACKENDS)
def test_migration_0002_keeps_existing_reports_and_downgrades(backend: str, tmp_path: Path) -> None:
    name = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/m.db"
    else:
        name = create_pg_database()
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    database = Database(url)
    try:
        _alembic(database, "upgrade", "0001")
        with database.write() as conn:
            conn.exec_driver_sql("INSERT INTO tenants (id, name, created_at) VALUES (1, 't', 0)")
            conn.exec_driver_sql(
                "INSERT INTO devices (id, tenant_id, name, created_at, desired_version) "
                "VALUES (1, 1, 'edge-01', 0, 1)"
            )
            conn.exec_driver_sql(
                "INSERT INTO device_state (device_id, last_report_at, applied_version, "
                "reason_codes, report, heartbeat_interval) VALUES (1, 5, 1, '[]', '{}', 30)"
            )
            conn.exec_driver_sql(
                "INSERT INTO device_reports (device_id, received_at, applied_version, payload) "
                "VALUES (1, 5, 1, '{}')"
            )
        database.migrate()  # 0001 -> head
        with database.read() as conn:
            state = conn.execute(select(device_state)).mappings().one()
            history = conn.execute(select(device_reports)).mappings().one()
        assert state["applied_version"] == 1 and history["applied_version"] == 1
        for row in (state, history):
            assert {column: row[column] for column in NEW_COLUMNS} == dict.fromkeys(NEW_COLUMNS)
        _alembic(database, "downgrade", "0001")
        with database.engine.connect() as conn:
            inspector = inspect(conn)
            for table in ("device_state", "device_reports"):
                columns = {c["name"] for c in inspector.get_columns(table)}
                assert not columns & NEW_COLUMNS, table
        with database.read() as conn:
            assert conn.exec_driver_sql("SELECT applied_version FROM device_state").scalar() == 1
        database.migrate()
    finally:
        database.dispose()
        if name:
            drop_pg_database(name)


def test_fleet_cli_shows_digest_match_and_local_override(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    database = Database(db)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(Path(f"{tmp_path}/server.db.key")))
    tenant_id = plane.create_tenant("acme", "test")
    digests = {}
    for device in ("edge-01", "edge-02", "edge-03"):
        plane.create_device(tenant_id, device, "test")
        digests[device] = plane.put_desired(
            tenant_id, device, 0, document(device), author="test"
        ).content_hash
    override = {
        "version": 2,
        "actor": "root",
        "at": "2025-01-02T03:04:05Z",
        "reason": "hotfix",
        "digest": OTHER,
    }
    now = time.time()
    reports = {
        "edge-01": {"applied_version": 1, "applied_digest": digests["edge-01"]},
        "edge-02": {"applied_version": 1, "applied_digest": OTHER, "applied_origin": "local-file"},
        "edge-03": {
            "applied_version": 2,
            "applied_digest": OTHER,
            "applied_origin": "local-cli",
            "override": override,
        },
    }
    ReportIngest(database, mode="naive").write_batch(
        [
            PendingReport(plane.device_id(tenant_id, device), now, payload)
            for device, payload in reports.items()
        ]
    )
    database.dispose()
    runner = CliRunner()

    listed = runner.invoke(server_app, ["fleet", "list", "--tenant", "acme", "--db", db])
    assert listed.exit_code == 0, listed.output
    lines = {line.split()[0]: line.split() for line in listed.output.splitlines()[1:]}
    assert listed.output.splitlines()[0].split()[:5] == [
        "DEVICE",
        "STATUS",
        "DESIRED",
        "APPLIED",
        "DIGEST",
    ]
    assert lines["edge-01"][1:5] == ["in_sync", "1", "1", "✓"]
    assert lines["edge-02"][1:5] == ["version_skew", "1", "1", "✗"]
    assert lines["edge-03"][1:6] == ["local_override", "1", "2", "✗", "local-cli"]

    only = runner.invoke(
        server_app,
        [
            "fleet",
            "list",
            "--tenant",
            "acme",
            "--status",
            "local_override",
            "-o",
            "json",
            "--db",
            db,
        ],
    )
    assert only.exit_code == 0, only.output
    body = json.loads(only.output)
    assert [d["device"] for d in body["devices"]] == ["edge-03"]
    assert body["devices"][0]["override"] == override

    shown = runner.invoke(server_app, ["fleet", "show", "edge-02", "--tenant", "acme", "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "same version number, different document" in shown.output
    assert digests["edge-02"] in shown.output and OTHER in shown.output
    local = runner.invoke(server_app, ["fleet", "show", "edge-03", "--tenant", "acme", "--db", db])
    assert local.exit_code == 0, local.output
    assert "status:        local_override" in local.output
    assert "override:      local version 2 by root at 2025-01-02T03:04:05Z" in local.output
    assert "reason: hotfix" in local.output

    missing = runner.invoke(server_app, ["fleet", "show", "nope", "--tenant", "acme", "--db", db])
    assert missing.exit_code == 1 and "not found" in missing.output
