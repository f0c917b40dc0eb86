"""The management facts of the last commit (`management.json`): what the fast path brings up.

Who calls this: the engine's commit writes the file at every commit that
accepts a document; `trueup.agent.fastboot` reads it before anything heavy
is imported (`boot_facts`: which facts to come up with, as phase 1 would
choose them, from plain JSON), to bring the management address and the API
listener up in a few milliseconds; the console recovery path (`trueup
management set`) writes it too.

```
{"schema": 1, "interface": "mgmt0", "addresses": ["198.51.100.2/24"],
 "gateway": "198.51.100.1" | null, "api": {"port": 7443, "bind": null | ADDRESS | "management"},
 "version": 12, "digest": "sha256:…", "checksum": "crc32:…"}
```

`bind` is the document's `spec.management.api.bind` as written ("management"
names the first management address). `virtual` (present only when the
document has HA virtual addresses: `spec.ha.vips`) lists their hosts: the API
never binds one of them, whatever `bind` says — a bind saved before an
address became virtual serves on the wildcard instead. `checksum` covers every other field, so
a garbled byte that still parses (an address one digit off) is refused like a
torn file; `read_management` returns None for anything it cannot trust and
never raises. It is a corruption check, not a signature: crc32 because this
module is imported on the fast path, where hashlib's OpenSSL load would cost
more than the rest of the file handling.

Stdlib only (besides `trueup.system.atomicfile` and `trueup.system.safefile`): it is imported before
pydantic and the rest of the agent.
"""

from __future__ import annotations

import ipaddress
import json
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from trueup.journal.override import OVERRIDE_FILE, override_facts, read_override
from trueup.model.jsontypes import JSONObject
from trueup.system.atomicfile import write_atomic
from trueup.system.safefile import read_file

__all__ = [
    "MANAGEMENT_FILE",
    "MANAGEMENT_SCHEMA",
    "ApiFacts",
    "BootFacts",
    "api_bind_address",
    "boot_facts",
    "management_facts",
    "read_management",
    "write_management",
]

MANAGEMENT_FILE = "management.json"
MANAGEMENT_SCHEMA = 1
_FIELDS = ("interface", "addresses", "gateway", "api", "version", "digest")
# Any record a valid document gives fits: documents are bounded at 1 MiB
# (`trueup.model.limits.DOCUMENT_BYTES`), and their management section, written
# with indentation, at less than 8 times that. `write_management` refuses more,
# so what is written is always read back.
_MAX_BYTES = 8 << 20
_REVISION_BYTES = 32 << 20  # an accepted revision: a document and its metadata


class ApiFacts(TypedDict):
    """The API listener: its port, and the address it binds (None: the wildcard)."""

    port: int
    bind: str | None  # an address, or "management" (the first management address)


class BootFacts(TypedDict):
    """The facts of `management.json` (without its schema and checksum): what the fast path
    brings up, and the revision they are of."""

    interface: str
    addresses: list[str]
    gateway: str | None
    api: ApiFacts
    version: int | None
    digest: str | None
    virtual: NotRequired[list[str]]  # the hosts of the HA virtual addresses, when any


def management_facts(
    management: JSONObject,
    *,
    version: int | None,
    digest: str | None,
    virtual: list[str] | None = None,
) -> BootFacts:
    """The facts of a document's `spec.management` section (as JSON: `model_dump(mode="json")`).

    `virtual`: the document's HA virtual addresses (`ADDRESS/LEN` or hosts).
    """
    api = management.get("api") or {}
    facts: BootFacts = {
        "interface": management["interface"],
        "addresses": list(management["addresses"]),
        "gateway": management.get("gateway"),
        "api": {"port": int(api.get("port", 7443)), "bind": api.get("bind")},
        "version": version,
        "digest": digest,
    }
    if virtual:
        facts["virtual"] = sorted({str(v).split("/", 1)[0].lower() for v in virtual})
    return facts


