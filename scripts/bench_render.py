"""Rendering benchmark: 10,000 devices from 5 profiles, and a one-variable change.

In process. Five profiles in the shape an operator writes them: a base for every
device (management, firewall, sysctl, convergence), one per site (`site=ams`,
`site=fra`: DNS zone and resolvers from variables) and one per role
(`role=edge`: LAN interface, DHCP subnet and routes from variables;
`role in (core)`: HA virtual addresses). Each device has its labels and 4-7
variables (addresses, prefixes, resolvers, MTU).

1. **Render every device** (select, substitute, merge, validate, digest): wall
   time, µs per device and the process's peak RSS with every result held.
   Baseline in the same run: `parse_document` of the same 10,000 rendered
   documents — the validation any stored document costs anyway.
2. **A one-variable change**: the core devices' `vip` changes; the devices whose
   selected profiles use `vip` are found (`Renderer.references`) and only they
   are re-rendered. Compared with rendering every device.

`python -m scripts.bench render` (writes docs/benchmarks.md) or
`python -m scripts.bench_render [--quick]`.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from typing import Any

from trueup.model.document import parse_document
from trueup.model.layering import DeviceInputs, Profile, Rendered, Renderer, parse_profile

DEVICES = 10_000
QUICK_DEVICES = 2_000


def _profile(
    name: str, priority: int, selector: str, variables: dict[str, Any], document: dict[str, Any]
) -> Profile:
    return parse_profile(
        {
            "apiVersion": "trueup/v1",
            "kind": "Profile",
            "metadata": {"name": name, "priority": priority},
            "spec": {"selector": selector, "variables": variables, "document": document},
        },
        source=f"profiles/{name}",
        version=1,
    )


def profiles() -> list[Profile]:
    base = _profile(
        "base",
        0,
        "",
        {"mgmt_address": {"type": "ipv4-prefix", "required": True}},
        {
            "management": {
                "interface": "mgmt0",
                "addresses": ["${mgmt_address}"],
                "gateway": "198.51.100.1",
                "api": {"port": 7443},
            },
            "sysctl": {"net.ipv4.ip_forward": 1, "net.ipv6.conf.all.forwarding": 1},
            "firewall": {
                "sets": [{"name": "ops", "type": "ipv4_addr", "elements": ["198.51.100.7"]}],
                "chains": [
                    {
                        "name": "input",
                        "type": "filter",
                        "hook": "input",
                        "policy": "drop",
                        "rules": [
                            "ct state established,related accept",
                            'iifname "mgmt0" tcp dport 7443 accept',
                            "ip saddr @ops tcp dport 22 accept",
                        ],
                    }
                ],
            },
            "convergence": {"default": "auto", "subsystems": {"dhcp": "notify"}},
        },
    )
    sites = [
        _profile(
            f"site-{site}",
            100,
            f"site={site}",
            {
                "site": {"type": "string", "pattern": "[a-z]{3}", "default": site},
                "resolvers": {"type": "list", "items": "ip", "default": ["203.0.113.53"]},
                "dns_listen": {"type": "ipv4", "required": True},
            },
            {"dns": {"zone": "${site}.example.test", "listen": ["${dns_listen}"], "ttl": 300}},
        )
        for site in ("ams", "fra")
    ]
    edge = _profile(
        "edge",
        200,
        "role=edge",
        {
            "lan_address": {"type": "ipv4-prefix", "required": True},
            "lan_subnet": {"type": "prefix", "required": True},
            "lan_mtu": {"type": "integer", "minimum": 1280, "maximum": 9000, "default": 1500},
            "upstream": {"type": "ipv4", "default": "203.0.113.254"},
        },
        {
            "interfaces": [
                {"name": "lan0", "mtu": "${lan_mtu}", "addresses": ["${lan_address}"]},
            ],
            "routes": [{"to": "192.0.2.0/24", "via": "${upstream}"}],
            "dhcp": {
                "interfaces": ["lan0"],
                "subnets": [{"id": 1, "subnet": "${lan_subnet}"}],
            },
        },
    )
    core = _profile(
        "core",
        200,
        "role in (core)",
        {"vip": {"type": "ipv4-prefix", "required": True}},
        {
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.2/24"]}],
            "ha": {
                "role": "primary",
                "vips": [{"interface": "lan0", "vrid": 51, "addresses": ["${vip}"]}],
            },
        },
    )
    return [base, *sites, edge, core]


def devices(count: int) -> list[DeviceInputs]:
    out = []
    for index in range(count):
        site = ("ams", "fra")[index % 2]
        role = "core" if index % 5 == 0 else "edge"
        host = 2 + index % 250
        variables: dict[str, Any] = {
            "mgmt_address": f"198.51.100.{host}/24",
            "dns_listen": "203.0.113.1",
        }
        if index % 7 == 0:
            variables["resolvers"] = ["203.0.113.53", "2001:db8::53"]
        if role == "edge":
            variables["lan_address"] = f"203.0.113.{1 + index % 100}/24"
            variables["lan_subnet"] = "203.0.113.0/24"
            if index % 3 == 0:
                variables["lan_mtu"] = 9000
        else:
            variables["vip"] = f"203.0.113.{100 + index % 100}/24"
        out.append(
            DeviceInputs(
                name=f"edge-{index:05d}",
                labels={"site": site, "role": role, "rack": str(index % 40)},
                variables=variables,
            )
        )
    return out


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(quick: bool = False) -> str:
    count = QUICK_DEVICES if quick else DEVICES
    fleet = devices(count)
    gc.collect()
    rss_before = _rss_mb()
    renderer = Renderer(profiles())
    rendered: list[Rendered] = []
    render_s = parse_s = 0.0
    # Render and baseline interleaved, 250 devices at a time: a load change on the
    # machine weighs on both alike.
    for first in range(0, count, 250):
        chunk = fleet[first : first + 250]
        start = time.perf_counter()
        done = [renderer.render(device) for device in chunk]
        render_s += time.perf_counter() - start
        start = time.perf_counter()
        for result in done:
            parse_document(result.document)
        parse_s += time.perf_counter() - start
        rendered.extend(done)
    rss_peak = _rss_mb()
    assert len({r.digest for r in rendered}) > count // 10

    # A one-variable change: every core device's `vip` moves (best of 3).
    by_name = {r.device: r for r in rendered}
    change_s = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        changed = [
            DeviceInputs(
                d.name,
                d.labels,
                {**d.variables, "vip": d.variables["vip"].replace("203.0.113.", "192.0.2.")},
            )
            for d in fleet
            if "vip" in renderer.references(d.labels)
        ]
        again = [renderer.render(device) for device in changed]
        change_s = min(change_s, time.perf_counter() - start)
        assert all(a.digest != by_name[a.device].digest for a in again)
    full_again_s = render_s

    per_device = render_s / count * 1e6
    per_parse = parse_s / count * 1e6
    return "\n".join(
        [
            "## Rendering devices from profiles",
            "",
            f"In process, {count:,} devices from 5 profiles (a base for all, one per site by "
            "`site=…`, one per role by `role=edge` / `role in (core)`), each device with its "
            "labels and 4-7 typed variables (addresses, prefixes, resolvers, MTU). *Render*: "
            "select the profiles, check the variables, substitute, merge, validate with the "
            "document model and digest, every result held. *Baseline*: `parse_document` of the "
            "same rendered documents (the validation any stored document costs). *One-variable "
            "change*: the core devices' `vip` changes; only the devices whose profiles use it "
            "are found and re-rendered (best of 3), compared with rendering every device. "
            "Render and baseline run interleaved, 250 devices at a time.",
            "",
            "| figure | value | baseline | ratio |",
            "|---|---:|---:|---:|",
            f"| render {count:,} devices, s | {render_s:.2f} | {parse_s:.2f} "
            f"| {render_s / parse_s:.2f} |",
            f"| per device, µs | {per_device:,.0f} | {per_parse:,.0f} "
            f"| {per_device / per_parse:.2f} |",
            f"| peak RSS, MB (before: {rss_before:,.0f}) | {rss_peak:,.0f} | — | — |",
            f"| one-variable change: {len(changed):,} devices re-rendered, s | {change_s:.2f} "
            f"| {full_again_s:.2f} (all) | {change_s / full_again_s:.2f} |",
            "",
            "Goal: under 10 s and 500 MB for 10,000 devices. Measured by "
            f"`.venv/bin/python -m scripts.bench render`{' (quick)' if quick else ''}.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
