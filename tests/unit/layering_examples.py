"""Documents and profiles the layering tests share: one full document using every section."""

from __future__ import annotations

import copy
from typing import Any

from trueup.model.layering import Profile, parse_profile

PUBLIC_KEY = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
OTHER_KEY = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="


def full_spec() -> dict[str, Any]:
    """A device spec with every section, valid as written."""
    return copy.deepcopy(
        {
            "management": {
                "interface": "mgmt0",
                "addresses": ["198.51.100.2/24"],
                "gateway": "198.51.100.1",
                "api": {"port": 7443},
            },
            "interfaces": [
                {"name": "lan0", "state": "up", "mtu": 1500, "addresses": ["203.0.113.1/24"]},
                {"name": "lan1", "addresses": ["192.0.2.1/25", "2001:db8:1::1/64"]},
            ],
            "routes": [
                {"to": "203.0.113.128/25", "via": "203.0.113.2"},
                {"to": "192.0.2.128/25", "dev": "lan1", "table": "isp"},
            ],
            "tables": {"isp": 100},
            "sysctl": {"net.ipv4.ip_forward": 1},
            "firewall": {
                "sets": [{"name": "ops", "type": "ipv4_addr", "elements": ["198.51.100.7"]}],
                "chains": [
                    {
                        "name": "input",
                        "type": "filter",
                        "hook": "input",
                        "policy": "drop",
                        "rules": ["ct state established,related accept", "jump web"],
                    },
                    {"name": "web", "rules": ["tcp dport { 80, 443 } accept"]},
                ],
            },
            "dhcp": {
                "interfaces": ["lan0"],
                "subnets": [
                    {
                        "id": 1,
                        "subnet": "203.0.113.0/24",
                        "pools": ["203.0.113.100-203.0.113.150"],
                        "reservations": [
                            {"hw-address": "02:00:00:00:00:aa", "ip-address": "203.0.113.20"}
                        ],
                    }
                ],
                "ha": {
                    "this-server": "edge-01",
                    "peers": [
                        {"name": "edge-01", "url": "http://192.0.2.1:8000/", "role": "primary"},
                        {"name": "edge-02", "url": "http://192.0.2.2:8000/", "role": "standby"},
                    ],
                },
            },
            "dns": {
                "zone": "lan.test",
                "listen": ["203.0.113.1"],
                "records": [
                    {"name": "router", "type": "A", "value": "203.0.113.1"},
                    {"name": "www", "type": "CNAME", "value": "router", "ttl": 60},
                ],
            },
            "ha": {
                "role": "primary",
                "vips": [{"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.254/24"]}],
            },
            "proxies": [
                {
                    "name": "web",
                    "bind": "203.0.113.1:80",
                    "backend": {"servers": [{"name": "app1", "address": "192.0.2.10:8080"}]},
                }
            ],
            "wireguard": {
                "interfaces": [
                    {
                        "name": "wg0",
                        "private_key": {"secret_ref": "wg0-key"},
                        "addresses": ["192.0.2.129/25"],
                        "peers": [{"public_key": PUBLIC_KEY, "allowed_ips": ["198.51.100.128/25"]}],
                    }
                ]
            },
            "convergence": {"default": "auto", "subsystems": {"dhcp": "notify"}},
        }
    )


def full_document(device: str = "edge-01") -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": device},
        "spec": full_spec(),
    }


def profile(
    name: str,
    document: dict[str, Any],
    *,
    selector: str = "",
    priority: int = 100,
    variables: dict[str, Any] | None = None,
    version: int = 1,
) -> Profile:
    return parse_profile(
        {
            "apiVersion": "trueup/v1",
            "kind": "Profile",
            "metadata": {"name": name, "priority": priority},
            "spec": {"selector": selector, "variables": variables or {}, "document": document},
        },
        source=f"profiles/{name}",
        version=version,
    )