def _fields(facts: Mapping[str, object]) -> tuple[str, ...]:
    # `virtual` joins the checksum only when present: records written before it verify.
    return (*_FIELDS, "virtual") if facts.get("virtual") else _FIELDS


def _checksum(facts: Mapping[str, object]) -> str:
    body = json.dumps(
        {k: facts.get(k) for k in _fields(facts)}, sort_keys=True, separators=(",", ":")
    )
    return f"crc32:{zlib.crc32(body.encode()):08x}"


def write_management(root: Path, facts: BootFacts) -> None:
    """Replace `root/management.json` atomically and durably (fsync'd); raises OSError."""
    record: JSONObject = {k: facts.get(k) for k in _fields(facts)}
    problem = _problem(record)
    if problem is not None:
        raise ValueError(f"management facts: {problem}")
    record["schema"] = MANAGEMENT_SCHEMA
    record["checksum"] = _checksum(record)
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    if len(data) > _MAX_BYTES:
        raise ValueError(
            f"management facts: {len(data)} bytes, over the {_MAX_BYTES} bytes the fast "
            f"path reads back from {MANAGEMENT_FILE}"
        )
    write_atomic(Path(root) / MANAGEMENT_FILE, data)


def read_management(root: Path) -> BootFacts | None:
    """The facts in `root/management.json`; None when missing, unreadable or not to be trusted."""
    try:
        data = read_file(Path(root) / MANAGEMENT_FILE, _MAX_BYTES)  # never through a link
        if len(data) > _MAX_BYTES:
            return None
        record = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8, not JSON
        return None
    if not isinstance(record, dict) or record.get("schema") != MANAGEMENT_SCHEMA:
        return None
    if record.get("checksum") != _checksum(record):
        return None
    facts = {k: record.get(k) for k in _fields(record)}
    return cast("BootFacts", facts) if _problem(facts) is None else None


def api_bind_address(facts: BootFacts) -> str | None:
    """The address the API binds (None: the wildcard), as `DeviceSpec.api_bind_address`.

    Never an HA virtual address (`virtual`): that one is held only while the
    HA role holds it, so the wildcard serves instead.
    """
    bind = facts["api"].get("bind")
    if bind == "management":
        named = str(facts["addresses"][0]).split("/")[0]
    elif bind is None:
        return None
    else:
        named = str(bind)
    if named.lower() in (facts.get("virtual") or []):
        return None
    return named


def _problem(facts: JSONObject) -> str | None:
    """What makes `facts` (as read, before they are trusted) unusable, or None."""
    interface = facts.get("interface")
    if not isinstance(interface, str) or not 0 < len(interface) < 16:
        return "interface: not an interface name"
    if "/" in interface or any(c.isspace() for c in interface):
        return "interface: not an interface name"
    addresses = facts.get("addresses")
    if not isinstance(addresses, list) or not addresses:
        return "addresses: not a non-empty list"
    try:
        for prefix in addresses:
            if not isinstance(prefix, str) or "/" not in prefix:
                return f"addresses: {prefix!r} is not an address/prefix"
            ipaddress.ip_interface(prefix)
        gateway = facts.get("gateway")
        if gateway is not None:
            if not isinstance(gateway, str):
                return "gateway: not an address"
            ipaddress.ip_address(gateway)
        api = facts.get("api")
        if not isinstance(api, dict):
            return "api: not a mapping"
        port = api.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return "api.port: not a port number"
        bind = api.get("bind")
        if bind is not None and bind != "management":
            if not isinstance(bind, str):
                return "api.bind: not an address"
            ipaddress.ip_address(bind)
    except ValueError as exc:
        return str(exc)
    version = facts.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        return "version: not a number"
    digest = facts.get("digest")
    if digest is not None and not isinstance(digest, str):
        return "digest: not a string"
    virtual = facts.get("virtual")
    if virtual is not None and (
        not isinstance(virtual, list) or not all(isinstance(v, str) for v in virtual)
    ):
        return "virtual: not a list of addresses"
    return None


