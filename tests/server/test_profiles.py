"""Profiles and device variables on the control plane: If-Match on every write, every version
kept, errors naming their paths, audited writes, tenants apart. Both databases."""

from __future__ import annotations

from typing import Any

from tests.server.conftest import Server, Tenant

PROFILES = "/api/v1/profiles"


def profile(
    name: str = "edge-mtu",
    *,
    selector: str = "site=ams",
    mtu_default: int = 1500,
    priority: int = 100,
    **document: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "Profile",
        "metadata": {"name": name, "priority": priority},
        "spec": {
            "selector": selector,
            "variables": {
                "mtu": {"type": "integer", "minimum": 1280, "maximum": 9000, "default": mtu_default}
            },
            "document": document
            or {"interfaces": [{"name": "lan0", "state": "up", "mtu": "${mtu}"}]},
        },
    }


def put_profile(
    server: Server,
    tenant: Tenant,
    name: str,
    body: Any,
    if_match: str | None,
    role: str = "operator",
) -> Any:
    headers = tenant.auth(role)
    if if_match is not None:
        headers["If-Match"] = if_match
    return server.client.put(f"{PROFILES}/{name}", json=body, headers=headers)


def test_a_profile_is_created_with_if_match_0_and_updated_only_at_its_version(
    server: Server,
) -> None:
    tenant = server.tenant()
    missing = put_profile(server, tenant, "edge-mtu", profile(), None)
    assert missing.status_code == 428, missing.text
    created = put_profile(server, tenant, "edge-mtu", profile(), "0")
    assert created.status_code == 201, created.text
    assert created.headers["ETag"] == '"1"'
    assert created.json()["version"] == 1
    assert created.json()["created_by"] == f"user:{tenant.name}/operator-user"
    again = put_profile(server, tenant, "edge-mtu", profile(), "0")
    assert again.status_code == 409, again.text
    assert again.json()["profile"] == "edge-mtu" and again.json()["current_version"] == 1
    assert again.json()["reason"] == "STATE_CONCURRENT_MODIFICATION"
    updated = put_profile(server, tenant, "edge-mtu", profile(mtu_default=9000), "1")
    assert updated.status_code == 201 and updated.json()["version"] == 2
    stale = put_profile(server, tenant, "edge-mtu", profile(mtu_default=1400), "1")
    assert stale.status_code == 409 and stale.json()["current_version"] == 2
    # Every version is kept and readable.
    versions = server.client.get(f"{PROFILES}/edge-mtu/versions", headers=tenant.auth("viewer"))
    assert [v["version"] for v in versions.json()["versions"]] == [1, 2]
    first = server.client.get(f"{PROFILES}/edge-mtu?version=1", headers=tenant.auth("viewer"))
    assert first.json()["document"]["spec"]["variables"]["mtu"]["default"] == 1500
    newest = server.client.get(f"{PROFILES}/edge-mtu", headers=tenant.auth("viewer"))
    assert newest.headers["ETag"] == '"2"'
    assert newest.json()["document"]["spec"]["variables"]["mtu"]["default"] == 9000
    listed = server.client.get(PROFILES, headers=tenant.auth("viewer")).json()["profiles"]
    assert [(p["name"], p["version"], p["selector"]) for p in listed] == [
        ("edge-mtu", 2, "site=ams")
    ]


def test_a_viewer_cannot_write_a_profile(server: Server) -> None:
    tenant = server.tenant()
    assert put_profile(server, tenant, "p1", profile("p1"), "0", role="viewer").status_code == 403
    gone = server.client.get(f"{PROFILES}/p1", headers=tenant.auth("viewer"))
    assert gone.status_code == 404


def test_a_bad_profile_is_refused_naming_each_path_and_nothing_is_stored(server: Server) -> None:
    tenant = server.tenant()
    bad = profile("bad")
    bad["spec"]["variables"]["mtu"]["type"] = "float"
    bad["spec"]["selector"] = "site in (ams"
    refused = put_profile(server, tenant, "bad", bad, "0")
    assert refused.status_code == 422, refused.text
    problems = " | ".join(refused.json()["problems"])
    assert "spec.variables.mtu" in problems and "spec.selector" in problems, problems
    assert server.client.get(f"{PROFILES}/bad", headers=tenant.auth("viewer")).status_code == 404
    other = put_profile(server, tenant, "not-this", profile("edge-mtu"), "0")
    assert other.status_code == 422
    assert "metadata.name" in other.json()["problems"][0]


def test_a_deleted_profile_keeps_its_versions_and_can_be_created_again(server: Server) -> None:
    tenant = server.tenant()
    assert put_profile(server, tenant, "p1", profile("p1"), "0").status_code == 201
    headers = tenant.auth("operator")
    assert server.client.delete(f"{PROFILES}/p1", headers=headers).status_code == 428
    stale = server.client.delete(f"{PROFILES}/p1", headers={**headers, "If-Match": "7"})
    assert stale.status_code == 409
    deleted = server.client.delete(f"{PROFILES}/p1", headers={**headers, "If-Match": "1"})
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert deleted.json()["version"] == 2
    assert server.client.get(f"{PROFILES}/p1", headers=headers).status_code == 404
    assert server.client.get(PROFILES, headers=headers).json()["profiles"] == []
    kept = server.client.get(f"{PROFILES}/p1?version=1", headers=headers)
    assert kept.status_code == 200 and kept.json()["deleted"] is False
    again = put_profile(server, tenant, "p1", profile("p1"), "0")
    assert again.status_code == 201 and again.json()["version"] == 3


