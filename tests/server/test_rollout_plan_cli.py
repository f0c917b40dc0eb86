"""`trueup fleet rollout start --plan`: the stored profiles rolled out from the command line
against a real control-plane process (its controller ticking fast), simulated agents
taking the revisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.server.rolloutsim import wait_for
from tests.server.test_dashboard_fleet_change_browser import stage  # noqa: F401
from tests.server.test_profiles import profile
from trueup.cli.main import app


def test_rollout_start_plan_rolls_the_stored_profiles_out_with_a_canary(
    stage: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, token, plane, tenant_id, agents = stage
    token_file = tmp_path / "token"
    token_file.write_text(token)
    connect = ["--server", url, "--token-file", str(token_file)]

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, ["fleet", "rollout", "start", *args, *connect])

    both = run("--plan", str(tmp_path / "edge-00.yaml"))
    assert both.exit_code == 1 and "not both" in both.stderr
    wide = run("--plan", "--wave", "150")
    assert wide.exit_code == 2 and "'--wave'" in wide.output, wide.output
    odd = run("--plan", "--max-unavailable", "abc")
    assert odd.exit_code == 1 and "expected a number of devices (2) or a" in odd.stderr
    nothing = run("--plan")
    assert nothing.exit_code == 0 and "the plan changes no device" in nothing.stdout
    plane.put_profile(tenant_id, "edge-mtu", 1, profile(mtu_default=1400), actor="test")
    bad = run("--plan", "-l", "site in ams")
    assert bad.exit_code == 1 and "position" in bad.stderr
    started = run("--plan", "-l", "site=ams", "--canary", "edge-01", "--wave", "100")
    assert started.exit_code == 0, started.output
    assert "plan: 4 changed, 0 refused, 0 unchanged" in started.stdout
    lines = {line.split(":")[0]: line for line in started.stdout.splitlines()}
    assert "edge-01" in lines["wave 0"]  # the canary
    rid = int(lines["rollout"].split()[1])

    def completed() -> bool:
        for agent in agents:
            agent.poll()
        return bool(plane.rollout(tenant_id, rid)["state"] == "completed")

    wait_for(completed, "the rollout to complete")
    shown = CliRunner().invoke(app, ["fleet", "rollout", "status", str(rid), *connect])
    assert shown.exit_code == 0, shown.output
    table = shown.stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("DEVICE "))
    column = table[header].index("STATE")
    for row in table[header + 1 :]:  # every device's state in the STATE column
        assert row[column:].split()[0] in ("passed", "skipped"), shown.stdout
    listed = CliRunner().invoke(app, ["fleet", "rollout", "status", *connect]).stdout
    rows = listed.splitlines()
    assert rows[1][rows[0].index("CREATED AT") :].startswith("20"), listed
    desired = plane.desired(tenant_id, "edge-00")
    assert desired is not None and desired.provenance is not None
