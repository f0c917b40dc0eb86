"""The shipped Kubernetes manifests, read as `kubectl apply -k` reads them, for `podman kube play`.

`load(directory)` follows kustomization.yaml files (resources and labels only: the
manifests promise plain YAML that podman reads as well) and returns the objects.
`rename(objects, suffix)` gives every object a unique name and rewrites every
reference to it (claims, secret volumes, secretKeyRefs), so concurrent runs never
collide. `podman_secrets(...)` bridges what podman 4.3 reads differently from a
cluster (see docs/packaging.md#kubernetes).
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
MANIFESTS = REPO / "deploy" / "kubernetes"

_KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "labels"}

Obj = dict[str, Any]


def load(directory: Path) -> list[Obj]:
    """The objects `kubectl apply -k directory` would create, in order."""
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - _KUSTOMIZATION_KEYS
    if unknown:
        raise AssertionError(
            f"{path}: {', '.join(sorted(unknown))}: the manifests stay plain YAML "
            f"(only {', '.join(sorted(_KUSTOMIZATION_KEYS))}) so podman kube play reads them"
        )
    objects: list[Obj] = []
    for resource in spec.get("resources", []):
        target = (directory / resource).resolve()
        if target.is_dir():
            objects += load(target)
        else:
            objects += [o for o in yaml.safe_load_all(target.read_text()) if o]
    for entry in spec.get("labels", []):
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    return objects


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in the manifests, found {len(found)}"
    return found[0]


def pod_spec(deployment: Obj) -> Obj:
    spec: Obj = deployment["spec"]["template"]["spec"]
    return spec


def rename(objects: list[Obj], suffix: str) -> tuple[list[Obj], dict[str, str]]:
    """Copies with `-<suffix>` on every object name and on every reference to one."""
    out = copy.deepcopy(objects)
    names = {o["metadata"]["name"]: f"{o['metadata']['name']}-{suffix}" for o in out}
    for obj in out:
        obj["metadata"]["name"] = names[obj["metadata"]["name"]]
        if obj["kind"] != "Deployment":
            continue
        spec = pod_spec(obj)
        # podman 4.3 makes an emptyDir a named volume called after the pod's volume: unique too.
        local = {
            v["name"]: f"{v['name']}-{suffix}" for v in spec.get("volumes", []) if "emptyDir" in v
        }
        for volume in spec.get("volumes", []):
            volume["name"] = local.get(volume["name"], volume["name"])
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                mount["name"] = local.get(mount["name"], mount["name"])
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]
                claim["claimName"] = names[claim["claimName"]]
            if "secret" in volume:
                volume["secret"]["secretName"] = names[volume["secret"]["secretName"]]
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    ref["name"] = names[ref["name"]]
    return out, names


def secret_data(secret: Obj) -> dict[str, bytes]:
    """A Secret's values, from `data` (base64) and `stringData` as the API server merges them."""
    values = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    for key, value in (secret.get("stringData") or {}).items():
        if not isinstance(value, str):
            raise AssertionError(
                f"Secret {secret['metadata']['name']}: stringData.{key} is a YAML "
                f"{type(value).__name__}, not a string (quote it)"
            )
        values[key] = value.encode()
    return values


def env_secret_names(objects: list[Obj]) -> set[str]:
    return {
        env["valueFrom"]["secretKeyRef"]["name"]
        for d in of_kind(objects, "Deployment")
        for c in pod_spec(d)["containers"]
        for env in c.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }


def volume_secret_names(objects: list[Obj]) -> set[str]:
    return {
        v["secret"]["secretName"]
        for d in of_kind(objects, "Deployment")
        for v in pod_spec(d).get("volumes", [])
        if "secret" in v
    }


def as_volume_secret(secret: Obj) -> Obj:
    """The Secret as podman 4.3 mounts it: a volume's files hold `data` values verbatim (not
    base64-decoded) and `stringData` is ignored, so the values go under `data` as they are."""
    values = secret_data(secret)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret["metadata"]["name"]},
        "type": secret.get("type", "Opaque"),
        "data": {k: v.decode() for k, v in values.items()},
    }


def as_env_secret(secret: Obj) -> str:
    """podman 4.3 resolves a secretKeyRef from a podman secret holding a flat JSON map of
    base64 values (not a Secret object): the same values in that shape."""
    return json.dumps({k: base64.b64encode(v).decode() for k, v in secret_data(secret).items()})


def dump(objects: list[Obj]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)