def test_profiles_and_variables_stay_in_their_tenant(server: Server) -> None:
    a = server.tenant("a", devices=("edge-01",))
    b = server.tenant("b", devices=("edge-01",))
    assert put_profile(server, a, "only-a", profile("only-a"), "0").status_code == 201
    assert server.client.get(f"{PROFILES}/only-a", headers=b.auth("admin")).status_code == 404
    assert server.client.get(PROFILES, headers=b.auth("admin")).json()["profiles"] == []
    assert put_profile(server, b, "only-a", profile("only-a"), "1").status_code == 404
    put = server.client.put(
        "/api/v1/devices/edge-01/variables",
        json={"variables": {"mtu": 9000}},
        headers={**a.auth("operator"), "If-Match": "0"},
    )
    assert put.status_code == 200, put.text
    seen = server.client.get("/api/v1/devices/edge-01/variables", headers=b.auth("admin"))
    assert seen.json()["variables"] == {} and seen.json()["version"] == 0


def test_device_variables_need_if_match_and_refuse_bad_names(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    url = "/api/v1/devices/edge-01/variables"
    headers = tenant.auth("operator")
    body = {"variables": {"mtu": 9000}, "own": {"routes": []}}
    assert server.client.put(url, json=body, headers=headers).status_code == 428
    first = server.client.put(url, json=body, headers={**headers, "If-Match": "0"})
    assert first.status_code == 200 and first.headers["ETag"] == '"1"'
    stale = server.client.put(url, json=body, headers={**headers, "If-Match": "0"})
    assert stale.status_code == 409 and stale.json()["current_version"] == 1
    assert "variables of device edge-01" in stale.json()["detail"]
    bad = server.client.put(
        url,
        json={"variables": {"1x": 1}, "own": {"nosuch": {}}},
        headers={**headers, "If-Match": "1"},
    )
    assert bad.status_code == 422
    problems = bad.json()["problems"]
    assert any(p.startswith("variables.1x:") for p in problems), problems
    assert any(p.startswith("own.nosuch:") for p in problems), problems
    shown = server.client.get(url, headers=tenant.auth("viewer")).json()
    assert shown["variables"] == {"mtu": 9000} and shown["own"] == {"routes": []}
    assert shown["version"] == 1


def test_every_profile_and_variables_write_is_audited(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert put_profile(server, tenant, "p1", profile("p1"), "0").status_code == 201
    assert (
        put_profile(server, tenant, "p1", profile("p1", mtu_default=1400), "1").status_code == 201
    )
    deleted = server.client.delete(
        f"{PROFILES}/p1", headers={**tenant.auth("operator"), "If-Match": "2"}
    )
    assert deleted.status_code == 200
    put = server.client.put(
        "/api/v1/devices/edge-01/variables",
        json={"variables": {"mtu": 9000}},
        headers={**tenant.auth("operator"), "If-Match": "0"},
    )
    assert put.status_code == 200
    entries = server.client.get("/api/v1/audit", headers=tenant.auth("admin")).json()["entries"]
    actions = [(e["action"], e["target"]) for e in entries]
    for expected in (
        ("profile.create", "profile:p1"),
        ("profile.update", "profile:p1"),
        ("profile.delete", "profile:p1"),
        ("device.variables", "device:edge-01"),
    ):
        assert expected in actions, actions


def test_of_concurrent_writers_of_one_version_exactly_one_wins(server: Server) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from trueup.server.service import Conflict

    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)

    def create(i: int) -> str:
        try:
            server.plane.put_profile(tenant_id, "race", 0, profile("race"), actor=f"w{i}")
        except Conflict:
            return "conflict"
        return "stored"

    def update(i: int) -> str:
        body = profile("race", mtu_default=1400 + i)
        try:
            server.plane.put_profile(tenant_id, "race", 1, body, actor=f"w{i}")
        except Conflict:
            return "conflict"
        return "stored"

    def set_variables(i: int) -> str:
        try:
            server.plane.put_device_variables(
                tenant_id, "edge-01", 0, variables={"mtu": 1400 + i}, own=None, actor=f"w{i}"
            )
        except Conflict:
            return "conflict"
        return "stored"

    for writer in (create, update, set_variables):
        with ThreadPoolExecutor(8) as pool:
            outcomes = sorted(pool.map(writer, range(8)))
        assert outcomes == ["conflict"] * 7 + ["stored"], (writer.__name__, outcomes)
    assert [v.version for v in server.plane.profile_history(tenant_id, "race")] == [1, 2]
    assert server.plane.device_variables(tenant_id, "edge-01").version == 1
