"""The fleet plan against a real server: per-device paths old -> new, refusals naming the
profile, the variable and the path, agents that lack a section never sent it, exit codes,
publishing with provenance, compatibility with devices that only have their own document.
Both databases."""

from __future__ import annotations

from typing import Any

from tests.server.conftest import Server, Tenant, document
from tests.server.test_api import put, report
from tests.server.test_profiles import profile, put_profile
from trueup.model.document import supported_sections


def plan(server: Server, tenant: Tenant, change: dict[str, Any] | None = None, **body: Any) -> Any:
    if change is not None:
        body["change"] = change
    response = server.client.post("/api/v1/plan", json=body, headers=tenant.auth("viewer"))
    assert response.status_code == 200, response.text
    return response.json()


def publish(server: Server, tenant: Tenant, **body: Any) -> Any:
    response = server.client.post(
        "/api/v1/plan/publish", json=body, headers=tenant.auth("operator")
    )
    assert response.status_code == 200, response.text
    return response.json()


def desired(server: Server, tenant: Tenant, device: str) -> Any:
    response = server.client.get(f"/api/v1/devices/{device}/desired", headers=tenant.auth("viewer"))
    assert response.status_code == 200, response.text
    return response.json()


def fleet_of(server: Server, *devices: str) -> Tenant:
    tenant = server.tenant(devices=devices)
    for device in devices:
        assert put(server, tenant, device, 0, document(device)).status_code == 201
    return tenant


def test_devices_with_only_their_own_document_are_unchanged(server: Server) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02")
    server.enroll(tenant, "edge-new")  # no desired revision, no inputs
    planned = plan(server, tenant)
    assert planned["targets"] == [] and planned["refused"] == []
    assert planned["counts"] == {"changed": 0, "refused": 0, "unchanged": 3}
    assert planned["exit_code"] == 0
    assert publish(server, tenant)["published"] == []
    assert desired(server, tenant, "edge-01")["version"] == 1


def test_a_proposed_profile_shows_each_devices_paths_old_to_new(server: Server) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02")
    planned = plan(server, tenant, {"kind": "profile", "document": profile(selector="")})
    assert planned["exit_code"] == 2, planned
    assert planned["counts"] == {"changed": 2, "refused": 0, "unchanged": 0}
    target = planned["targets"][0]
    assert target["device"] == "edge-01" and target["from_version"] == 1
    changes = {c["path"]: c for c in target["changes"]}
    assert "spec.interfaces[lan0]" in changes or "spec.interfaces" in changes, changes
    # The provenance names the profile at the version it would be stored as.
    assert target["provenance"]["profiles"] == [{"name": "edge-mtu", "version": 1}]
    # Nothing was stored by planning.
    assert server.client.get("/api/v1/profiles", headers=tenant.auth("viewer")).json() == {
        "profiles": []
    }
    assert desired(server, tenant, "edge-01")["version"] == 1


