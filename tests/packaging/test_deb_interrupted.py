"""The package as an operator handles it after the first install: an upgrade whose postinst is
killed after it switched /opt/trueup/current but before the agent was restarted (power loss,
a killed dpkg) and then `dpkg --configure -a`; a reinstall of the same version; a downgrade;
`/usr/bin/trueup` as a program called `trueup` (help, bash completion, arguments with spaces,
PYTHON* variables and the working directory kept out); more agent options (a control plane)
from /etc/trueup/agent.env. The steps run in order on one container.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scripts import build_deb
from tests.packaging.debian import CACHE, V1, V2, DebianRoot, debian_root, wait_for

pytestmark = [pytest.mark.root, pytest.mark.timeout(1500)]

DOCUMENT = """apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-deb-interrupted}
spec:
  management: {interface: mgmt0, addresses: ["198.51.100.2/24"], gateway: 198.51.100.1}
"""

# Shadows deb-systemd-invoke (PATH puts /usr/local/sbin first): the postinst that asks for the
# agent's restart is killed at that moment, after `current` was switched.
KILLER = """#!/bin/sh
if [ "$1" = try-restart ]; then kill -9 "$PPID"; exit 1; fi
exec /usr/bin/deb-systemd-invoke "$@"
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    out = tmp_path_factory.mktemp("debs")
    debs = {v: build_deb.build(v, out, CACHE) for v in (V1, V2)}
    yield from debian_root(debs)


def _releases(root: DebianRoot) -> set[str]:
    return set(root.run("ls", "/opt/trueup/releases").stdout.split())


def _agent_answers(root: DebianRoot, version: str) -> bool:
    pid = root.unit()["MainPID"]
    return f"agent {version} (pid {pid}" in root.run("trueup", "--version", check=False).stdout


def test_an_interrupted_upgrade_is_finished_by_dpkg_configure(root: DebianRoot) -> None:
    root.run("ip", "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0p")
    root.run("ip", "link", "set", "mgmt0p", "up")
    root.run("mkdir", "-p", "-m", "0750", "/etc/trueup")
    root.run("sh", "-c", f"cat > /etc/trueup/desired.yaml <<'EOF'\n{DOCUMENT}EOF")
    root.run("dpkg", "-i", root.deb(V1))
    old = root.unit()
    assert old["ActiveState"] == "active", old
    wait_for(f"agent {V1} answering", lambda: _agent_answers(root, V1))

    root.run("sh", "-c", f"cat > /usr/local/sbin/deb-systemd-invoke <<'EOF'\n{KILLER}EOF")
    root.run("chmod", "755", "/usr/local/sbin/deb-systemd-invoke")
    killed = root.run("dpkg", "-i", root.deb(V2), check=False)
    root.run("rm", "/usr/local/sbin/deb-systemd-invoke")
    assert killed.returncode != 0, killed.stdout
    assert root.current() == f"releases/{V2}"  # switched, never restarted
    assert root.unit()["MainPID"] == old["MainPID"]
    assert root.exists(f"/opt/trueup/releases/{V1}")  # the running agent's files

    retry = root.run("dpkg", "--configure", "-a", check=False)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    new = root.unit()
    assert new["ActiveState"] == "active" and new["MainPID"] != old["MainPID"], new
    assert _agent_answers(root, V2), root.versions()
    assert _releases(root) == {V1, V2}
    assert not root.exists("/opt/trueup/switching-from")


def test_a_reinstall_keeps_the_agent_and_the_release_before_it(root: DebianRoot) -> None:
    before = root.unit()
    result = root.run("dpkg", "-i", root.deb(V2), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert root.unit()["MainPID"] == before["MainPID"]
    assert root.current() == f"releases/{V2}"
    assert _releases(root) == {V1, V2}  # the rollback release is still there


def test_a_downgrade_runs_the_older_agent(root: DebianRoot) -> None:
    before = root.unit()
    result = root.run("dpkg", "-i", root.deb(V1), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready: no blockers" in result.stdout
    after = root.unit()
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert _agent_answers(root, V1), root.versions()
    assert root.current() == f"releases/{V1}"
    assert _releases(root) == {V1, V2}


def test_the_trueup_command_as_an_operator_runs_it(root: DebianRoot) -> None:
    usage = root.run("trueup", "--help").stdout
    assert "Usage: trueup [OPTIONS] COMMAND" in usage, usage
    assert "Usage: trueup plan" in root.run("trueup", "plan", "--help").stdout
    assert root.exists("/usr/share/bash-completion/completions/trueup")
    completed = root.run(
        "env", "_TRUEUP_COMPLETE=complete_bash", "COMP_WORDS=trueup pre", "COMP_CWORD=1", "trueup"
    ).stdout
    assert completed.split() == ["preflight"], completed
    # One argument with a space stays one argument.
    root.run("cp", "/etc/trueup/desired.yaml", "/tmp/my document.yaml")
    valid = root.run("trueup", "validate", "/tmp/my document.yaml", check=False)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    # PYTHONPATH, PYTHONSTARTUP and a `trueup` package in the working directory are ignored.
    root.run("mkdir", "-p", "/tmp/evil/trueup/cli")
    root.run("sh", "-c", "echo 'raise SystemExit(99)' | tee /tmp/evil/trueup/__init__.py "
             "/tmp/evil/trueup/cli/__init__.py /tmp/evil/sitecustomize.py >/dev/null")  # fmt: skip
    injected = root.run(
        "sh", "-c",
        "cd /tmp/evil && PYTHONPATH=/tmp/evil PYTHONSTARTUP=/tmp/evil/sitecustomize.py "
        "PATH=/tmp/evil:$PATH trueup --version",
    )  # fmt: skip
    assert injected.stdout.startswith(f"trueup {V1}"), injected.stdout


def test_agent_options_come_from_etc_trueup_agent_env(root: DebianRoot) -> None:
    # A control plane that does not answer (TEST-NET-1): the agent runs on, management first.
    options = "--control-plane http://192.0.2.1:9 --token-file /etc/trueup/device.token"
    root.run("sh", "-c", f"echo 'TRUEUP_AGENT_OPTIONS=\"{options}\"' > /etc/trueup/agent.env")
    root.run("sh", "-c", "umask 077 && echo not-a-real-credential > /etc/trueup/device.token")
    before = root.unit()
    root.run("systemctl", "restart", "trueup-agent.service")
    after = root.unit()
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"], after
    argv = root.read(f"/proc/{after['MainPID']}/cmdline").split("\0")
    assert argv[-5:] == [*options.split(), ""], argv
    assert root.run("stat", "-c", "%a", "/etc/trueup/device.token").stdout.strip() == "600"
