"""`scripts.build_deb`: the package version, its errors, the control file, the inputs hash."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import build_deb
from scripts.build_deb import BuildError, control_text, package_version


def _pyproject(tmp_path: Path, version_line: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(f'[project]\nname = "trueup"\n{version_line}\n')
    return path


def test_the_version_comes_from_pyproject(tmp_path: Path) -> None:
    assert package_version(_pyproject(tmp_path, 'version = "0.1.0"')) == "0.1.0"


@pytest.mark.parametrize("override", ["0.1.0+t1", "2.0", "1.2.3+build.7", " 0.2.0 "])
def test_package_version_overrides_pyproject(tmp_path: Path, override: str) -> None:
    assert package_version(_pyproject(tmp_path, 'version = "0.1.0"'), override) == override.strip()


@pytest.mark.parametrize(
    "bad", ["", "v1.0", "1.0-1", "1.0~rc1", "1.0+T1", "1.0+", "1..0", "1.0 beta"]
)
def test_a_version_both_pep440_and_debian_cannot_share_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(BuildError, match=r"PACKAGE_VERSION: version .* is not of the form"):
        package_version(_pyproject(tmp_path, 'version = "0.1.0"'), bad)


def test_a_bad_pyproject_version_names_the_file(tmp_path: Path) -> None:
    path = _pyproject(tmp_path, 'version = "0.1.0.dev1"')
    with pytest.raises(BuildError, match=re.escape(f"{path}: version '0.1.0.dev1'")):
        package_version(path)


def test_a_pyproject_without_a_version_names_the_file(tmp_path: Path) -> None:
    path = _pyproject(tmp_path, 'description = "x"')
    with pytest.raises(BuildError, match=re.escape(f"{path}: no `version")):
        package_version(path)


def test_a_missing_pyproject_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=re.escape(f"{tmp_path / 'nope.toml'}: cannot read")):
        package_version(tmp_path / "nope.toml")


def test_the_control_file_pins_bookworms_python_and_recommends_what_fits() -> None:
    fields = dict(
        line.split(": ", 1)
        for line in control_text("0.1.0+t1", "amd64", 1234).splitlines()
        if not line.startswith(" ")
    )
    assert fields["Package"] == "trueup-agent"
    assert fields["Version"] == "0.1.0+t1"
    assert fields["Architecture"] == "amd64"
    assert fields["Installed-Size"] == "1234"
    assert fields["Depends"] == "python3 (>= 3.11~), python3 (<< 3.12), libc6 (>= 2.17), iproute2"
    assert fields["Recommends"] == "nftables"
    for suggested in ("kea-dhcp4-server", "knot", "haproxy", "keepalived", "wireguard-tools"):
        assert suggested in fields["Suggests"]


def test_the_inputs_hash_follows_the_version_and_the_maintainer_scripts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert build_deb.inputs_digest("0.1.0") == build_deb.inputs_digest("0.1.0")
    assert build_deb.inputs_digest("0.1.0") != build_deb.inputs_digest("0.1.0+t1")
    deb = tmp_path / "deb"
    deb.mkdir()
    for item in build_deb.DEB.iterdir():
        (deb / item.name).write_bytes(item.read_bytes())
    monkeypatch.setattr(build_deb, "DEB", deb)
    before = build_deb.inputs_digest("0.1.0")
    assert build_deb.inputs_digest("0.1.0") == before
    (deb / "postinst").write_text((deb / "postinst").read_text() + "\n# changed\n")
    assert build_deb.inputs_digest("0.1.0") != before


def test_main_reports_a_bad_version_and_builds_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PACKAGE_VERSION", "1.0-1")
    assert build_deb.main(["--out", str(tmp_path / "dist"), "--cache", str(tmp_path / "c")]) == 1
    assert (
        "make package: PACKAGE_VERSION: version '1.0-1' is not of the form"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "dist").exists() and not (tmp_path / "c").exists()


def test_the_changelog_entry_names_the_version() -> None:
    text = build_deb.changelog_text("0.1.0+t1", 0)
    assert text.startswith("trueup-agent (0.1.0+t1) unstable; urgency=medium\n")
    assert text.endswith(
        " -- trueup maintainers <trueup@localhost>  Thu, 01 Jan 1970 00:00:00 +0000\n"
    )


def test_the_package_cache_keeps_the_newest_builds(tmp_path: Path) -> None:
    for age in range(5):
        entry = tmp_path / f"digest{age}"
        entry.mkdir()
        (entry / "trueup-agent_0.1.0_amd64.deb").write_bytes(b"x")
        os.utime(entry, (1000 - age, 1000 - age))
    build_deb.prune_cache(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digest0", "digest1"]
    build_deb.prune_cache(tmp_path / "absent")  # nothing built yet: nothing to do


def _wrapper(tmp_path: Path) -> Path:
    """packaging/deb/trueup with its release at tmp_path/release, whose python is this one."""
    python = tmp_path / "release" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    text = (build_deb.DEB / "trueup").read_text()
    assert "release=/opt/trueup/current\n" in text
    wrapper = tmp_path / "trueup"
    wrapper.write_text(
        text.replace("release=/opt/trueup/current\n", f"release={python.parent.parent}\n")
    )
    return wrapper


def test_the_wrapper_runs_a_program_called_trueup(tmp_path: Path) -> None:
    wrapper = _wrapper(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TERM": "dumb"}
    usage = subprocess.run(["sh", str(wrapper), "--help"], capture_output=True, text=True, env=env)
    assert "Usage: trueup [OPTIONS] COMMAND" in usage.stdout, usage.stdout + usage.stderr
    completed = subprocess.run(
        ["sh", str(wrapper)],
        capture_output=True,
        text=True,
        env={
            **env,
            "_TRUEUP_COMPLETE": "complete_bash",
            "COMP_WORDS": "trueup pre",
            "COMP_CWORD": "1",
        },
    )
    assert completed.stdout.split() == ["preflight"], completed.stdout + completed.stderr


def test_the_wrapper_keeps_arguments_whole_and_the_environment_out(tmp_path: Path) -> None:
    wrapper = _wrapper(tmp_path)
    document = tmp_path / "my document.yaml"
    document.write_text((build_deb.DEB / "desired.yaml.example").read_text())
    evil = tmp_path / "evil"
    (evil / "trueup" / "cli").mkdir(parents=True)
    for name in ("trueup/__init__.py", "trueup/cli/__init__.py", "startup.py"):
        (evil / name).write_text("raise SystemExit(99)\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "startup.py"),
        "PYTHONHOME": str(evil),
    }
    result = subprocess.run(
        ["sh", str(wrapper), "validate", str(document)],
        capture_output=True,
        text=True,
        env=env,
        cwd=evil,
    )
    assert result.returncode == 0, result.stdout + result.stderr
