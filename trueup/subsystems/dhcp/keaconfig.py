"""`spec.dhcp` compiled into Kea's configuration (pure: no I/O).

One function per family: `compile_config(section, family, paths, interfaces)`
returns the JSON object Kea reads (`{"Dhcp4": {...}}`). trueup always sets:

* the memfile lease backend on `paths.leases` (Kea's file, trueup never writes it);
* a unix control socket at `paths.socket` (in a 0700 directory: root only);
* the `lease_cmds` hook (read-only lease inspection over the socket);
* the HA hook **only** when the document has `ha:` — a document without it
  compiles to a configuration with no HA library and no HA parameters, which
  is what Kea gets at apply and at every start;
* socket retries (`service-sockets-max-retries`/`-retry-wait-time`) so an
  interface whose address comes late is bound when it comes;
* logging to stdout (the supervisor appends it to the daemon's log);
* for DHCPv6, `data-directory` in the run directory: Kea keeps its server
  DUID there (`kea-dhcp6-serverid`), stable across restarts.

`interfaces` is the subset of `section.interfaces` present on the system
now: Kea refuses a configuration naming an interface that does not exist,
so the others are added by a re-configuration when their link appears.

`digest(config)` is the canonical hash trueup compares.

The allocator fence lives in the configuration itself: `with_fence(config,
True)` adds Kea's special client class `DROP` with a test that is always true
(`FENCE_CLASS`), so Kea drops every packet it receives — before any lease
is looked up or allocated — from the first packet after it starts.
`with_fence(config, False)` removes it again. The fence class is not part of
what the document asks for: `unfenced(body)` is what digests are computed
from, and whether the class is there is the `allocation` fact of its own.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.subsystems.dhcp.section import DhcpSection, OptionValue, Subnet
from trueup.system.kea import HA_HOOK, LEASE_CMDS_HOOK, KeaPaths

__all__ = [
    "FENCE_CLASS",
    "compile_config",
    "digest",
    "has_fence",
    "has_ha",
    "unfenced",
    "with_fence",
]

# Kea drops every packet classified `DROP`, right after parsing it and before any
# lease is touched; the test is a constant, so every packet is classified.
FENCE_TEST = "'trueup-fence' == 'trueup-fence'"
FENCE_CLASS: JSONObject = {"name": "DROP", "test": FENCE_TEST}


def digest(config: Any) -> str:
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _option_data(options: dict[str, OptionValue]) -> list[JSONObject]:
    out = []
    for name, value in sorted(options.items()):
        if isinstance(value, list):
            data = ", ".join(str(v) for v in value)
        elif isinstance(value, bool):
            data = "true" if value else "false"
        else:
            data = str(value)
        out.append({"name": name, "data": data})
    return out


def _subnet(section: DhcpSection, index: int, subnet: Subnet, family: int) -> JSONObject:
    out: JSONObject = {"id": section.subnet_id(index), "subnet": subnet.subnet}
    if subnet.interface is not None:
        out["interface"] = subnet.interface
    out["pools"] = [{"pool": pool} for pool in subnet.pools]
    if subnet.options:
        out["option-data"] = _option_data(subnet.options)
    if subnet.valid_lifetime is not None:
        out["valid-lifetime"] = subnet.valid_lifetime
    reservations = []
    for reservation in subnet.reservations:
        entry: JSONObject = {}
        if reservation.hw_address is not None:
            entry["hw-address"] = reservation.hw_address
        if reservation.duid is not None:
            entry["duid"] = reservation.duid
        if family == 4:
            entry["ip-address"] = reservation.ip_address
        else:
            entry["ip-addresses"] = [reservation.ip_address]
        if reservation.hostname:
            entry["hostname"] = reservation.hostname
        reservations.append(entry)
    if reservations:
        out["reservations"] = reservations
    return out


def has_ha(config: JSONObject) -> bool:
    """Whether a Kea configuration carries any HA hook or HA parameters."""
    for body in config.values():
        if not isinstance(body, dict):
            continue
        for hook in body.get("hooks-libraries", []) or []:
            library = str(hook.get("library", "")) if isinstance(hook, dict) else ""
            parameters = hook.get("parameters", {}) if isinstance(hook, dict) else {}
            if "libdhcp_ha" in library or "high-availability" in (parameters or {}):
                return True
    return False


def _is_fence(entry: Any) -> bool:
    return (
        isinstance(entry, dict) and entry.get("name") == "DROP" and entry.get("test") == FENCE_TEST
    )


def _bodies(config: Any) -> list[JSONObject]:
    if not isinstance(config, dict):
        return []
    return [
        body for key, body in config.items() if key in ("Dhcp4", "Dhcp6") and isinstance(body, dict)
    ]


def has_fence(config: Any) -> bool:
    """Whether a Kea configuration (`{"DhcpN": ...}`) carries trueup's fence class."""
    return any(
        any(_is_fence(entry) for entry in body.get("client-classes") or [])
        for body in _bodies(config)
    )