# -- which facts to come up with, before the model is imported --------------------
def _json_file(path: Path) -> Any:
    try:
        return json.loads(read_file(path, _REVISION_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None


def _revision_facts(root: Path, version: int, digest: str | None) -> BootFacts | None:
    """`spec.management` of accepted revision `version`, read as JSON (no model)."""
    record = _json_file(root / "revisions" / f"{version:08d}.json")
    try:
        spec = record["document"]["spec"]
        vips = (spec.get("ha") or {}).get("vips") or []
        virtual = [str(a) for vip in vips for a in (vip.get("addresses") or [])]
        return management_facts(spec["management"], version=version, digest=digest, virtual=virtual)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _expired_confirmation(pending: Any, applied_version: int, now: float) -> int | None:
    """The confirmed version to come up as when an unconfirmed apply's time is up, else None.

    The same decision as `trueup.reconcile.confirm.decide` (its `expired` case),
    which phase 1 makes again with the full model.
    """
    if not isinstance(pending, dict):
        return None
    try:
        confirmed = int(pending.get("confirmed_version", 0))
        version = pending.get("version")
        if applied_version == confirmed:
            return None  # stale: the guarded apply never took effect
        if version is not None and applied_version != int(version):
            return None  # superseded
        return confirmed if now >= float(pending["deadline"]) else None
    except (KeyError, TypeError, ValueError):
        return None


def boot_facts(root: Path) -> tuple[BootFacts, str] | None:
    """(facts, where from) for the fast path; None when nothing is trustworthy (full path only).

    The same order as phase 1 (`trueup.startup.sources`), read as plain JSON:
    a console override (`trueup management set`) laid over the rest; then
    `management.json`, unless it names another revision than `applied.json`
    (a crash between the two writes of a commit); then the applied revision's
    `spec.management`. An unreadable `applied.json` does not count against
    `management.json` (that is what the copy is for). An unconfirmed apply
    whose confirmation expired comes up as last confirmed.
    """
    found = _committed_facts(root)
    try:
        override = read_override(root)
    except (OSError, ValueError):  # damaged: phase 1 reports it
        override = None
    if override is None:
        return found
    base = found[0] if found is not None else None
    by_hand = override_facts(override)
    facts: BootFacts = {
        "interface": by_hand.interface,
        "addresses": list(by_hand.addresses),
        "gateway": by_hand.gateway,
        "api": base["api"] if base else {"port": 7443, "bind": None},
        "version": base["version"] if base else None,
        "digest": base["digest"] if base else None,
    }
    return facts, OVERRIDE_FILE


def _committed_facts(root: Path) -> tuple[BootFacts, str] | None:
    facts = read_management(root)
    source = MANAGEMENT_FILE
    applied = _json_file(root / "applied.json")
    if not isinstance(applied, dict) or not isinstance(applied.get("version"), int):
        applied = None
    if facts is not None and applied is not None:
        for key, held in (("version", facts["version"]), ("digest", facts["digest"])):
            if applied.get(key) and held not in (None, applied[key]):
                facts = None  # another revision's: the applied one wins
                break
    if facts is None and applied is not None and applied["version"]:
        facts = _revision_facts(root, applied["version"], applied.get("digest"))
        source = f"revision {applied['version']}"
    if facts is None:
        return None
    applied_version = applied["version"] if applied is not None else facts["version"]
    if isinstance(applied_version, int):
        pending = _json_file(root / "pending-confirm.json")
        confirmed = _expired_confirmation(pending, applied_version, time.time())
        if confirmed is not None:
            if not confirmed:
                return None  # nothing was ever confirmed: phase 1 decides from the config
            facts = _revision_facts(root, confirmed, None)
            source = f"revision {confirmed} (confirmation expired)"
            if facts is None:
                return None
    return facts, source
