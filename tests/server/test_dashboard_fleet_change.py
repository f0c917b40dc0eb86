"""The dashboard's fleet-change pages over HTTP: profiles, the plan of an edit, rollouts.

Roles (viewer reads and plans, operator saves and drives rollouts), CSRF, tenants, the
label filter of the fleet, the plan's paths and refusals, a rollout started from the plan
and driven by simulated agents reporting through the real agent API."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.server.conftest import Server, Tenant
from tests.server.rolloutsim import SimAgent, initial, wait_for
from tests.server.test_dashboard import browser, csrf_of
from tests.server.test_profiles import profile
from trueup.server.service import NotFound

FAST_ROLLOUT = [("sqlite", {"rollout_tick_seconds": 0.05})]


def _fleet(server: Server, count: int = 3, prefix: str = "fc") -> tuple[Tenant, list[SimAgent]]:
    """A tenant with `count` labelled devices, each with its own document and the profile
    `edge-mtu` (site=ams, lan0 MTU 1500) published to it, and a simulated agent that
    applied that revision."""
    names = [f"edge-{i:02d}" for i in range(count)]
    tenant = server.tenant(prefix, devices=tuple(names))
    tenant_id = server.plane.tenant_id(tenant.name)
    agents = []
    for i, name in enumerate(names):
        server.plane.set_labels(
            tenant_id, name, {"site": "ams", "role": "canary" if i == 0 else "edge"}, actor="t"
        )
        server.plane.put_desired(tenant_id, name, 0, initial(name), author="test")
        agents.append(SimAgent(server.client, name, tenant.devices[name]))
    server.plane.put_profile(tenant_id, "edge-mtu", 0, profile(), actor="test")
    published = server.plane.publish_plan(tenant_id, server.plane.plan(tenant_id), actor="test")
    assert len(published.stored) == count
    for agent in agents:
        assert agent.poll()
    return tenant, agents


def _edit(mtu: int | str) -> str:
    return yaml.safe_dump(profile(mtu_default=mtu), sort_keys=False)  # type: ignore[arg-type]


def _plan(client: TestClient, text: str, expected: int = 1) -> Any:
    csrf = csrf_of(client.get("/ui/profiles/edge-mtu").text)
    return client.post("/ui/plan", data={"csrf": csrf, "document": text, "expected": str(expected)})


def test_every_page_renders_for_a_viewer_with_labels_on_its_inputs(server: Server) -> None:
    tenant, _agents = _fleet(server, 2)
    client = browser(server, tenant, "viewer")
    for path in ("/ui/profiles", "/ui/profiles/edge-mtu", "/ui/plan", "/ui/rollouts"):
        page = client.get(path)
        assert page.status_code == 200, (path, page.text)
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "<script>" not in page.text  # no inline script (the CSP would refuse it)
        for field in re.findall(r'<(?:input|textarea)[^>]*id="([^"]+)"', page.text):
            assert f'for="{field}"' in page.text, (path, field)
    listing = client.get("/ui/profiles").text
    assert ">edge-mtu</a>" in listing and "<code>site=ams</code>" in listing
    assert 'href="/?selector=site%3Dams">2</a>' in listing  # the devices it selects
    shown = client.get("/ui/profiles/edge-mtu").text
    assert "Devices it selects (2)" in shown and "/ui/devices/edge-01" in shown
    assert "<code>mtu</code></td><td>integer</td>" in shown  # its variables schema
    assert 'name="expected" value="1"' in shown and 'for="profile-document"' in shown
    assert 'value="save"' not in shown  # a viewer plans, never saves
    assert client.get("/ui/profiles/nope").status_code == 404


def test_the_fleet_filters_by_selector_and_names_the_position_of_a_bad_one(
    server: Server,
) -> None:
    tenant, _agents = _fleet(server, 3)
    client = browser(server, tenant, "viewer")
    page = client.get("/", params={"selector": "site=ams,role in (canary)"})
    assert page.status_code == 200
    assert 'data-device="edge-00"' in page.text and 'data-device="edge-01"' not in page.text
    assert "<th>Labels</th>" in page.text and "<code>role=canary</code>" in page.text
    assert 'href="/ui/plan?selector=site%3Dams%2Crole+in+%28canary%29"' in page.text
    bad = client.get("/", params={"selector": "role in canary"})
    assert bad.status_code == 422 and "at position" in bad.text
    assert 'data-device="edge-00"' not in bad.text


def test_saving_a_profile_needs_csrf_and_the_operator_role_and_keeps_the_draft(
    server: Server,
) -> None:
    tenant, _agents = _fleet(server, 1)
    tenant_id = server.plane.tenant_id(tenant.name)
    viewer = browser(server, tenant, "viewer")
    form = {"document": _edit(1400), "expected": "1", "comment": "mtu 1400"}
    csrf = csrf_of(viewer.get("/ui/profiles/edge-mtu").text)
    assert viewer.post("/ui/profiles", data={**form, "csrf": csrf}).status_code == 403
    operator = browser(server, tenant, "operator")
    assert operator.post("/ui/profiles", data=form).status_code == 403  # no CSRF token
    assert server.plane.profile(tenant_id, "edge-mtu").version == 1
    csrf = csrf_of(operator.get("/ui/profiles/edge-mtu").text)
    saved = operator.post("/ui/profiles", data={**form, "csrf": csrf}, follow_redirects=False)
    assert saved.status_code == 303 and saved.headers["location"].endswith("saved=2")
    assert server.plane.profile(tenant_id, "edge-mtu").version == 2
    # A stale version: 409, the draft and the comment kept.
    stale = operator.post("/ui/profiles", data={**form, "csrf": csrf, "document": _edit(1300)})
    assert stale.status_code == 409 and "STATE_CONCURRENT_MODIFICATION" in stale.text
    assert "default: 1300" in html.unescape(stale.text)
    assert 'value="mtu 1400"' in stale.text
    # A bad variable: 422 naming the path, nothing stored.
    bad = operator.post(
        "/ui/profiles", data={**form, "csrf": csrf, "expected": "2", "document": _edit("x")}
    )
    assert bad.status_code == 422 and "spec.variables.mtu" in html.unescape(bad.text)
    assert "default: x" in html.unescape(bad.text)
    assert server.plane.profile(tenant_id, "edge-mtu").version == 2


def test_the_plan_shows_each_devices_paths_and_the_refusals_with_their_reasons(
    server: Server,
) -> None:
    tenant, _agents = _fleet(server, 2)
    tenant_id = server.plane.tenant_id(tenant.name)
    # the stored profile says what the devices have: the plan of the stored inputs is empty
    stored = browser(server, tenant, "viewer").get("/ui/plan")
    assert stored.status_code == 200 and "0 — no device would change" in stored.text
    assert 'id="rollout-form"' not in stored.text
    bad = browser(server, tenant, "viewer").get("/ui/plan", params={"selector": "site in ams"})
    assert bad.status_code == 422 and "selector: selector" in bad.text and "position" in bad.text
    client = browser(server, tenant, "viewer")
    assert client.post("/ui/plan", data={"document": _edit(1400)}).status_code == 403
    page = _plan(client, _edit(1400))
    assert page.status_code == 200, page.text
    text = html.unescape(page.text)
    assert "Plan of profile edge-mtu as edited" in text
    assert re.search(r"<dt>Changed</dt><dd>2</dd>", text)
    assert "spec.interfaces[lan0].mtu</code>: <code>1500</code> → <code>1400</code>" in text
    assert "2 — devices would change, none refuses" in text
    assert "rolling a change out needs the operator role" in text  # a viewer plans only
    assert server.plane.profile(tenant_id, "edge-mtu").version == 1  # planning stores nothing
    # A device whose own layer makes the render invalid is refused, with the reason.
    inputs = server.plane.device_variables(tenant_id, "edge-01")
    server.plane.put_device_variables(
        tenant_id, "edge-01", inputs.version, variables={"mtu": 100}, own=inputs.own, actor="t"
    )
    refused = html.unescape(_plan(client, _edit(1400)).text)
    assert 'data-device="edge-01"><td>edge-01</td><td>render</td>' in refused
    assert "spec.variables.mtu" in refused or "mtu" in refused.split("Refused")[1]
    assert "1 — some devices refuse the change" in refused
    # A bad edit is shown on the edit form with the text kept.
    bad = _plan(client, _edit("x"))
    assert bad.status_code == 422 and "cannot plan it" in bad.text
    assert "default: x" in html.unescape(bad.text)


def test_tenants_never_see_each_others_profiles_or_rollouts(server: Server) -> None:
    tenant, _agents = _fleet(server, 1)
    other = server.tenant("other")
    client = browser(server, other, "operator")
    assert "edge-mtu" not in client.get("/ui/profiles").text
    assert client.get("/ui/profiles/edge-mtu").status_code == 404
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.put_profile(tenant_id, "edge-mtu", 1, profile(mtu_default=1400), actor="t")
    plan = server.plane.plan(tenant_id)
    started = server.plane.start_rollout(tenant_id, plan, actor="test")
    rid = started["id"]
    assert client.get(f"/ui/rollouts/{rid}").status_code == 404
    assert client.get(f"/ui/rollouts/{rid}/stream").status_code == 404
    assert f"rollout {rid}" not in client.get("/ui/rollouts").text
    csrf = csrf_of(client.get("/ui/rollouts").text)
    refused = client.post(f"/ui/rollouts/{rid}/actions/abort", data={"csrf": csrf, "reason": "x"})
    assert refused.status_code == 404
    assert server.plane.rollout(tenant_id, rid)["state"] != "aborted"


@pytest.mark.parametrize("isolated_server", FAST_ROLLOUT, indirect=True)
def test_a_rollout_started_from_the_plan_goes_canary_first_and_its_controls_work(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, agents = _fleet(server, 5)
    tenant_id = server.plane.tenant_id(tenant.name)
    operator = browser(server, tenant, "operator")
    page = _plan(operator, _edit(1400))
    assert 'id="rollout-form"' in page.text
    digest = re.search(r'name="plan_digest" value="(sha256:[0-9a-f]{64})"', page.text)
    assert digest is not None  # the plan shown, which the rollout must still be
    form = {
        "plan_digest": digest.group(1),
        "csrf": csrf_of(page.text),
        "document": _edit(1400),
        "expected": "1",
        "comment": "mtu 1400",
        "selector": "",
        "canary_selector": "role=canary",
        "percents": "50, 100",
        "max_unavailable": "2",
        "soak_seconds": "0",
        "failure_budget": "0",
        "confirm_within": "",
        "approval": "1",
        "reason": "mtu 1400 everywhere",
    }
    viewer = browser(server, tenant, "viewer")
    viewer_csrf = csrf_of(viewer.get("/ui/plan").text)
    assert viewer.post("/ui/rollouts", data={**form, "csrf": viewer_csrf}).status_code == 403
    assert operator.post("/ui/rollouts", data={**form, "csrf": "forged"}).status_code == 403
    bad = operator.post("/ui/rollouts", data={**form, "percents": "50, 500"})
    assert bad.status_code == 422 and "percents: &#x27;500&#x27;" in bad.text
    assert 'value="50, 500"' in bad.text  # the form kept as typed
    selector = operator.post("/ui/rollouts", data={**form, "canary_selector": "role in canary"})
    assert selector.status_code == 422 and "canary_selector: " in selector.text
    assert "position" in selector.text
    assert server.plane.profile(tenant_id, "edge-mtu").version == 1  # nothing stored
    stale = operator.post("/ui/rollouts", data={**form, "plan_digest": "sha256:" + "0" * 64})
    assert stale.status_code == 409 and "the plan changed since it was shown" in stale.text
    assert server.plane.rollouts(tenant_id) == []
    assert server.plane.profile(tenant_id, "edge-mtu").version == 2  # the edit was stored
    form["expected"] = "2"
    started = operator.post("/ui/rollouts", data=form, follow_redirects=False)
    assert started.status_code == 303, started.text
    rid = int(started.headers["location"].split("/")[-1].split("?")[0])
    assert server.plane.profile(tenant_id, "edge-mtu").version == 3
    view = server.plane.rollout(tenant_id, rid)
    assert [w["members"] for w in view["waves"]] == [1, 2, 2]
    assert [m["device"] for m in view["members"] if m["wave"] == 0] == ["edge-00"]

    def poll_until(state: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            for agent in agents:
                agent.poll()
            now = server.plane.rollout(tenant_id, rid)
            return now if now["state"] == state else None

        return dict(wait_for(reached, f"rollout {rid} {state}"))

    waiting = poll_until("waiting-approval")
    assert waiting["current_wave"] == 0 and agents[0].received[-1] > 1
    assert all(len(a.received) == 1 for a in agents[1:])  # nothing beyond the canary yet
    shown = operator.get(f"/ui/rollouts/{rid}")
    assert shown.status_code == 200 and 'id="rollout-live"' in shown.text
    assert 'data-device="edge-00" data-state="passed"' in shown.text
    assert f'action="/ui/rollouts/{rid}/actions/approve"' in shown.text
    assert 'aria-live="polite"' in shown.text
    # A viewer sees the rollout but no control, and cannot approve.
    seen = viewer.get(f"/ui/rollouts/{rid}").text
    assert "/approve" not in seen and "needs the operator role" in seen
    assert viewer.post(
        f"/ui/rollouts/{rid}/actions/approve", data={"csrf": viewer_csrf}
    ).status_code == (403)
    csrf = csrf_of(shown.text)
    assert operator.post(f"/ui/rollouts/{rid}/actions/approve", data={}).status_code == 403
    wrong = operator.post(f"/ui/rollouts/{rid}/actions/resume", data={"csrf": csrf})
    assert wrong.status_code == 409 and "possible only while it is paused" in wrong.text
    approved = operator.post(
        f"/ui/rollouts/{rid}/actions/approve", data={"csrf": csrf}, follow_redirects=False
    )
    assert approved.status_code == 303
    paused = operator.post(
        f"/ui/rollouts/{rid}/actions/pause",
        data={"csrf": csrf, "reason": "lunch"},
        follow_redirects=False,
    )
    assert paused.status_code == 303
    assert server.plane.rollout(tenant_id, rid)["state"] == "paused"
    assert "lunch" in operator.get(f"/ui/rollouts/{rid}").text
    resumed = operator.post(f"/ui/rollouts/{rid}/actions/resume", data={"csrf": csrf})
    assert resumed.status_code == 200  # followed to the rollout page
    poll_until("waiting-approval")
    operator.post(f"/ui/rollouts/{rid}/actions/approve", data={"csrf": csrf})
    done = poll_until("completed")
    assert all(m["state"] == "passed" for m in done["members"])
    assert "completed" in operator.get("/ui/rollouts").text
    actions = [e["action"] for e in server.plane.audit_entries(tenant_id, limit=1000)]
    for action in ("profile.update", "rollout.start", "rollout.approve", "rollout.pause"):
        assert action in actions, action


@pytest.mark.parametrize("isolated_server", FAST_ROLLOUT, indirect=True)
def test_the_stored_plan_rolls_out_over_the_api_with_its_provenance(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, agents = _fleet(server, 4)
    tenant_id = server.plane.tenant_id(tenant.name)
    url = "/api/v1/plan/rollout"
    body = {"waves": [{"devices": ["edge-02"]}, {"percent": 100}], "comment": "mtu 1400"}
    nothing = server.client.post(url, json=body, headers=tenant.auth("operator"))
    assert nothing.status_code == 200 and nothing.json()["rollout"] is None
    assert nothing.json()["plan"]["exit_code"] == 0
    viewer = server.client.post(url, json=body, headers=tenant.auth("viewer"))
    assert viewer.status_code == 403
    server.plane.put_profile(tenant_id, "edge-mtu", 1, profile(mtu_default=1400), actor="t")
    bad = server.client.post(
        url, json={**body, "selector": "site in ams"}, headers=tenant.auth("operator")
    )
    assert bad.status_code == 422 and "position" in bad.text
    shown = server.client.post(
        "/api/v1/plan", json={"selector": "site=ams"}, headers=tenant.auth("viewer")
    ).json()
    # Another operator stores a change after the plan was shown: the rollout of what
    # nobody saw is refused, nothing started.
    server.plane.put_profile(tenant_id, "edge-mtu", 2, profile(mtu_default=1300), actor="t")
    unseen = server.client.post(
        url,
        json={**body, "selector": "site=ams", "expect_digest": shown["digest"]},
        headers=tenant.auth("operator"),
    )
    assert unseen.status_code == 409, unseen.text
    assert "the plan changed since it was shown" in unseen.text
    assert server.plane.rollouts(tenant_id) == []
    server.plane.put_profile(tenant_id, "edge-mtu", 3, profile(mtu_default=1400), actor="t")
    started = server.client.post(
        url,
        json={**body, "selector": "site=ams", "expect_digest": shown["digest"]},
        headers=tenant.auth("operator"),
    )
    assert started.status_code == 201, started.text
    answer = started.json()
    assert answer["plan"]["counts"]["changed"] == 4
    rollout = answer["rollout"]
    assert [w["members"] for w in rollout["waves"]] == [1, 3]

    def completed() -> bool:
        for agent in agents:
            agent.poll()
        return bool(server.plane.rollout(tenant_id, rollout["id"])["state"] == "completed")

    wait_for(completed, "the rollout to complete")
    assert all(len(a.received) == 2 for a in agents)  # each sent the change once
    desired = server.plane.desired(tenant_id, "edge-02")
    assert desired is not None and desired.document["spec"]["interfaces"][0]["mtu"] == 1400
    assert desired.provenance is not None and "edge-mtu" in json.dumps(desired.provenance)
    again = server.client.post(url, json=body, headers=tenant.auth("operator"))
    assert again.status_code == 200 and again.json()["rollout"] is None


@pytest.mark.parametrize("isolated_server", FAST_ROLLOUT, indirect=True)
def test_a_rolled_out_profile_stays_editable_the_devices_own_layer_is_adopted(
    isolated_server: Server,
) -> None:
    server = isolated_server
    names = ["edge-00", "edge-01"]
    tenant = server.tenant("adopt", devices=tuple(names))
    tenant_id = server.plane.tenant_id(tenant.name)
    agents = []
    for name in names:
        server.plane.set_labels(tenant_id, name, {"site": "ams"}, actor="t")
        server.plane.put_desired(tenant_id, name, 0, initial(name), author="test")
        agents.append(SimAgent(server.client, name, tenant.devices[name]))
    server.plane.put_profile(tenant_id, "edge-mtu", 0, profile(), actor="test")
    started = server.client.post(
        "/api/v1/plan/rollout", json={"comment": "first"}, headers=tenant.auth("operator")
    )
    assert started.status_code == 201, started.text
    rid = started.json()["rollout"]["id"]

    def completed() -> bool:
        for agent in agents:
            agent.poll()
        return bool(server.plane.rollout(tenant_id, rid)["state"] == "completed")

    wait_for(completed, "the rollout to complete")
    # Each device's own layer is its document from before the rollout, not the rendered
    # one: the profile's next edit still reaches it.
    for name in names:
        own = server.plane.device_variables(tenant_id, name).own
        assert own is not None and "interfaces" not in own.get("spec", own), own
    server.plane.put_profile(tenant_id, "edge-mtu", 1, profile(mtu_default=1400), actor="t")
    plan = server.plane.plan(tenant_id)
    assert sorted(t.device for t in plan.targets) == names
    assert [c.path for c in plan.targets[0].changes] == ["spec.interfaces[lan0].mtu"]


def test_a_new_profile_from_the_list_page_is_planned_then_created_by_its_rollout(
    server: Server,
) -> None:
    tenant, _agents = _fleet(server, 2)
    tenant_id = server.plane.tenant_id(tenant.name)
    operator = browser(server, tenant, "operator")
    listing = operator.get("/ui/profiles").text
    assert 'name="expected" value="0"' in listing and "New profile" in listing
    new = yaml.safe_dump(
        profile(
            "edge-ntp",
            selector="site=ams",
            mtu_default=1500,
            routes=[{"to": "192.0.2.0/25", "via": "203.0.113.254"}],
        ),
        sort_keys=False,
    )
    csrf = csrf_of(listing)
    page = operator.post("/ui/plan", data={"csrf": csrf, "document": new, "expected": "0"})
    assert page.status_code == 200 and "Plan of profile edge-ntp as edited" in page.text
    assert "spec.routes[" in html.unescape(page.text)
    with pytest.raises(NotFound):
        server.plane.profile(tenant_id, "edge-ntp")  # planning stored nothing
    started = operator.post(
        "/ui/rollouts",
        data={"csrf": csrf, "document": new, "expected": "0", "percents": "100"},
        follow_redirects=False,
    )
    assert started.status_code == 303, started.text
    assert server.plane.profile(tenant_id, "edge-ntp").version == 1
    rid = int(started.headers["location"].split("/")[-1].split("?")[0])
    assert [m["device"] for m in server.plane.rollout(tenant_id, rid)["members"]] == [
        "edge-00",
        "edge-01",
    ]
