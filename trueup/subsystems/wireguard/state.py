"""The WireGuard subsystem's helpers: its record, key facts, step arguments and status report.

The record (`STATE_DIR/run/wg-NAME/state.json`, 0600) holds what trueup
last set: the mode (kernel or wireguard-go), the secret references of the
private and preshared keys, and per peer the endpoint it set and the name it
came from (roaming is judged against it). Key facts compare digests of the
live keys with digests of the stored secrets; no key is ever returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trueup.subsystems.base import Facts, Sources, Step, StepError
from trueup.system.atomicfile import write_atomic
from trueup.system.safefile import ensure_dir, read_file
from trueup.system.secretstore import (
    SECRETS_DIR,
    SecretError,
    read_secret,
    secret_digest,
)
from trueup.system.wireguard import WgDump, daemon_name

__all__ = [
    "conf_args",
    "dump_report",
    "iface_path",
    "key_fact",
    "psk_fact",
    "read_record",
    "record_path",
    "secret_value",
    "update_record",
]

_STATE = "state.json"


def iface_path(name: str, what: str) -> str:
    return f"spec.wireguard.interfaces[{name}].{what}"


def dump_report(dump: WgDump, record: dict[str, Any]) -> dict[str, Any]:
    endpoints: dict[str, Any] = record.get("endpoints", {})
    return {
        "public_key": dump.public_key,
        "listen_port": dump.listen_port,
        "peers": {
            key: {
                "endpoint": peer.endpoint,
                "endpoint_name": endpoints.get(key, {}).get("name"),
                "resolved_endpoint": endpoints.get(key, {}).get("endpoint"),
                "latest_handshake": peer.latest_handshake or None,
                "rx_bytes": peer.rx_bytes,
                "tx_bytes": peer.tx_bytes,
                "allowed_ips": list(peer.allowed_ips),
                "persistent_keepalive": peer.keepalive,
            }
            for key, peer in sorted(dump.peers.items())
        },
    }


def conf_args(name: str, desired: Facts) -> dict[str, Any]:
    peers = []
    for key in desired.get(iface_path(name, "peers")) or []:
        fact = desired.get(iface_path(name, f"peers[{key}]")) or {}
        psk = str(fact.get("preshared_key", "none"))
        peers.append(
            {
                "public_key": key,
                "endpoint": fact.get("endpoint"),
                "endpoint_name": fact.get("endpoint_name"),
                "allowed_ips": list(fact.get("allowed_ips") or []),
                "persistent_keepalive": int(fact.get("persistent_keepalive") or 0),
                "preshared_key": psk.removeprefix("secret:") if psk.startswith("secret:") else None,
            }
        )
    return {
        "name": name,
        "private_key": str(desired.get(iface_path(name, "private_key"), "")).removeprefix(
            "secret:"
        ),
        "listen_port": desired.get(iface_path(name, "listen_port")),
        "peers": peers,
    }


def secret_value(sources: Sources, step: Step, ref: str, path: str) -> str:
    try:
        value = read_secret(sources.state_dir, ref)
    except SecretError as exc:
        raise StepError(step, f"{path}: {exc}") from exc
    if value is None:
        where = sources.state_dir / SECRETS_DIR / ref
        raise StepError(
            step,
            f"{path}: secret {ref!r} is not on this device: store it with `trueup secret set "
            f"{ref}` (it goes to {where}) or add it to the device's secrets in the control plane",
        )
    return value


def key_fact(sources: Sources, record: dict[str, Any], dump: WgDump) -> str:
    ref = record.get("private_key")
    if ref:
        value = _stored(sources, str(ref))
        if value is not None and secret_digest(value) == dump.private_digest:
            return f"secret:{ref}"
    return f"key {dump.public_key}" if dump.public_key else "no key"


def psk_fact(sources: Sources, ref: str | None, digest: str | None) -> str:
    if digest is None:
        return "none"
    if ref:
        value = _stored(sources, ref)
        if value is not None and secret_digest(value) == digest:
            return f"secret:{ref}"
    return "another key"


def _stored(sources: Sources, ref: str) -> str | None:
    try:
        return read_secret(sources.state_dir, ref)
    except SecretError:
        return None  # not a usable secret: the fact reports the key, not a reference


def record_path(sources: Sources, name: str) -> Path:
    return sources.daemons.run_dir(daemon_name(name)) / _STATE


def read_record(sources: Sources, name: str) -> dict[str, Any]:
    try:
        data = json.loads(read_file(record_path(sources, name)))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_record(sources: Sources, name: str, changes: dict[str, Any]) -> None:
    record = read_record(sources, name)
    record.update(changes)
    path = record_path(sources, name)
    ensure_dir(path.parent)
    write_atomic(path, json.dumps(record, sort_keys=True).encode(), 0o600)
