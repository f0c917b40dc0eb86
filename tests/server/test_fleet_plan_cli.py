"""`trueup fleet profile|vars|plan|publish` against a real control-plane process: exit codes
0 (no change) / 2 (changes) / 1 (refusals), If-Match from the version shown, $EDITOR."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from tests.server.conftest import ServerProcess, document
from tests.server.test_profiles import profile
from trueup.cli.main import app
from trueup.cli.server import server_app


def _invoke(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def _token(tmp_path: Path, key: list[str], tenant: str, role: str) -> Path:
    created = CliRunner().invoke(
        server_app,
        ["token", "create", "--tenant", tenant, "--user", f"{tenant}-{role}", "--role", role, *key],
    )
    assert created.exit_code == 0, created.output
    path = tmp_path / f"{tenant}-{role}.token"
    path.write_text(created.output.strip().splitlines()[-1].split()[-1] + "\n")
    return path


def test_fleet_plan_exit_codes_profiles_and_variables_through_the_cli(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    key = ["--db", db, "--key-file", str(tmp_path / "server.key")]
    assert CliRunner().invoke(server_app, ["tenant", "create", "acme", *key]).exit_code == 0
    operator = _token(tmp_path, key, "acme", "operator")
    viewer = _token(tmp_path, key, "acme", "viewer")
    process = ServerProcess(db, tmp_path / "server.key").start()
    try:
        auth = {"Authorization": f"Bearer {operator.read_text().strip()}"}
        for device in ("edge-01", "edge-02"):
            created = httpx.post(
                f"{process.url}/api/v1/devices", json={"name": device}, headers=auth
            )
            assert created.status_code == 201, created.text
            stored = httpx.put(
                f"{process.url}/api/v1/devices/{device}/desired",
                json=document(device),
                headers={**auth, "If-Match": "0"},
            )
            assert stored.status_code == 201, stored.text
        env = {"TRUEUP_SERVER": process.url, "TRUEUP_TOKEN_FILE": str(operator)}
        read_only = {**env, "TRUEUP_TOKEN_FILE": str(viewer)}

        # Only their own documents: nothing to change.
        code, out, err = _invoke("fleet", "plan", env=read_only)
        assert code == 0, (out, err)
        assert "Plan: 0 to change, 0 refused, 2 unchanged." in out

        # A proposed profile: both devices change; nothing is stored.
        proposal = tmp_path / "edge-mtu.yaml"
        proposal.write_text(yaml.safe_dump(profile(selector="")))
        code, out, err = _invoke("fleet", "plan", "--profile", str(proposal), env=read_only)
        assert code == 2, (out, err)
        assert "edge-01: desired version 1 -> new" in out
        assert "+ spec.interfaces[lan0]" in out, out
        assert "Plan: 2 to change, 0 refused, 0 unchanged." in out
        code, out, _ = _invoke("fleet", "profile", "list", env=read_only)
        assert code == 0 and "0 profile(s)" in out

        # Stored: still no device changes until published; the plan shows it pending.
        code, out, err = _invoke("fleet", "profile", "create", str(proposal), env=env)
        assert code == 0, err
        assert "profile edge-mtu version 1 stored" in out
        code, _, err = _invoke("fleet", "profile", "create", str(proposal), env=env)
        assert code == 1 and "exists" in err and "use edit" in err
        code, out, _ = _invoke("fleet", "plan", "-o", "json", env=read_only)
        assert code == 2
        assert json.loads(out)["counts"] == {"changed": 2, "refused": 0, "unchanged": 0}

        # A variable that does not fit: refused, naming profile, variable and path.
        code, out, _ = _invoke("fleet", "plan", "--vars", "edge-02", "mtu=100", env=read_only)
        assert code == 1, out
        assert "edge-02: REFUSED (render)" in out
        assert "variables.mtu" in out and "profile edge-mtu" in out and "variable mtu" in out

        # Publish (no terminal: --yes), then the plan is empty again.
        code, out, err = _invoke("fleet", "publish", env=env)
        assert code == 1 and "--yes" in err
        code, out, err = _invoke("fleet", "publish", "--yes", "--comment", "mtu", env=env)
        assert code == 0, (out, err)
        assert "edge-01: desired version 2 stored" in out
        code, out, _ = _invoke("fleet", "plan", env=read_only)
        assert code == 0, out

        # Variables: set through the CLI (If-Match from the version shown), then planned.
        code, out, err = _invoke("fleet", "vars", "edge-01", "mtu=9000", env=env)
        assert code == 0, err
        assert "mtu = 9000" in out and "variables version 2" in out
        code, out, _ = _invoke("fleet", "plan", env=read_only)
        assert code == 2
        assert "~ spec.interfaces[lan0].mtu: 1500 -> 9000" in out

        # An own layer from a whole document (its spec), then removed again.
        own = tmp_path / "own.yaml"
        own.write_text(yaml.safe_dump(document("edge-02", address="198.51.100.9/24")))
        code, out, err = _invoke("fleet", "vars", "edge-02", "--own", str(own), env=env)
        assert code == 0, err
        assert "own layer: management" in out
        code, out, _ = _invoke("fleet", "vars", "edge-02", "-o", "json", env=env)
        assert json.loads(out)["own"]["management"]["addresses"] == ["198.51.100.9/24"]
        code, out, err = _invoke("fleet", "vars", "edge-02", "--clear-own", env=env)
        assert code == 0 and "own layer: none" in out, err
        own.write_text(yaml.safe_dump(document("edge-02")))  # back to what it was
        assert _invoke("fleet", "vars", "edge-02", "--own", str(own), env=env)[0] == 0

        # Edit in $EDITOR: the edited document is stored as version 2.
        editor = tmp_path / "editor.sh"
        editor.write_text("#!/bin/sh\nsed -i 's/default: 1500/default: 1400/' \"$1\"\n")
        editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
        code, out, err = _invoke(
            "fleet", "profile", "edit", "edge-mtu", env={**env, "EDITOR": str(editor)}
        )
        assert code == 0, err
        assert "version 2 stored" in out
        code, out, _ = _invoke("fleet", "profile", "show", "edge-mtu", "--version", "1", env=env)
        assert code == 0 and "default: 1500" in out and "version 1" in out
        code, out, _ = _invoke("fleet", "profile", "show", "edge-mtu", "-o", "json", env=env)
        assert json.loads(out)["document"]["spec"]["variables"]["mtu"]["default"] == 1400
        code, out, _ = _invoke("fleet", "plan", "-o", "json", env=read_only)
        targets = {t["device"]: t for t in json.loads(out)["targets"]}
        assert [(c["path"], c["old"], c["new"]) for c in targets["edge-02"]["changes"]] == [
            ("spec.interfaces[lan0].mtu", 1500, 1400)
        ]

        # A profile for one site: a proposed label brings a device in; -l limits the plan.
        site = tmp_path / "site.yaml"
        site.write_text(yaml.safe_dump(profile("site-mtu", selector="site=ams", priority=200)))
        code, out, err = _invoke("fleet", "profile", "create", str(site), env=env)
        assert code == 0, err
        code, out, _ = _invoke("fleet", "plan", "-l", "site=ams", env=read_only)
        assert code == 0 and "Plan: 0 to change, 0 refused, 0 unchanged." in out, out
        code, out, _ = _invoke(
            "fleet", "plan", "--label", "edge-01", "site=ams", "-o", "json", env=read_only
        )
        assert code == 2, out
        (target,) = json.loads(out)["targets"]
        assert target["device"] == "edge-01"
        assert {"name": "site-mtu", "version": 1} in target["provenance"]["profiles"]

        # A viewer cannot write; bad arguments are one line, exit 1.
        code, _, err = _invoke("fleet", "vars", "edge-01", "mtu=1", env=read_only)
        assert code == 1 and "refused the token" in err
        code, _, err = _invoke("fleet", "plan", "mtu=1", env=read_only)
        assert code == 1 and "--vars DEVICE" in err
    finally:
        process.stop()
