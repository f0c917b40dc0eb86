"""What `make package` puts into the .deb: the control fields, the layout, the modes, the agent
without the control plane's extra, maintainer scripts that parse, a cached second build."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from scripts import build_deb
from tests.packaging.debian import CACHE, V1, sh

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_deb.build(V1, tmp_path_factory.mktemp("debs"), CACHE)


def _listing(deb: Path) -> dict[str, tuple[str, str]]:
    """path → (mode string, owner/group) from `dpkg-deb -c`."""
    entries = {}
    for line in sh("dpkg-deb", "-c", str(deb)).stdout.splitlines():
        fields = line.split()
        path = fields[5].removeprefix(".")
        entries[path.rstrip("/") or "/"] = (fields[0], fields[1])
    return entries


def test_the_control_fields(deb: Path) -> None:
    assert deb.name == f"trueup-agent_{V1}_amd64.deb"
    field = {
        name: sh("dpkg-deb", "-f", str(deb), name).stdout.strip()
        for name in ("Package", "Version", "Architecture", "Depends", "Recommends", "Suggests")
    }
    assert field["Package"] == "trueup-agent" and field["Version"] == V1
    assert field["Architecture"] == "amd64"
    assert field["Depends"] == "python3 (>= 3.11~), python3 (<< 3.12), libc6 (>= 2.17), iproute2"
    assert field["Recommends"] == "nftables"
    assert "wireguard-tools" in field["Suggests"] and "keepalived" in field["Suggests"]


def test_the_layout_and_modes(deb: Path) -> None:
    entries = _listing(deb)
    assert entries["/usr/bin/trueup"] == ("-rwxr-xr-x", "root/root")
    assert entries["/lib/systemd/system/trueup-agent.service"][0] == "-rw-r--r--"
    assert "/usr/share/doc/trueup-agent/examples/desired.yaml" in entries
    assert "/usr/share/doc/trueup-agent/copyright" in entries
    assert entries["/usr/share/bash-completion/completions/trueup"][0] == "-rw-r--r--"
    assert "/usr/share/doc/trueup-agent/changelog.gz" in entries
    assert all(owner == "root/root" for _, owner in entries.values())
    # The agent never runs from a path dpkg owns: only the staging copy is shipped.
    assert not any(p.startswith(("/opt/trueup/releases", "/opt/trueup/current")) for p in entries)
    assert not any(p.startswith(("/etc/", "/var/")) for p in entries)
    site = "/opt/trueup/package/lib/python3.11/site-packages"
    assert f"{site}/trueup/cli/entry.py" in entries
    assert any(
        re.match(rf"{site}/trueup/cli/__pycache__/entry\.cpython-311\.pyc", p) for p in entries
    )
    # The agent only: no control-plane extra, no pip in the shipped environment.
    for absent in ("sqlalchemy", "psycopg", "cryptography", "alembic", "pip", "setuptools"):
        assert f"{site}/{absent}" not in entries, absent


def test_the_maintainer_scripts_and_unit(deb: Path, tmp_path: Path) -> None:
    sh("dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN"))
    for script in ("postinst", "prerm", "postrm"):
        path = tmp_path / "DEBIAN" / script
        assert path.stat().st_mode & 0o111, script
        sh("sh", "-n", str(path))
    postinst = (tmp_path / "DEBIAN" / "postinst").read_text()
    assert f"VERSION='{V1}'" in postinst and "@VERSION@" not in postinst
    sh("dpkg-deb", "-x", str(deb), str(tmp_path / "tree"))
    unit = (tmp_path / "tree/lib/systemd/system/trueup-agent.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=30" in unit
    assert "ExecStart=/usr/bin/trueup agent run --state-dir /var/lib/trueup" in unit
    assert "EnvironmentFile=-/etc/trueup/agent.env" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" $TRUEUP_AGENT_OPTIONS"), exec_start
    env_python = tmp_path / "tree/opt/trueup/package/bin/python3"
    assert env_python.is_symlink() and str(env_python.readlink()) == "/usr/bin/python3"


def test_the_agents_version_is_the_package_version(deb: Path, tmp_path: Path) -> None:
    sh("dpkg-deb", "-x", str(deb), str(tmp_path))
    site = next((tmp_path / "opt/trueup/package/lib").glob("python3*/site-packages"))
    result = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import trueup; print(trueup.__version__)", str(site)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == V1
    assert (site / f"trueup-{V1}.dist-info").is_dir()


def test_a_second_build_comes_from_the_cache(deb: Path, tmp_path: Path) -> None:
    again = build_deb.build(V1, tmp_path, CACHE)
    assert again.read_bytes() == deb.read_bytes()
