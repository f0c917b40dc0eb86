"""Device labels: the service (audited, tenant-scoped), the API (422 naming `labels.<key>`,
selectors on the device list naming the position, roles), enrollment with labels, and
`trueup fleet label` / `trueup fleet list -l` end to end against a running server, and the
dashboard's label filter.

Why this module is over 400 lines: labels reach every surface of the control plane
(service, API, enrollment, both CLIs, the dashboard); one module keeps their tests side
by side, each short and on shared helpers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from tests.server.conftest import Server, ServerProcess, Tenant
from trueup.cli.main import app
from trueup.cli.server import server_app
from trueup.model.layering import parse_selector
from trueup.server.service import Invalid, NotFound
from trueup.server.tables import audit_log, device_labels


def labels_url(device: str) -> str:
    return f"/api/v1/devices/{device}/labels"


def label_entries(server: Server, tenant: Tenant) -> list[dict[str, Any]]:
    tenant_id = server.plane.tenant_id(tenant.name)
    entries = server.plane.audit_entries(tenant_id, 200)
    return [e for e in entries if e["action"] == "device.labels"]


def detail(entry: dict[str, Any]) -> dict[str, Any]:
    value = entry["detail"]
    return dict(json.loads(value) if isinstance(value, str) else value)


def label_rows(server: Server) -> int:
    with server.plane.db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(device_labels)).scalar_one())


def audit_rows(server: Server) -> int:
    with server.plane.db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(audit_log)).scalar_one())


# -- the service ---------------------------------------------------------------------------


def test_set_labels_replaces_merges_removes_and_audits_old_and_new(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    assert server.plane.labels(tenant_id, "edge-01") == {}
    result = server.plane.set_labels(
        tenant_id, "edge-01", {"site": "ams", "role": "edge"}, actor="alice"
    )
    assert result == {
        "device": "edge-01",
        "labels": {"role": "edge", "site": "ams"},
        "changed": True,
    }
    merged = server.plane.set_labels(
        tenant_id, "edge-01", {"tier": "gold"}, remove=["role"], merge=True, actor="bob"
    )
    assert merged["labels"] == {"site": "ams", "tier": "gold"}
    assert server.plane.labels(tenant_id, "edge-01") == {"site": "ams", "tier": "gold"}
    replaced = server.plane.set_labels(tenant_id, "edge-01", {"site": "fra"}, actor="carol")
    assert replaced["labels"] == {"site": "fra"}
    entries = label_entries(server, tenant)
    assert [e["actor"] for e in entries] == ["carol", "bob", "alice"]
    assert all(e["target"] == "device:edge-01" for e in entries)
    assert detail(entries[0])["old"] == {"site": "ams", "tier": "gold"}
    assert detail(entries[0])["new"] == {"site": "fra"}
    assert detail(entries[2])["old"] == {}
    # The same set again changes nothing and is not audited again.
    before = audit_rows(server)
    again = server.plane.set_labels(tenant_id, "edge-01", {"site": "fra"}, actor="dave")
    assert again["changed"] is False and audit_rows(server) == before


def test_bad_labels_change_nothing_and_name_the_key(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.set_labels(tenant_id, "edge-01", {"site": "ams"}, actor="alice")
    rows, entries = label_rows(server), audit_rows(server)
    with pytest.raises(Invalid) as caught:
        server.plane.set_labels(
            tenant_id, "edge-01", {"site": "fra", "bad key": "x", "role": "-edge"}, actor="a"
        )
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == ["labels.bad key", "labels.role"]
    assert "expected a label key" in problems[0] and "expected a label value" in problems[1]
    with pytest.raises(Invalid, match=r"labels\.site: both set and removed"):
        server.plane.set_labels(tenant_id, "edge-01", {"site": "x"}, remove=["site"], actor="a")
    with pytest.raises(Invalid, match="at most 64"):
        server.plane.set_labels(tenant_id, "edge-01", {f"k{i}": "v" for i in range(65)}, actor="a")
    assert server.plane.labels(tenant_id, "edge-01") == {"site": "ams"}
    assert (label_rows(server), audit_rows(server)) == (rows, entries)


def test_devices_matching_a_selector_stay_within_the_tenant(server: Server) -> None:
    a = server.tenant("a", devices=("edge-01", "edge-02", "core-01"))
    b = server.tenant("b", devices=("edge-09",))
    a_id, b_id = server.plane.tenant_id(a.name), server.plane.tenant_id(b.name)
    server.plane.set_labels(a_id, "edge-01", {"site": "ams", "role": "edge"}, actor="t")
    server.plane.set_labels(a_id, "edge-02", {"site": "fra", "role": "edge", "lab": ""}, actor="t")
    server.plane.set_labels(a_id, "core-01", {"site": "ams", "role": "core"}, actor="t")
    server.plane.set_labels(b_id, "edge-09", {"site": "ams", "role": "edge"}, actor="t")

    def names(text: str, tenant_id: int = a_id) -> list[str]:
        return [n for _, n, _ in server.plane.devices_matching(tenant_id, parse_selector(text))]

    assert names("") == ["core-01", "edge-01", "edge-02"]
    assert names("site=ams") == ["core-01", "edge-01"]
    assert names("role in (edge),!lab") == ["edge-01"]
    assert names("site!=ams") == ["edge-02"]
    assert names("site=ams", b_id) == ["edge-09"]
    matched = server.plane.devices_matching(a_id, parse_selector("lab"))
    assert matched[0][1:] == ("edge-02", {"lab": "", "role": "edge", "site": "fra"})
    with pytest.raises(NotFound):
        server.plane.labels(b_id, "edge-01")
    with pytest.raises(NotFound):
        server.plane.set_labels(b_id, "edge-01", {"site": "x"}, actor="t")
    assert server.plane.labels(a_id, "edge-01") == {"role": "edge", "site": "ams"}


def test_labels_given_at_creation_and_enrollment_are_audited(server: Server) -> None:
    tenant = server.tenant()
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.create_device(tenant_id, "edge-05", "alice", labels={"site": "ams"})
    server.plane.enroll(
        tenant_id, "edge-05", "bob", url="http://testserver", labels={"role": "edge"}
    )
    server.plane.enroll(tenant_id, "edge-06", "bob", url="http://testserver", labels={"x": "1"})
    assert server.plane.labels(tenant_id, "edge-05") == {"role": "edge", "site": "ams"}
    assert server.plane.labels(tenant_id, "edge-06") == {"x": "1"}
    entries = label_entries(server, tenant)
    assert [(e["actor"], e["target"]) for e in entries] == [
        ("bob", "device:edge-06"),
        ("bob", "device:edge-05"),
        ("alice", "device:edge-05"),
    ]
    with pytest.raises(Invalid, match=r"labels\.-x"):
        server.plane.enroll(tenant_id, "edge-07", "bob", url="http://x", labels={"-x": "1"})
    with pytest.raises(NotFound):
        server.plane.device_id(tenant_id, "edge-07")  # nothing was created


# -- the API --------------------------------------------------------------------------------


def test_labels_api_reads_replaces_and_merges(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    operator, viewer = tenant.auth("operator"), tenant.auth("viewer")
    put = server.client.put(
        labels_url("edge-01"), json={"site": "ams", "role": "edge"}, headers=operator
    )
    assert put.status_code == 200, put.text
    assert put.json()["labels"] == {"role": "edge", "site": "ams"}
    patch = server.client.patch(
        labels_url("edge-01"), json={"role": None, "tier": "gold"}, headers=operator
    )
    assert patch.status_code == 200, patch.text
    got = server.client.get(labels_url("edge-01"), headers=viewer)
    assert got.json() == {"device": "edge-01", "labels": {"site": "ams", "tier": "gold"}}
    # Viewers read; writing needs the role that writes desired state.
    refused = server.client.put(labels_url("edge-01"), json={}, headers=viewer)
    assert refused.status_code == 403
    assert "operator" in refused.json()["detail"]
    # A device created through the API may carry labels.
    created = server.client.post(
        "/api/v1/devices", json={"name": "edge-02", "labels": {"site": "fra"}}, headers=operator
    )
    assert created.status_code == 201, created.text
    assert created.json()["labels"] == {"site": "fra"}


def test_bad_labels_are_422_naming_the_key_and_nothing_changes(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    operator = tenant.auth("operator")
    server.client.put(labels_url("edge-01"), json={"site": "ams"}, headers=operator)
    before = audit_rows(server)
    bad = server.client.put(
        labels_url("edge-01"), json={"site": "fra", "Bad/role": "x", "tier": 3}, headers=operator
    )
    assert bad.status_code == 422, bad.text
    problems = bad.json()["problems"]
    assert any(p.startswith("labels.Bad/role: key prefix 'Bad'") for p in problems), problems
    assert any(p.startswith("labels.tier: value is not a string") for p in problems), problems
    not_object = server.client.put(labels_url("edge-01"), json=["site"], headers=operator)
    assert not_object.status_code == 422
    assert not_object.json()["problems"] == [
        "labels: expected a JSON object of label keys to string values"
    ]
    created = server.client.post(
        "/api/v1/devices", json={"name": "edge-03", "labels": {"a b": "c"}}, headers=operator
    )
    assert created.status_code == 422 and created.json()["problems"][0].startswith("labels.a b:")
    assert server.client.get("/api/v1/devices/edge-03", headers=operator).status_code == 404
    got = server.client.get(labels_url("edge-01"), headers=operator).json()
    assert got["labels"] == {"site": "ams"}
    assert audit_rows(server) == before


def test_device_list_filters_by_selector_and_shows_labels(server: Server) -> None:
    a = server.tenant("a", devices=("edge-01", "edge-02"))
    b = server.tenant("b", devices=("edge-01",))
    for tenant, device, labels in (
        (a, "edge-01", {"site": "ams"}),
        (a, "edge-02", {"site": "fra"}),
        (b, "edge-01", {"site": "ams", "secret": "b-only"}),
    ):
        response = server.client.put(
            labels_url(device), json=labels, headers=tenant.auth("operator")
        )
        assert response.status_code == 200, response.text

    def listed(tenant: Tenant, selector: str) -> dict[str, Any]:
        response = server.client.get(
            "/api/v1/devices", params={"selector": selector}, headers=tenant.auth("viewer")
        )
        assert response.status_code == 200, response.text
        return {d["device"]: d["labels"] for d in response.json()["devices"]}

    assert listed(a, "site=ams") == {"edge-01": {"site": "ams"}}
    assert listed(a, "site in (ams,fra)") == {
        "edge-01": {"site": "ams"},
        "edge-02": {"site": "fra"},
    }
    assert listed(a, "secret") == {}
    assert listed(b, "site=ams") == {"edge-01": {"secret": "b-only", "site": "ams"}}
    shown = server.client.get("/api/v1/devices/edge-01", headers=a.auth("viewer")).json()
    assert shown["labels"] == {"site": "ams"}
    bad = server.client.get(
        "/api/v1/devices", params={"selector": "site=ams,,"}, headers=a.auth("viewer")
    )
    assert bad.status_code == 422
    assert bad.json()["problems"] == [
        "query.selector: selector 'site=ams,,': at position 10: expected a label key, found ','"
    ]
    # Another tenant's device's labels are not found.
    other = server.client.get(labels_url("edge-02"), headers=b.auth("admin"))
    assert other.status_code == 404


# -- the CLI, against a running server --------------------------------------------------------


def _invoke(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_trueup_fleet_label_and_list_by_selector(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    key = ["--db", db, "--key-file", str(tmp_path / "server.key")]
    runner = CliRunner()
    assert runner.invoke(server_app, ["tenant", "create", "acme", *key]).exit_code == 0
    files = {}
    for role in ("viewer", "operator"):
        created = runner.invoke(
            server_app,
            ["token", "create", "--tenant", "acme", "--user", f"u-{role}", "--role", role, *key],
        )
        assert created.exit_code == 0, created.output
        files[role] = tmp_path / f"{role}.token"
        files[role].write_text(created.output.strip().splitlines()[-1].split()[-1] + "\n")
    enrolled = runner.invoke(
        server_app,
        [
            "device",
            "enroll",
            "--tenant",
            "acme",
            "--device",
            "edge-01",
            "--url",
            "http://127.0.0.1",
            "--out",
            str(tmp_path / "bundle.json"),
            "--label",
            "site=ams",
            "--label",
            "lab=",
            *key,
        ],
    )
    assert enrolled.exit_code == 0, enrolled.output
    refused = runner.invoke(
        server_app,
        [
            "device",
            "enroll",
            "--tenant",
            "acme",
            "--device",
            "edge-02",
            "--url",
            "http://x",
            "--out",
            str(tmp_path / "b2.json"),
            "--label",
            "bad key=x",
            *key,
        ],
    )
    assert refused.exit_code == 1 and "labels.bad key" in refused.output
    process = ServerProcess(db, tmp_path / "server.key").start()
    try:
        url = process.url
        auth = {"Authorization": f"Bearer {files['operator'].read_text().strip()}"}
        created = httpx.post(f"{url}/api/v1/devices", json={"name": "core-02"}, headers=auth)
        assert created.status_code == 201, created.text
        operator = {"TRUEUP_SERVER": url, "TRUEUP_TOKEN_FILE": str(files["operator"])}
        viewer = {"TRUEUP_SERVER": url, "TRUEUP_TOKEN_FILE": str(files["viewer"])}

        code, out, err = _invoke("fleet", "label", "edge-01", "role=edge", "lab-", env=operator)
        assert code == 0, err
        assert out.splitlines() == ["role=edge", "site=ams", "2 label(s) on edge-01 (changed)"]
        code, out, err = _invoke("fleet", "label", "core-02", "site=ams", "role=core", env=operator)
        assert code == 0, err
        code, out, err = _invoke("fleet", "label", "edge-01", env=viewer)
        assert code == 0 and out.splitlines()[:2] == ["role=edge", "site=ams"], err

        code, out, err = _invoke("fleet", "list", "-l", "site=ams,role in (edge)", env=viewer)
        assert code == 0, err
        header = out.splitlines()[0].split()
        assert header[-1] == "LABELS"
        rows = [line for line in out.splitlines()[1:] if line.startswith(("edge", "core"))]
        assert len(rows) == 1 and rows[0].startswith("edge-01")
        assert rows[0].endswith("role=edge,site=ams")
        code, out, err = _invoke("fleet", "--selector", "role=core", "-o", "json", env=viewer)
        assert code == 0, err
        body = json.loads(out)
        assert [(d["device"], d["labels"]) for d in body["devices"]] == [
            ("core-02", {"role": "core", "site": "ams"})
        ]
        listed = runner.invoke(
            server_app, ["fleet", "list", "--tenant", "acme", "-l", "role", *key]
        )
        assert listed.exit_code == 0 and listed.output.splitlines()[0].split()[-1] == "LABELS"
        assert len([line for line in listed.output.splitlines() if "role=" in line]) == 2

        # A viewer may not label; a bad selector or change names what is wrong, one line.
        code, _, err = _invoke("fleet", "label", "edge-01", "x=y", env=viewer)
        assert code == 1 and "operator" in err and err.count("\n") == 1
        code, _, err = _invoke("fleet", "list", "-l", "site in ams", env=viewer)
        assert code == 1 and "at position 9: expected '(' after 'in'" in err
        code, _, err = _invoke("fleet", "label", "edge-01", "site", env=operator)
        assert code == 1 and "expected KEY=VALUE to set a label or KEY- to remove it" in err
        code, _, err = _invoke("fleet", "label", "edge-01", "site=-x", env=operator)
        assert code == 1 and "labels.site: value '-x'" in err and err.count("\n") == 1
        code, out, _ = _invoke("fleet", "label", "edge-01", env=viewer)
        assert out.splitlines()[:2] == ["role=edge", "site=ams"]
    finally:
        process.stop()


# -- the dashboard's fleet table ----------------------------------------------------------------


def test_the_dashboard_filters_the_fleet_by_selector_and_shows_labels(server: Server) -> None:
    from tests.server.test_dashboard import browser

    tenant = server.tenant(devices=("edge-01", "edge-02"))
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.set_labels(tenant_id, "edge-01", {"site": "ams", "role": "edge"}, actor="t")
    server.plane.set_labels(tenant_id, "edge-02", {"site": "fra"}, actor="t")
    client = browser(server, tenant, "viewer")
    page = client.get("/", params={"selector": "site=ams"})
    assert page.status_code == 200, page.text
    assert 'data-device="edge-01"' in page.text and 'data-device="edge-02"' not in page.text
    assert (
        "<th>Labels</th>" in page.text
        and "<code>role=edge</code> <code>site=ams</code>" in page.text
    )
    assert 'name="selector" value="site=ams"' in page.text
    assert "selector=site%3Dams" in page.text  # the stream and the filter links keep it
    bad = client.get("/", params={"selector": "site in ams"})
    assert bad.status_code == 422
    assert "selector: selector &#x27;site in ams&#x27;: at position 9" in bad.text
    assert 'data-device="edge-01"' not in bad.text


def test_the_fleet_view_takes_a_selector_and_names_a_bad_one(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01", "edge-02"))
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.set_labels(tenant_id, "edge-01", {"site": "ams"}, actor="t")
    assert [e["device"] for e in server.plane.fleet(tenant_id, selector="!site")] == ["edge-02"]
    assert [e["device"] for e in server.plane.fleet(tenant_id, selector="")] == [
        "edge-01",
        "edge-02",
    ]
    entry = server.plane.device_view(tenant_id, "edge-01")
    assert entry["labels"] == {"site": "ams"}
    with pytest.raises(Invalid) as caught:
        server.plane.fleet(tenant_id, selector="site=ams)")
    assert caught.value.problems == [
        "selector: selector 'site=ams)': at position 9: expected ',' or the end of the "
        "selector, found ')'"
    ]


def test_label_changes_on_the_command_line_become_a_merge_patch() -> None:
    import typer

    from trueup.cli.fleet import label_changes, labels_text

    assert label_changes(["site=ams", "lab=", "old-", "example.com/tier=gold"]) == {
        "site": "ams",
        "lab": "",
        "old": None,
        "example.com/tier": "gold",
    }
    assert label_changes([]) == {}
    for bad in (["site"], ["-x=1"], ["site=a", "site=b"], ["a b=c"]):
        with pytest.raises(typer.Exit):
            label_changes(bad)
    assert labels_text({"site": "ams", "role": "edge"}) == "role=edge,site=ams"
    assert labels_text({}) == "-" and labels_text(None) == "-"


def test_enrollment_refuses_a_label_given_twice_with_two_values(tmp_path: Path) -> None:
    # As `trueup fleet label` does: `--label site=ams --label site=fra` is not "the last wins".
    db = f"sqlite:///{tmp_path}/server.db"
    key = ["--db", db, "--key-file", str(tmp_path / "server.key")]
    runner = CliRunner()
    assert runner.invoke(server_app, ["tenant", "create", "acme", *key]).exit_code == 0
    out = tmp_path / "bundle.json"
    enroll = ["device", "enroll", "--tenant", "acme", "--device", "edge-01"]
    enroll += ["--url", "http://127.0.0.1", "--out", str(out), *key]
    refused = runner.invoke(server_app, [*enroll, "--label", "site=ams", "--label", "site=fra"])
    assert refused.exit_code == 1, refused.output
    assert "'site' is given twice" in refused.output
    assert not out.exists()
    same = runner.invoke(server_app, [*enroll, "--label", "site=ams", "--label", "site=ams"])
    assert same.exit_code == 0, same.output
    assert out.exists()
