"""The WireGuard subsystem's helpers: its record, key facts, step arguments and status report.

The record (`STATE_DIR/run/wg-NAME/state.json`, 0600) holds what trueup
last set: the mode (kernel or wireguard-go), the secret references of the
private and preshared keys, and per peer the endpoint it set and the name it
came from (roaming is judged against it); it is read and written through
`sources.files` (`trueup.subsystems.daemonkit.RunRecord`). Key facts compare
digests of the live keys with digests of the stored secrets; no key is ever
returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from trueup.subsystems.base import Facts, Sources, Step, StepError
from trueup.subsystems.daemonkit import RunRecord, remove_file
from trueup.system.daemonspec import DaemonStatusJSON
from trueup.system.secretstore import (
    SECRETS_DIR,
    SecretError,
    read_secret,
    secret_digest,
)
from trueup.system.wireguard import WgDump, daemon_name

__all__ = [
    "ConfigureArgs",
    "EndpointSet",
    "InterfaceReport",
    "PeerArgs",
    "PeerReport",
    "WgRecord",
    "conf_args",
    "dump_report",
    "iface_path",
    "key_fact",
    "psk_fact",
    "read_record",
    "record_path",
    "remove_record",
    "secret_value",
    "update_record",
]

_STATE = "state.json"


class EndpointSet(TypedDict):
    """A peer's endpoint as trueup last set it, and the name it came from."""

    endpoint: str | None
    name: str | None


class WgRecord(TypedDict, total=False):
    """The record (`run/wg-NAME/state.json`): what trueup last set on the interface."""

    # "kernel" (a kernel WireGuard link) or "userspace" (wireguard-go).
    mode: str
    # The secret references of the private key and, per peer public key, its preshared key.
    private_key: str
    psk: dict[str, str]
    # Peer public key → the endpoint set.
    endpoints: dict[str, EndpointSet]
    # When the peers were last set (seconds since the epoch): roams are judged against it.
    set_at: float


class PeerArgs(TypedDict):
    """One peer of a `configure` step (no key: the preshared key is a secret reference)."""

    public_key: str
    endpoint: str | None
    endpoint_name: str | None
    allowed_ips: list[str]
    persistent_keepalive: int
    preshared_key: str | None


class ConfigureArgs(TypedDict):
    """A `configure` step's arguments (the private key is a secret reference)."""

    name: str
    private_key: str
    listen_port: int | None
    peers: list[PeerArgs]


class PeerReport(TypedDict):
    """One peer in status (`report`): the dump's view and the endpoint trueup set."""

    endpoint: str | None
    endpoint_name: str | None
    resolved_endpoint: str | None
    latest_handshake: int | None
    rx_bytes: int
    tx_bytes: int
    allowed_ips: list[str]
    persistent_keepalive: int


class InterfaceReport(TypedDict, total=False):
    """One interface in status (`report`); the dump's part only when it answers."""

    mode: str | None
    present: bool
    daemon: DaemonStatusJSON
    public_key: str | None
    listen_port: int
    peers: dict[str, PeerReport]


def iface_path(name: str, what: str) -> str:
    return f"spec.wireguard.interfaces[{name}].{what}"


def dump_report(dump: WgDump, record: WgRecord, entry: InterfaceReport) -> None:
    """Add what the dump says (and the endpoints trueup set) to an interface's `entry`."""
    endpoints = record.get("endpoints", {})
    entry["public_key"] = dump.public_key
    entry["listen_port"] = dump.listen_port
    peers: dict[str, PeerReport] = {}
    for key, peer in sorted(dump.peers.items()):
        last = endpoints.get(key)
        peers[key] = {
            "endpoint": peer.endpoint,
            "endpoint_name": last.get("name") if last else None,
            "resolved_endpoint": last.get("endpoint") if last else None,
            "latest_handshake": peer.latest_handshake or None,
            "rx_bytes": peer.rx_bytes,
            "tx_bytes": peer.tx_bytes,
            "allowed_ips": list(peer.allowed_ips),
            "persistent_keepalive": peer.keepalive,
        }
    entry["peers"] = peers


def conf_args(name: str, desired: Facts) -> ConfigureArgs:
    peers: list[PeerArgs] = []
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


def key_fact(sources: Sources, record: WgRecord, dump: WgDump) -> str:
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


def _run_record(sources: Sources, name: str) -> RunRecord[WgRecord]:
    return RunRecord(record_path(sources, name))


def read_record(sources: Sources, name: str) -> WgRecord:
    """The record as last written; empty when missing or damaged (the next write replaces it)."""
    return _run_record(sources, name).read(sources.files)


def update_record(sources: Sources, name: str, changes: WgRecord) -> None:
    _run_record(sources, name).update(sources.files, lambda record: record.update(changes))


def remove_record(sources: Sources, name: str) -> None:
    remove_file(sources.files, record_path(sources, name))
