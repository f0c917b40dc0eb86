"""The document model is pure data: parsing a document loads every section and nothing else.

Sections live in light modules (`trueup/subsystems/NAME/section.py`), listed in
the catalog; loading them imports no `trueup.system` module and no subsystem's
implementation. Cross-section checks are declared on the section (`CrossCheck`,
with the other sections they read) and run through `trueup.model.sections`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from trueup.model import catalog
from trueup.model.document import DocumentError, parse_document
from trueup.model.sections import OtherSections, Section, registered_sections
from trueup.subsystems.registry import SUBSYSTEMS

PEER = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="


def every_section(ha_role: str = "primary") -> dict[str, Any]:
    """A document that uses every section trueup ships."""
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "edge-01"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [
                {"name": "lan0", "addresses": ["203.0.113.1/24"]},
                {"name": "wan0", "addresses": ["192.0.2.2/28"]},
            ],
            "gateways": {
                "tables": ["main"],
                "uplinks": [
                    {
                        "name": "isp",
                        "interface": "wan0",
                        "gateway": "192.0.2.1",
                        "probes": {"icmp": ["192.0.2.1"]},
                    }
                ],
            },
            "sysctl": {"net.ipv4.ip_forward": 1},
            "firewall": {
                "chains": [{"name": "input", "type": "filter", "hook": "input", "policy": "accept"}]
            },
            "dhcp": {
                "interfaces": ["lan0"],
                "subnets": [
                    {"id": 1, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100-203.0.113.150"]}
                ],
                "ha": {
                    "this-server": "a",
                    "peers": [
                        {"name": "a", "url": "http://192.0.2.1:8000/", "role": "primary"},
                        {"name": "b", "url": "http://192.0.2.2:8000/", "role": "standby"},
                    ],
                },
            },
            "dns": {"zone": "lan.test", "listen": ["203.0.113.1"]},
            "routing": {
                "router_id": "192.0.2.1",
                "ospf": {"areas": [{"id": 0, "interfaces": [{"name": "lan0"}]}]},
            },
            "ha": {
                "role": ha_role,
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
                        "peers": [{"public_key": PEER, "allowed_ips": ["192.0.2.128/25"]}],
                    }
                ]
            },
        },
    }


_PROBE = """
import json, sys
import trueup.model
from trueup.model import catalog
from trueup.model.document import DocumentError, parse_document
from trueup.model.sections import registered_sections

sections = [catalog.load(reference).name for reference in catalog.SECTIONS]
document = json.loads(sys.argv[1])
parsed = parse_document(document)
used = sorted(name for name in registered_sections() if parsed.spec.section(name) is not None)
document["spec"]["ha"]["role"] = "standby"  # a cross-section check that fires
try:
    parse_document(document)
    refused = []
except DocumentError as exc:
    refused = exc.problems
print(json.dumps({
    "sections": sections,
    "used": used,
    "refused": refused,
    "modules": sorted(m for m in sys.modules if m.startswith("trueup")),
}))
"""


def test_parsing_a_document_imports_no_system_module_and_no_subsystem_implementation() -> None:
    """A fresh interpreter: import trueup.model, load every section, parse a document using
    every one of them (and one a cross-section check refuses)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(every_section())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert sorted(seen["sections"]) == seen["used"]  # every section, used by the document
    assert len(seen["used"]) == len(catalog.SECTIONS) == 9
    assert any(p.startswith("spec.dhcp.ha.peers[0].role: this server (a)") for p in seen["refused"])
    system = [m for m in seen["modules"] if m == "trueup.system" or m.startswith("trueup.system.")]
    assert system == []
    subsystems = [m for m in seen["modules"] if m.startswith("trueup.subsystems")]
    packages = {"trueup.subsystems", *(f"trueup.subsystems.{p}" for p in _section_packages())}
    beyond = [m for m in subsystems if m not in packages and not m.endswith(".section")]
    assert beyond == []
    # Nothing above the model either (the catalog names, it does not build, subsystems).
    above = [m for m in seen["modules"] if m.startswith(("trueup.reconcile", "trueup.journal"))]
    assert above == []


def _section_packages() -> list[str]:
    return [reference.split(".")[2] for reference in catalog.SECTIONS]


def test_every_subsystem_declares_the_section_the_catalog_lists() -> None:
    listed = {section.name: section for section in map(catalog.load, catalog.SECTIONS)}
    owned = {}
    for cls in SUBSYSTEMS:
        if cls.section is None:
            continue
        assert isinstance(cls.section, Section), cls
        owned[cls.section.name] = cls.section
        assert listed[cls.section.name] is cls.section
    assert owned.keys() == listed.keys()
    assert {n: s.model for n, s in listed.items()} == registered_sections()


def test_cross_checks_are_declared_with_the_sections_they_read() -> None:
    ha = catalog.load("trueup.subsystems.ha.section:SECTION")
    assert [check.against for check in ha.checks] == [(), ("dhcp",)]
    readers = {
        section.name: sorted({name for check in section.checks for name in check.against})
        for section in map(catalog.load, catalog.SECTIONS)
    }
    assert {name: read for name, read in readers.items() if read} == {"ha": ["dhcp"]}


def test_a_cross_check_reads_only_the_sections_it_declared() -> None:
    class View(BaseModel):
        ha: dict[str, Any] | None = None

    parsed = parse_document(every_section())
    dhcp = parsed.spec.section("dhcp")
    assert dhcp is not None
    others = OtherSections(("dhcp",), {"dhcp": dhcp})
    view = others.get("dhcp", View)
    assert view is not None and view.ha is not None and view.ha["this_server"] == "a"
    with pytest.raises(KeyError, match=r"spec\.ha is not among the sections this check declares"):
        others.get("ha", View)
    assert OtherSections(("dhcp",), {}).get("dhcp", View) is None


def test_the_role_check_names_both_places() -> None:
    with pytest.raises(DocumentError) as bad:
        parse_document(every_section(ha_role="standby"))
    assert bad.value.problems == [
        "spec.dhcp.ha.peers[0].role: this server (a) is the Kea HA primary but spec.ha.role "
        "is standby; DHCP's HA role must follow it (Kea HA peer role backup or secondary "
        "or standby)"
    ]