def unfenced(body: Any) -> Any:
    """A `DhcpN` body without the fence class (what digests are computed from)."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    classes = [entry for entry in out.get("client-classes") or [] if not _is_fence(entry)]
    if classes:
        out["client-classes"] = classes
    else:
        out.pop("client-classes", None)
    return out


def with_fence(config: JSONObject, held: bool) -> JSONObject:
    """`config` with the fence class first in every body (`held`), or with none."""
    out = copy.deepcopy(config)
    for key, body in list(out.items()):
        if key not in ("Dhcp4", "Dhcp6") or not isinstance(body, dict):
            continue
        body = unfenced(body)
        if held:
            body["client-classes"] = [dict(FENCE_CLASS), *body.get("client-classes", [])]
        out[key] = body
    return out


def compile_config(
    section: DhcpSection, family: int, paths: KeaPaths, interfaces: list[str]
) -> JSONObject:
    lifetimes = section.lifetimes
    hooks: list[JSONObject] = [{"library": str(LEASE_CMDS_HOOK)}]
    if section.ha is not None:
        ha = section.ha
        hooks.append(
            {
                "library": str(HA_HOOK),
                "parameters": {
                    "high-availability": [
                        {
                            "this-server-name": ha.this_server,
                            "mode": ha.mode,
                            "peers": [
                                {
                                    "name": peer.name,
                                    "url": peer.url,
                                    "role": peer.role,
                                    "auto-failover": peer.auto_failover,
                                }
                                for peer in ha.peers
                            ],
                        }
                    ]
                },
            }
        )
    body: JSONObject = {
        "interfaces-config": {
            "interfaces": sorted(interfaces),
            "re-detect": True,
            "service-sockets-max-retries": 1000000,
            "service-sockets-retry-wait-time": 2000,
        },
        "control-socket": {"socket-type": "unix", "socket-name": str(paths.socket)},
        "lease-database": {
            "type": "memfile",
            "name": str(paths.leases),
            "persist": True,
            "lfc-interval": 3600,
        },
        "hooks-libraries": hooks,
        "valid-lifetime": lifetimes.valid,
        "loggers": [
            {
                "name": f"kea-dhcp{family}",
                "output_options": [{"output": "stdout"}],
                "severity": "INFO",
            }
        ],
    }
    if lifetimes.renew is not None:
        body["renew-timer"] = lifetimes.renew
    if lifetimes.rebind is not None:
        body["rebind-timer"] = lifetimes.rebind
    if family == 6:
        # The server's DUID file (kea-dhcp6-serverid) goes beside its leases, in
        # the run directory, not in a package's /var/lib/kea, which may not exist.
        body["data-directory"] = str(paths.run_dir)
    if family == 6 and lifetimes.preferred is not None:
        body["preferred-lifetime"] = lifetimes.preferred
    if section.options:
        body["option-data"] = _option_data(section.options)
    body[f"subnet{family}"] = [
        _subnet(section, i, subnet, family)
        for i, subnet in enumerate(section.subnets)
        if subnet.family == family
    ]
    return {f"Dhcp{family}": body}
