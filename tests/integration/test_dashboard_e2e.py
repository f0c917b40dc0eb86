"""The dashboard in Chromium, against a control plane and a real agent in a namespace.

The server listens in the operator namespace (198.51.100.1); the browser is
started there too. Out-of-band change → the fleet table turns to drift (live)
and the device page highlights the path; acknowledge → the expiry is shown;
apply with a stale version → the conflict; the evidence bundle's hashes check;
a viewer cannot apply; another tenant's device never appears. Screenshots go
to test-artifacts/dashboard/.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.browser import chromium, screenshot
from tests.routers import TRUEUP, Router, base_document

pytestmark = pytest.mark.root

PORT = 8791
URL = f"http://198.51.100.1:{PORT}"
WAIT_MS = 30_000


def _server_cli(router: Router, db: str, *args: str) -> str:
    assert router.client is not None
    from tests.routers import REPO

    proc = subprocess.run(
        ["ip", "netns", "exec", router.client, *TRUEUP, "server", *args, "--db", db],
        capture_output=True,
        text=True,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _token(router: Router, db: str, tenant: str, user: str, role: str) -> str:
    out = _server_cli(
        router, db, "token", "create", "--tenant", tenant, "--user", user, "--role", role
    )
    return out.strip().splitlines()[-1].split()[-1]


def _login(browser: Any, token: str) -> Any:
    context = browser.new_context(base_url=URL, accept_downloads=True)
    page = context.new_page()
    page.goto("/")
    assert page.url.endswith("/ui/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_selector("table.fleet", timeout=WAIT_MS)
    assert token not in page.content()  # the token is in no page
    assert token not in page.url
    return page


def _check_bundle(path: str) -> dict[str, Any]:
    with tarfile.open(path, "r:gz") as tar:
        files = {
            m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }
    manifest = json.loads(files.pop("manifest.json"))
    assert set(manifest["files"]) == set(files)
    for name, entry in manifest["files"].items():
        assert hashlib.sha256(files[name]).hexdigest() == entry["sha256"], name
        assert len(files[name]) == entry["bytes"]
    return {
        "manifest": manifest,
        **{k.removesuffix(".json"): json.loads(v) for k, v in files.items()},
    }


def test_dashboard_in_chromium(router_with_client: Router) -> None:
    router = router_with_client
    db = f"sqlite:///{router.workdir}/cp.db"
    _server_cli(router, db, "tenant", "create", "acme")
    _server_cli(router, db, "tenant", "create", "other")
    operator = _token(router, db, "acme", "ops", "operator")
    viewer = _token(router, db, "acme", "watcher", "viewer")
    other = _token(router, db, "other", "ops", "operator")
    bundle = router.workdir / "bundle.json"
    _server_cli(
        router, db, "device", "enroll", "--tenant", "acme", "--device", "edge-01",
        "--url", URL, "--out", str(bundle),
    )  # fmt: skip
    _server_cli(
        router, db, "device", "enroll", "--tenant", "other", "--device", "edge-secret-b",
        "--url", URL, "--out", str(router.workdir / "other.json"),
    )  # fmt: skip
    router.spawn_in_client(
        *TRUEUP, "server", "run", "--db", db, "--listen", f"198.51.100.1:{PORT}",
        log=router.workdir / "server.log",
    )  # fmt: skip
    router.wait_for(lambda: router.from_client(f"{URL}/healthz")[0] == 200, what="control plane up")

    router.ip("link", "set", "mgmt0", "up")
    router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
    fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
    token_file = router.workdir / "device.token"
    enrolled = router.trueup(
        "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file), state=False
    )
    assert enrolled.returncode == 0, enrolled.stderr
    router.start_agent(
        "--management-fallback", str(fallback), "--control-plane", URL,
        "--token-file", str(token_file), env={"TRUEUP_HEARTBEAT_SECONDS": "0.5"},
    )  # fmt: skip
    document = base_document(convergence={"default": "notify"})  # drift is reported, not healed
    status, body = router.from_client(
        f"{URL}/api/v1/devices/edge-01/desired", operator, method="PUT", body=document,
        headers={"If-Match": "0"},
    )  # fmt: skip
    assert status == 201, body
    router.wait_for(
        lambda: router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"],
        what="revision 1 on the kernel",
    )

    with chromium(router.client) as browser:
        page = _login(browser, operator)
        row = 'tr[data-device="edge-01"]'
        page.wait_for_selector(f'{row}[data-status="in_sync"]', timeout=WAIT_MS)
        assert page.locator('tr[data-device="edge-secret-b"]').count() == 0
        screenshot(page, "fleet-in-sync")

        # An out-of-band change: the table turns to drift without a reload (live updates).
        router.ip("addr", "add", "203.0.113.77/24", "dev", "lan0")
        page.wait_for_selector(f'{row}[data-status="drift"]', timeout=WAIT_MS)
        assert "STATE_DRIFT_DETECTED" in page.inner_text(row)
        screenshot(page, "fleet-drift")

        page.click(f"{row} a")
        page.wait_for_selector("tr.differs", timeout=WAIT_MS)
        differing = page.locator("tr.differs")
        assert "addresses" in differing.first.inner_text()
        assert "203.0.113.77/24" in page.locator("table.sbs").inner_text()
        assert page.locator("table.sbs li.extra", has_text="203.0.113.77/24").count() == 1
        assert page.locator("svg.timeline").count() == 1
        assert "closed" in page.inner_text('tr[data-subsystem="addresses"]')  # the breaker
        screenshot(page, "device-drift")

        # The agent's own version, as `trueup --version` names it, on the page and in the API.
        named = router.trueup(
            "--version", env={"TRUEUP_STATE_DIR": str(router.state_dir)}, state=False
        )
        running = re.search(r"^agent (\S+) \(pid", named.stdout, re.M)
        assert running is not None, named.stdout
        assert page.inner_text("#agent-version") == running.group(1)
        assert "trueup/v1" in page.inner_text("#agent-supports")
        status, shown = router.from_client(f"{URL}/api/v1/devices/edge-01", viewer)
        assert status == 200, shown
        assert shown["agent"]["version"] == running.group(1)
        assert shown["agent"]["api_versions"] == ["trueup/v1"]
        assert {"management", "interfaces", "routes"} <= set(shown["agent"]["sections"])
        assert shown["agent"]["unsupported"] == []

        # Acknowledge for an hour: the expiry is shown, in ISO 8601 UTC.
        page.select_option("form.ack-form select[name=subsystem]", "addresses")
        page.select_option("form.ack-form select[name=for_seconds]", "3600")
        page.fill("form.ack-form input[name=reason]", "INC-42 under investigation")
        page.click("form.ack-form button[type=submit]")
        entry = page.locator("li.ack-entry", has_text="addresses")
        entry.wait_for(timeout=WAIT_MS)
        expiry = re.search(r"until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", entry.inner_text())
        assert expiry is not None, entry.inner_text()
        expires = datetime.strptime(expiry.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert 3000 < expires.timestamp() - time.time() <= 3600
        screenshot(page, "device-acknowledged")

        # Someone else stores revision 2 meanwhile: this page's If-Match (1) is stale.
        assert page.input_value("form.apply-form input[name=expected]") == "1"
        status, body = router.from_client(
            f"{URL}/api/v1/devices/edge-01/desired", operator, method="PUT", body=document,
            headers={"If-Match": "1"},
        )  # fmt: skip
        assert status == 201, body
        with page.expect_response(lambda r: r.url.endswith("/apply")) as answer:
            page.click("form.apply-form button[type=submit]")
        assert answer.value.status == 409
        conflict = page.locator(".conflict").inner_text()
        assert "STATE_CONCURRENT_MODIFICATION" in conflict
        assert "version 2" in conflict
        screenshot(page, "device-conflict")

        # Diff between two revisions.
        page.goto("/ui/devices/edge-01?a=1&b=2")
        assert "revision 1" in page.inner_text("#revision-diff")

        # Evidence: a bundle whose manifest hashes check.
        with page.expect_download() as download:
            page.click("text=Download the control plane")
        path = router.workdir / "evidence.tar.gz"
        download.value.save_as(str(path))
        evidence = _check_bundle(str(path))
        assert evidence["device"]["device"] == "edge-01"
        # (revision 2 has been applied since, which removed the extra address: history has it)
        assert any("STATE_DRIFT_DETECTED" in r["reason_codes"] for r in evidence["reports"])
        assert "agent-log" in evidence["manifest"]["missing"]

        # A filter value the dashboard does not know is named, with the valid ones; no table.
        answer = page.goto("/?status=drifting")
        assert answer is not None and answer.status == 422
        error = page.locator("#filter-error").inner_text()
        assert "'drifting'" in error and "heartbeat_stale" in error and "in_sync" in error
        assert page.locator("#fleet-body").count() == 0
        screenshot(page, "fleet-unknown-filter")

        # Tenant isolation: searching for, or opening, the other tenant's device finds nothing.
        page.goto("/?q=edge-secret")
        assert "edge-secret-b" not in page.content()
        assert page.goto("/ui/devices/edge-secret-b").status == 404  # type: ignore[union-attr]
        other_page = _login(browser, other)
        assert other_page.locator('tr[data-device="edge-secret-b"]').count() == 1
        assert "edge-01" not in other_page.content()

        # A viewer sees the device but cannot apply, even by posting the form by hand.
        view = _login(browser, viewer)
        view.goto("/ui/devices/edge-01")
        assert view.locator("#apply-denied").count() == 1
        assert view.locator("form.apply-form").count() == 0
        assert view.locator("form.ack-form").count() == 0
        csrf = view.locator("header input[name=csrf]").input_value()
        posted = view.request.post(
            f"{URL}/ui/devices/edge-01/apply",
            form={"csrf": csrf, "expected": "2", "document": json.dumps(document)},
        )
        assert posted.status == 403
        screenshot(view, "device-viewer")
    status, body = router.from_client(f"{URL}/api/v1/devices/edge-01/desired", operator)
    assert status == 200 and body["version"] == 2  # the viewer's post changed nothing
