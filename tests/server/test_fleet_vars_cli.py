"""What a first `trueup fleet vars` / `fleet profile create` does against a real control-plane
process: setting a variable keeps what the device's own document set (the own layer the
plan used), a file of several profiles is refused naming what is expected, and a selector
whose key no device has says so."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from tests.server.conftest import ServerProcess, document
from tests.server.test_fleet_plan_cli import _invoke, _token
from tests.server.test_profiles import profile
from trueup.cli.server import server_app


def test_setting_a_variable_keeps_the_devices_own_document(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    key = ["--db", db, "--key-file", str(tmp_path / "server.key")]
    assert CliRunner().invoke(server_app, ["tenant", "create", "acme", *key]).exit_code == 0
    operator = _token(tmp_path, key, "acme", "operator")
    process = ServerProcess(db, tmp_path / "server.key").start()
    try:
        auth = {"Authorization": f"Bearer {operator.read_text().strip()}"}
        lan = [{"name": "lan0", "addresses": ["203.0.113.1/24"]}]
        for device in ("edge-01", "edge-02"):
            created = httpx.post(
                f"{process.url}/api/v1/devices", json={"name": device}, headers=auth
            )
            assert created.status_code == 201, created.text
            stored = httpx.put(
                f"{process.url}/api/v1/devices/{device}/desired",
                json=document(device, interfaces=lan),
                headers={**auth, "If-Match": "0"},
            )
            assert stored.status_code == 201, stored.text
        env = {"TRUEUP_SERVER": process.url, "TRUEUP_TOKEN_FILE": str(operator)}

        # Two profiles in one file, as a newcomer copies them: refused, naming what to do.
        both = tmp_path / "profiles.yaml"
        both.write_text(
            yaml.safe_dump(profile(selector=""))
            + "---\n"
            + yaml.safe_dump(profile("other", selector=""))
        )
        for command in (
            ("fleet", "profile", "create"),
            ("fleet", "plan", "--profile"),
            ("fleet", "rollout", "start"),
        ):
            code, _, err = _invoke(*command, str(both), env=env)
            assert code == 1, err
            assert "more than one YAML document" in err and "one document per file" in err, err
        code, out, _ = _invoke("fleet", "profile", "list", env=env)
        assert code == 0 and "0 profile(s)" in out

        single = tmp_path / "edge-mtu.yaml"
        single.write_text(yaml.safe_dump(profile(selector="")))
        code, _, err = _invoke("fleet", "profile", "create", str(single), env=env)
        assert code == 0, err
        code, out, _ = _invoke("fleet", "profile", "show", "edge-mtu", env=env)
        assert code == 0 and re.search(r" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out), out

        # An edit that breaks the YAML is refused and kept, to be fixed and stored from it.
        editor = tmp_path / "editor.sh"
        editor.write_text("#!/bin/sh\nsed -i 's/^kind: Profile/kind: [Profile/' \"$1\"\n")
        editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
        edit_env = {**env, "EDITOR": str(editor)}
        code, _, err = _invoke("fleet", "profile", "edit", "edge-mtu", env=edit_env)
        assert code == 1 and "not valid YAML" in err, err
        kept = Path(err.split("your edit is kept in ", 1)[1].split(":", 1)[0])
        assert "kind: [Profile" in kept.read_text()
        kept.write_text(kept.read_text().replace("kind: [Profile", "kind: Profile"))
        code, out, err = _invoke("fleet", "profile", "edit", "edge-mtu", str(kept), env=env)
        assert code == 0 and "version 2 stored" in out, err
        shutil.rmtree(kept.parent)

        # Nothing stored yet: the plan takes the desired document as the own layer.
        code, out, _ = _invoke("fleet", "vars", "edge-01", env=env)
        assert code == 0 and "own layer: none stored" in out, out
        code, out, _ = _invoke("fleet", "plan", "--vars", "edge-01", "mtu=9000", env=env)
        assert code == 2, out
        proposed = [line for line in out.splitlines() if line.startswith("  ")]
        assert proposed == ["  + spec.interfaces[lan0].mtu: (none) -> 9000"], out

        # Storing that variable gives the same plan: lan0's address is not dropped.
        code, out, err = _invoke("fleet", "vars", "edge-01", "mtu=9000", env=env)
        assert code == 0, err
        assert "own layer: interfaces, management" in out, out
        code, out, _ = _invoke("fleet", "plan", "-l", "", env=env)
        edge_01 = out.split("edge-01:", 1)[1].split("edge-02:", 1)[0]
        assert "addresses" not in edge_01 and "(none) -> 9000" in edge_01, out

        # Two contradicting options, or a stale version: one line naming what is expected.
        code, _, err = _invoke(
            "fleet", "vars", "edge-01", "--own", "x.yaml", "--clear-own", env=env
        )
        assert code == 1 and "give one of them" in err, err
        code, _, err = _invoke("fleet", "profile", "delete", "edge-mtu", "--version", "5", env=env)
        assert code == 1 and "now at version 2, not 5" in err and "version shown" in err, err

        # The docs' device example (labels, variables, own) is not an own layer: said so.
        inputs = tmp_path / "device.yaml"
        inputs.write_text(
            yaml.safe_dump({"device": "edge-01", "variables": {"mtu": 9000}, "own": {}})
        )
        code, _, err = _invoke("fleet", "vars", "edge-01", "--own", str(inputs), env=env)
        assert code == 1 and "not an own layer" in err and "its `own:` part" in err, err

        # A selector with a mistyped key matches nothing, and says which key no device has.
        assert _invoke("fleet", "label", "edge-01", "site=ams", env=env)[0] == 0
        code, out, err = _invoke("fleet", "list", "-l", "stie=ams", env=env)
        assert code == 0 and "0 device(s)" in out, (out, err)
        assert "no device has the label 'stie'" in err and "(labels in use: site)" in err, err
        code, out, err = _invoke("fleet", "plan", "-l", "stie=ams", env=env)
        assert code == 0 and "Plan: 0 to change, 0 refused, 0 unchanged." in out, (out, err)
        assert "no device has the label 'stie'" in err, err
        code, out, err = _invoke("fleet", "list", "-l", "site=fra", env=env)
        assert code == 0 and "0 device(s)" in out and err == "", (out, err)

        # Through the API: `own` left out keeps it; `"own": null` removes it.
        url = f"{process.url}/api/v1/devices/edge-02/variables"
        kept = httpx.put(url, json={"variables": {}}, headers={**auth, "If-Match": "0"})
        assert kept.status_code == 200, kept.text
        assert kept.json()["own"]["interfaces"] == lan, kept.json()
        removed = httpx.put(
            url, json={"variables": {}, "own": None}, headers={**auth, "If-Match": "1"}
        )
        assert removed.status_code == 200 and removed.json()["own"] is None, removed.text
    finally:
        process.stop()
