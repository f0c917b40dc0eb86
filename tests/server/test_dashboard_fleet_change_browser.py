"""A fleet change in Chromium: sign in, open a profile, plan an edit, start a rollout with
a canary wave from the plan page, and watch it progress live while simulated agents take
the revisions and report them through the real agent API.

The control plane is a real server process on 127.0.0.1 (SQLite), its rollout controller
ticking fast; the page follows the rollout over its server-sent event stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.browser import chromium, screenshot
from tests.server.conftest import ServerProcess
from tests.server.rolloutsim import SimAgent, initial
from tests.server.test_profiles import profile
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role

WAIT_MS = 120_000
DEVICES = [f"edge-{i:02d}" for i in range(4)]


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[tuple[str, str, ControlPlane, int, list[SimAgent]]]:
    url = f"sqlite:///{tmp_path}/server.db"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant("ops", "test")
    plane.create_user(tenant_id, "operator", Role.OPERATOR, "test")
    token = plane.create_token(tenant_id, "operator", "test")[1]
    server = ServerProcess(url, key_file, auth_cache_seconds=0.0, rollout_tick_seconds=0.1)
    client: httpx.Client | None = None
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=30)
        agents = []
        for name in DEVICES:
            bundle = plane.enroll(tenant_id, name, "test", url=server.url)
            answer = client.post(
                "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
            )
            assert answer.status_code == 200, answer.text
            plane.set_labels(tenant_id, name, {"site": "ams"}, actor="test")
            plane.put_desired(tenant_id, name, 0, initial(name), author="test")
            agents.append(SimAgent(client, name, answer.json()["credential"]))
        plane.put_profile(tenant_id, "edge-mtu", 0, profile(), actor="test")
        assert len(plane.publish_plan(tenant_id, plane.plan(tenant_id), actor="t").stored) == 4
        for agent in agents:
            assert agent.poll()
        yield server.url, token, plane, tenant_id, agents
    finally:
        if client is not None:
            client.close()
        server.stop()
        database.dispose()


def _agents_report(agents: list[SimAgent], stop: threading.Event) -> None:
    while not stop.is_set():
        for agent in agents:
            agent.poll()
        stop.wait(0.2)


def test_plan_an_edit_roll_it_out_with_a_canary_and_watch_it_complete(stage: Any) -> None:
    url, token, plane, tenant_id, agents = stage
    edited = yaml.safe_dump(profile(mtu_default=1400), sort_keys=False)
    stop = threading.Event()
    reporter = threading.Thread(target=_agents_report, args=(agents, stop), daemon=True)
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{url}/ui/login", timeout=WAIT_MS)
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        page.wait_for_selector("table.fleet", timeout=WAIT_MS)
        page.click("header nav a[href='/ui/profiles']")
        page.click("table.profiles a[href='/ui/profiles/edge-mtu']")
        page.wait_for_selector("#profile-document", timeout=WAIT_MS)
        assert "Devices it selects (4)" in page.inner_text("main")
        page.get_by_label("Profile document (YAML or JSON)").fill(edited)
        page.get_by_label("Comment").fill("mtu 1400")
        page.click("#profile-form button[value=plan]")
        page.wait_for_selector("#plan-counts", timeout=WAIT_MS)
        plan = page.inner_text("main")
        assert "spec.interfaces[lan0].mtu: 1500 → 1400" in plan, plan
        assert "2 — devices would change" in plan
        assert plane.profile(tenant_id, "edge-mtu").version == 1  # planning stored nothing
        screenshot(page, "plan-of-an-edit")
        page.get_by_label("Canary devices").fill("edge-02")
        page.get_by_label("Then percentages of the rest").fill("100")
        page.get_by_label("Max unavailable").fill("2")
        reporter.start()
        try:
            page.click("#rollout-form button[type=submit]")
            page.wait_for_selector("#rollout-live", timeout=WAIT_MS)
            assert "/ui/rollouts/" in page.url
            rid = int(page.url.split("/ui/rollouts/")[1].split("?")[0])
            assert plane.rollout(tenant_id, rid)["waves"][0]["devices"] == ["edge-02"]
            # The page follows the rollout without a reload: the canary passes, then all.
            page.wait_for_selector(
                'tr[data-device="edge-02"][data-state="passed"]', timeout=WAIT_MS
            )
            page.wait_for_selector("#rollout-summary .r-completed", timeout=WAIT_MS)
            for name in DEVICES:
                assert page.is_visible(f'tr[data-device="{name}"][data-state="passed"]'), name
            assert page.get_attribute("#rollout-members", "aria-live") == "polite"
            assert "live · updated" in page.inner_text("#live")
            screenshot(page, "rollout-completed")
        finally:
            stop.set()
            reporter.join(30)
        context.close()
    assert plane.rollout(tenant_id, rid)["state"] == "completed"
    assert plane.profile(tenant_id, "edge-mtu").version == 2
    for name in DEVICES:
        desired = plane.desired(tenant_id, name)
        assert desired is not None and desired.document["spec"]["interfaces"][0]["mtu"] == 1400
