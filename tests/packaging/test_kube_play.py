"""The shipped Kubernetes manifests, played by `podman kube play`, drive a real agent.

deploy/kubernetes/trial (the base's control plane, PostgreSQL and example
Secrets) is read as `kubectl apply -k` reads it; only object names change (a
unique suffix) and the control plane's port is published on a free host port.
The control plane answers /readyz; a tenant and a device are created inside its
container (`podman exec … trueup server …`); an agent in a network namespace,
wired to the host by a veth, enrolls against it and applies a revision that
reaches its kernel. With PostgreSQL's pod gone the control plane stays alive
but answers /readyz 503; both pods are then removed and played again: the tenant,
token, device and revision are still there (the PostgreSQL and data volumes),
the audit chain still verifies against the checkpoint on the data volume, and
the agent applies the next revision.

What podman 4.3 does differently from a cluster, and what this test does instead:
a Service has no podman equivalent (no cluster DNS on podman's default network),
so the control plane's pod gets a hostAlias naming the PostgreSQL Service's host
name with that pod's address; a Secret read through `secretKeyRef` must be a
podman secret holding a flat JSON map, so those are created with `podman secret
create`; a PersistentVolumeClaim that exists already is not played twice.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.packaging import kube, smoke
from tests.packaging.images import podman, postgres_image, server_image, unique, wait_until
from tests.routers import Router

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

SERVER = "trueup-server"
POSTGRES = "trueup-postgres"


class Trial:
    """The trial manifests under unique names, played and removed by exactly those names."""

    def __init__(self, workdir: Path, host_ip: str) -> None:
        self.suffix = unique("k").removeprefix("k-")
        self.workdir = workdir
        self.host_ip = host_ip
        self.port = smoke.free_port()
        self.url = f"http://{host_ip}:{self.port}"
        objects = kube.load(kube.MANIFESTS / "trial")
        self.objects, self.names = kube.rename(objects, self.suffix)
        self.server = kube.named(self.objects, "Deployment", self.names[SERVER])
        self.postgres = kube.named(self.objects, "Deployment", self.names[POSTGRES])
        self.secrets: list[str] = []
        self.volumes: list[str] = []
        self.pod_volumes: list[str] = []
        self.pods: list[str] = []

    def pod(self, deployment: dict[str, Any]) -> str:
        return f"{deployment['metadata']['name']}-pod-0"

    def container(self, deployment: dict[str, Any]) -> str:
        return f"{self.pod(deployment)}-{kube.pod_spec(deployment)['containers'][0]['name']}"

    def _play(self, name: str, objects: list[dict[str, Any]]) -> None:
        for deployment in kube.of_kind(objects, "Deployment"):
            for container in kube.pod_spec(deployment)["containers"]:
                for port in container.get("ports", []):
                    # podman 4.3 publishes a containerPort without hostPort on the
                    # host's same port: a free one on loopback instead.
                    if "hostPort" not in port:
                        port["hostPort"] = smoke.free_port()
                        port["hostIP"] = "127.0.0.1"
        path = self.workdir / f"{name}.yaml"
        path.write_text(kube.dump(objects))
        podman("kube", "play", str(path), timeout=300)

    def create_secrets(self) -> None:
        by_env = kube.env_secret_names(self.objects)
        by_volume = kube.volume_secret_names(self.objects)
        assert not by_env & by_volume, f"secrets read both ways: {by_env & by_volume}"
        volume_secrets = []
        for secret in kube.of_kind(self.objects, "Secret"):
            name = secret["metadata"]["name"]
            self.secrets.append(name)
            if name in by_env:
                podman("secret", "create", name, "-", input=kube.as_env_secret(secret))
            else:
                volume_secrets.append(kube.as_volume_secret(secret))
                # podman 4.3 keeps a secret volume's files in a named volume of the same name.
                self.pod_volumes.append(name)
        if volume_secrets:
            self._play("secrets", volume_secrets)

    def _empty_dirs(self, deployment: dict[str, Any]) -> None:
        for volume in kube.pod_spec(deployment).get("volumes", []):
            if "emptyDir" in volume and volume["name"] not in self.pod_volumes:
                self.pod_volumes.append(volume["name"])

    def _claims(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        names = {
            v["persistentVolumeClaim"]["claimName"]
            for v in kube.pod_spec(deployment).get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        new = [
            c
            for c in kube.of_kind(self.objects, "PersistentVolumeClaim")
            if c["metadata"]["name"] in names and c["metadata"]["name"] not in self.volumes
        ]
        self.volumes += [c["metadata"]["name"] for c in new]
        return new

    def play_postgres(self) -> str:
        """Play PostgreSQL; wait until it accepts connections; return its pod's address."""
        self.pods.append(self.pod(self.postgres))
        self._empty_dirs(self.postgres)
        self._play("postgres", [*self._claims(self.postgres), copy.deepcopy(self.postgres)])
        ctr = self.container(self.postgres)
        wait_until(
            lambda: (
                podman(
                    "exec",
                    ctr,
                    "pg_isready",
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "trueup",
                    "-d",
                    "trueup",
                    check=False,
                ).returncode
                == 0
            ),
            what="PostgreSQL accepting connections",
        )
        infra = podman("pod", "inspect", self.pod(self.postgres)).stdout
        infra_id = json.loads(infra)["InfraContainerID"]
        networks = json.loads(podman("inspect", infra_id).stdout)[0]["NetworkSettings"]
        addresses = [n["IPAddress"] for n in networks.get("Networks", {}).values()]
        address = next((a for a in [*addresses, networks.get("IPAddress")] if a), None)
        assert address, f"no address for pod {self.pod(self.postgres)}: {networks}"
        return str(address)

    def play_server(self, image: str, postgres_ip: str) -> float:
        """Play the control plane; return seconds from `kube play` to /readyz 200."""
        deployment = copy.deepcopy(self.server)
        spec = kube.pod_spec(deployment)
        # The Service's name resolves to the PostgreSQL pod (no cluster DNS here).
        spec["hostAliases"] = [{"ip": postgres_ip, "hostnames": [POSTGRES]}]
        container = spec["containers"][0]
        assert container["image"].startswith("localhost/trueup-server:"), container["image"]
        container["image"] = image  # this tree's build, not whatever carries the version tag
        port = next(p for p in container["ports"] if p["name"] == "http")
        port["hostPort"] = self.port
        port["hostIP"] = self.host_ip
        self.pods.append(self.pod(self.server))
        self._empty_dirs(self.server)
        started = time.monotonic()
        self._play("server", [*self._claims(self.server), deployment])
        try:
            wait_until(lambda: self.ready() == 200, what=f"{self.url}/readyz 200", timeout=240)
        except AssertionError as exc:
            logs = podman("logs", "--tail", "30", self.container(self.server), check=False)
            raise AssertionError(f"{exc}\ncontrol plane log:\n{logs.stdout}{logs.stderr}") from None
        return time.monotonic() - started

    def ready(self) -> int:
        return smoke.ready(self.url)

    def remove_pod(self, pod: str) -> None:
        """Remove `pod`, asking again while it exists: on a loaded machine one
        `pod rm --force` can give up on a container still stopping."""
        errors: list[str] = []

        def gone() -> bool:
            if podman("pod", "exists", pod, check=False).returncode == 1:
                return True
            removed = podman("pod", "rm", "--force", "--time", "10", pod, check=False, timeout=120)
            errors.append(removed.stderr.strip()[-300:])
            return podman("pod", "exists", pod, check=False).returncode == 1

        try:
            wait_until(gone, what=f"{pod} removed", timeout=300, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; podman said: {errors[-1:]}") from None
        self.pods.remove(pod)

    def remove_pods(self) -> None:
        for pod in list(self.pods):
            self.remove_pod(pod)

    def cli(self, *args: str, shell: str | None = None) -> str:
        """`trueup server …` inside the control plane's container (its environment)."""
        argv = ["sh", "-c", shell] if shell else ["trueup", "server", *args]
        proc = podman("exec", self.container(self.server), *argv, check=False, timeout=120)
        assert proc.returncode == 0, f"{argv} failed: {proc.stdout}{proc.stderr}"
        return proc.stdout

    def close(self) -> None:
        self.remove_pods()
        for volume in [*self.volumes, *self.pod_volumes]:
            if podman("volume", "exists", volume, check=False).returncode == 0:
                podman("volume", "rm", "--force", volume, check=False)
        for secret in self.secrets:
            podman("secret", "rm", secret, check=False)


@pytest.fixture
def trial(tmp_path: Path, agent_router: tuple[Router, str, str]) -> Iterator[Trial]:
    trial = Trial(tmp_path, agent_router[1])
    try:
        yield trial
    finally:
        trial.close()


def test_manifests_played_by_podman_run_the_control_plane_for_an_agent(
    trial: Trial, agent_router: tuple[Router, str, str]
) -> None:
    router, _host_ip, agent_ip = agent_router
    image = server_image()
    assert postgres_image() == "localhost/postgres:15-bookworm"

    trial.create_secrets()
    seconds = trial.play_server(image, trial.play_postgres())
    print(f"control plane: kube play → /readyz 200 in {seconds:.1f} s")
    user = podman("exec", trial.container(trial.server), "id", "-u").stdout.strip()
    assert user == "10001"
    # The root file system is read-only; the data volume is the container's to write.
    assert podman("exec", trial.container(trial.server), "touch", "/opt/x", check=False).returncode
    trial.cli(shell="touch /var/lib/trueup-server/.writable && rm /var/lib/trueup-server/.writable")

    token = smoke.first_revision(trial, router, agent_ip)

    # PostgreSQL goes: the control plane lives on (/healthz) but is not ready (/readyz 503),
    # which is what takes it out of its Service.
    trial.remove_pod(trial.pod(trial.postgres))
    wait_until(lambda: trial.ready() == 503, what="/readyz 503 without PostgreSQL")
    assert httpx.get(f"{trial.url}/healthz", timeout=30).status_code == 200
    # Then the control plane's pod; both are played again on their volumes (claims stay).
    trial.remove_pods()
    assert trial.ready() == 0
    seconds = trial.play_server(image, trial.play_postgres())
    print(f"control plane played again: /readyz 200 in {seconds:.1f} s")

    view = smoke.device(trial.url, token)  # the old token: users and tokens survived
    assert view["desired_version"] == 1, view
    verify = podman(
        "exec", trial.container(trial.server), "trueup", "server", "audit", "verify", check=False
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr

    smoke.next_revision(trial, router, agent_ip, token, 2)