def test_a_variable_that_does_not_fit_is_refused_naming_profile_variable_and_path(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02")
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planned = plan(
        server, tenant, {"kind": "variables", "device": "edge-02", "variables": {"mtu": 100}}
    )
    assert planned["exit_code"] == 1, planned
    (refusal,) = planned["refused"]
    assert refusal["device"] == "edge-02" and refusal["kind"] == "render"
    text = " ".join(refusal["problems"])
    assert "variables.mtu" in text and "profile edge-mtu" in text and "variable mtu" in text, text
    # Only the device the change touches is rendered.
    assert planned["counts"] == {"changed": 0, "refused": 1, "unchanged": 1}


def test_an_agent_without_a_section_the_profile_uses_is_refused_and_never_sent_it(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-old", "edge-new")
    lacking = [s for s in supported_sections() if s != "interfaces"]
    report(
        server,
        tenant,
        "edge-old",
        applied_version=1,
        agent_version="0.9.0",
        supported_sections=lacking,
    )
    report(
        server,
        tenant,
        "edge-new",
        applied_version=1,
        agent_version="1.0.0",
        supported_sections=supported_sections(),
    )
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planned = plan(server, tenant)
    assert planned["exit_code"] == 1
    (refusal,) = planned["refused"]
    assert refusal["device"] == "edge-old" and refusal["kind"] == "agent-version"
    assert "spec.interfaces" in refusal["problems"][0] and "0.9.0" in refusal["problems"][0]
    assert [t["device"] for t in planned["targets"]] == ["edge-new"]
    published = publish(server, tenant, comment="mtu everywhere")
    assert published["published"] == [{"device": "edge-new", "version": 2}]
    assert desired(server, tenant, "edge-old")["version"] == 1
    waited = server.client.get(
        "/api/v1/agent/desired?after=1&wait=0", headers=tenant.device_auth("edge-old")
    )
    assert waited.status_code == 204  # the refused device is never sent the revision


def test_publishing_stores_provenance_and_keeps_the_old_document_as_the_own_layer(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-01")
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    published = publish(server, tenant, comment="first rendered")
    assert published["published"] == [{"device": "edge-01", "version": 2}]
    revision = desired(server, tenant, "edge-01")
    assert revision["provenance"]["profiles"] == [{"name": "edge-mtu", "version": 1}]
    assert revision["provenance"]["variables_digest"].startswith("sha256:")
    assert revision["comment"] == "first rendered"
    assert revision["document"]["spec"]["interfaces"][0]["mtu"] == 1500
    assert revision["document"]["spec"]["management"]["addresses"] == ["198.51.100.2/24"]
    inputs = server.client.get(
        "/api/v1/devices/edge-01/variables", headers=tenant.auth("viewer")
    ).json()
    assert inputs["version"] == 1 and inputs["own"]["management"]["interface"] == "mgmt0"
    assert "interfaces" not in inputs["own"]  # the profile's part is not frozen into it
    # A later profile change reaches the device.
    newer = profile(selector="", mtu_default=9000)
    assert put_profile(server, tenant, "edge-mtu", newer, "1").status_code == 201
    planned = plan(server, tenant)
    (target,) = planned["targets"]
    assert [(c["path"], c["old"], c["new"]) for c in target["changes"]] == [
        ("spec.interfaces[lan0].mtu", 1500, 9000)
    ]
    assert publish(server, tenant)["published"] == [{"device": "edge-01", "version": 3}]
    assert plan(server, tenant)["exit_code"] == 0


def test_a_device_changed_since_the_plan_is_refused_when_publishing(server: Server) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02")
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    shown = plan(server, tenant)
    expect = {t["device"]: t["digest"] for t in shown["targets"]}
    # edge-02 changes after the plan was shown: its rendered digest is no longer the one shown.
    changed = document("edge-02", address="198.51.100.3/24")
    assert put(server, tenant, "edge-02", 1, changed).status_code == 201
    published = publish(server, tenant, expect=expect)
    assert published["published"] == [{"device": "edge-01", "version": 2}]
    refused = {r["device"]: r for r in published["refused"]}
    assert refused["edge-02"]["kind"] == "changed"
    assert desired(server, tenant, "edge-02")["version"] == 2


def test_publishing_expects_the_planned_version(server: Server) -> None:
    tenant = fleet_of(server, "edge-01")
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planner = server.plane.planner
    tenant_id = server.plane.tenant_id(tenant.name)
    planned = planner.plan(tenant_id)
    assert put(server, tenant, "edge-01", 1, document("edge-01")).status_code == 201
    published = planner.publish(tenant_id, planned, actor="test")
    assert published.stored == ()
    (refusal,) = published.refused
    assert refusal.kind == "concurrent" and "STATE_CONCURRENT_MODIFICATION" in refusal.problems[0]


def test_a_plan_sees_only_its_own_tenant(server: Server) -> None:
    a = fleet_of(server, "edge-01")
    b = fleet_of(server, "edge-01")
    assert put_profile(server, a, "edge-mtu", profile(selector=""), "0").status_code == 201
    assert plan(server, a)["counts"]["changed"] == 1
    assert plan(server, b)["counts"] == {"changed": 0, "refused": 0, "unchanged": 1}
    missing = server.client.post(
        "/api/v1/plan",
        json={"change": {"kind": "profile-delete", "name": "edge-mtu"}},
        headers=b.auth("viewer"),
    )
    assert missing.status_code == 404


def test_a_bad_proposal_or_selector_is_refused_naming_its_path(server: Server) -> None:
    tenant = fleet_of(server, "edge-01")
    bad = profile()
    bad["spec"]["document"] = {"interfaces": [{"name": "lan0", "mtu": "${nosuch}"}]}
    response = server.client.post(
        "/api/v1/plan",
        json={"change": {"kind": "profile", "document": bad}, "selector": "site in ("},
        headers=tenant.auth("viewer"),
    )
    assert response.status_code == 422, response.text
    assert response.json()["problems"][0].startswith("body.selector:")
    response = server.client.post(
        "/api/v1/plan",
        json={"change": {"kind": "profile", "document": {"kind": "Profile"}}},
        headers=tenant.auth("viewer"),
    )
    assert response.status_code == 422
    assert all(p.startswith("change.document.") for p in response.json()["problems"])


def test_labels_decide_which_devices_a_profile_renders_and_a_label_change_is_planned(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02", "core-01")
    for device, labels in (("edge-01", {"site": "ams"}), ("core-01", {"site": "fra"})):
        response = server.client.put(
            f"/api/v1/devices/{device}/labels", json=labels, headers=tenant.auth("operator")
        )
        assert response.status_code == 200, response.text
    assert (
        put_profile(server, tenant, "edge-mtu", profile(selector="site=ams"), "0").status_code
        == 201
    )
    planned = plan(server, tenant)
    assert [t["device"] for t in planned["targets"]] == ["edge-01"]
    assert planned["counts"] == {"changed": 1, "refused": 0, "unchanged": 2}
    # A proposed label brings edge-02 in; only it is rendered.
    labelled = plan(
        server, tenant, {"kind": "labels", "device": "edge-02", "labels": {"site": "ams"}}
    )
    assert [t["device"] for t in labelled["targets"]] == ["edge-02"]
    assert labelled["counts"]["unchanged"] == 2
    # A proposed removal of edge-01's label takes it out again: its own document only.
    removed = plan(
        server, tenant, {"kind": "labels", "device": "edge-01", "labels": {"site": None}}
    )
    assert removed["exit_code"] == 0, removed
    # A selector limits the plan (and the publish) to the devices it picks.
    fra = plan(server, tenant, selector="site=fra")
    assert fra["counts"] == {"changed": 0, "refused": 0, "unchanged": 1}
    published = publish(server, tenant, selector="site in (ams)")
    assert published["published"] == [{"device": "edge-01", "version": 2}]
    bad = server.client.post(
        "/api/v1/plan",
        json={"change": {"kind": "labels", "device": "edge-02", "labels": {"-bad": "x"}}},
        headers=tenant.auth("viewer"),
    )
    assert bad.status_code == 422 and bad.json()["problems"][0].startswith("change.labels.-bad")


def test_an_agent_is_refused_only_for_sections_the_rendered_document_uses(
    server: Server,
) -> None:
    # An older agent that knows interfaces but none of the sections the profile leaves at
    # their defaults (convergence, tables, …): the canonical document names them, yet the
    # device can apply it.
    tenant = fleet_of(server, "edge-old")
    report(
        server,
        tenant,
        "edge-old",
        applied_version=1,
        agent_version="0.9.0",
        supported_sections=["management", "interfaces"],
    )
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planned = plan(server, tenant)
    assert planned["refused"] == [], planned["refused"]
    assert [t["device"] for t in planned["targets"]] == ["edge-old"]


def test_a_proposed_profile_is_shown_at_the_version_storing_it_would_give(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-01")
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    deleted = server.client.delete(
        "/api/v1/profiles/edge-mtu", headers={**tenant.auth("operator"), "If-Match": "1"}
    )
    assert deleted.status_code == 200 and deleted.json()["version"] == 2
    planned = plan(server, tenant, {"kind": "profile", "document": profile(selector="")})
    (target,) = planned["targets"]
    assert target["provenance"]["profiles"] == [{"name": "edge-mtu", "version": 3}]
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").json()["version"] == 3
    assert plan(server, tenant)["targets"][0]["digest"] == target["digest"]
