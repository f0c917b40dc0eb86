"""The desired-state document: every error names its path; canonical values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import (
    DocumentError,
    document_digest,
    json_schema,
    load_document,
    parse_document,
)


def _problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(DocumentError) as caught:
        parse_document(document, "doc.yaml")
    return caught.value.problems


def test_valid_document_is_canonical() -> None:
    document = base_document()
    document["spec"]["interfaces"][0]["addresses"] = ["2001:DB8:1:0::1/64", "203.0.113.1/24"]
    parsed = parse_document(document)
    assert parsed.spec.interfaces[0].addresses == ["2001:db8:1::1/64", "203.0.113.1/24"]
    assert parsed.spec.table_number("wan2") == 100
    assert parsed.spec.table_number("main") == 254


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            ("spec", "interfaces", 0, "addresses", 0),
            "203.0.113.1",
            "spec.interfaces[0].addresses[0]: not an IPv4/IPv6 prefix",
        ),
        (("spec", "interfaces", 0, "mtu"), 20, "spec.interfaces[0].mtu:"),
        (("spec", "interfaces", 0, "state"), "sideways", "spec.interfaces[0].state:"),
        (
            ("spec", "routes", 0, "to"),
            "192.0.2.1/24",
            "spec.routes[0].to: not an IPv4/IPv6 network",
        ),
        (
            ("spec", "management", "gateway"),
            "2001:db8::1",
            "spec.management.gateway: IPv6 gateway 2001:db8::1 but the management interface",
        ),
        (
            ("spec", "management", "interface"),
            "a-name-much-too-long-for-linux",
            "spec.management.interface: not an interface name",
        ),
        (("metadata", "version"), 0, "metadata.version:"),
        (("apiVersion",), "trueup/v2", "apiVersion: unsupported apiVersion 'trueup/v2'"),
        (("spec", "convergence", "default"), "sometimes", "spec.convergence.default:"),
        (
            ("spec", "convergence", "deadlines"),
            {"dhcp": -1},
            "spec.convergence.deadlines.dhcp: expected seconds",
        ),
    ],
)
def test_each_bad_value_is_reported_at_its_path(
    path: tuple[Any, ...], value: Any, expected: str
) -> None:
    document = base_document()
    target: Any = document
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[path[-1]] = value
    problems = _problems(document)
    assert any(p.startswith(expected) for p in problems), problems


def test_unknown_fields_are_refused_everywhere() -> None:
    document = base_document()
    document["spec"]["firewal"] = {}
    document["spec"]["management"]["api"] = {"port": 7443, "bnd": "198.51.100.2"}
    problems = _problems(document)
    assert any(p.startswith("spec.firewal: unknown field (not part of trueup/v1") for p in problems)
    assert "spec.management.api.bnd: unknown field (not part of trueup/v1)" in problems


def test_cross_checks_name_both_places() -> None:
    document = base_document()
    document["spec"]["interfaces"].append({"name": "lan1", "addresses": ["203.0.113.1/25"]})
    document["spec"]["routes"].append({"to": "192.0.2.0/24", "via": "203.0.113.9"})
    document["spec"]["routes"].append({"to": "198.51.100.0/24", "dev": "eth9"})
    document["spec"]["routes"].append({"to": "0.0.0.0/0", "via": "198.51.100.254"})
    problems = _problems(document)
    assert (
        "spec.interfaces[1].addresses[0]: duplicate address 203.0.113.1 "
        "(also spec.interfaces[0].addresses[0])"
    ) in problems
    assert any(p.startswith("spec.routes[2]: duplicate route to 192.0.2.0/24") for p in problems)
    assert any(
        p.startswith("spec.routes[3].dev: eth9 is not a managed interface") for p in problems
    )
    assert any(
        p.startswith("spec.routes[4]: conflicts with spec.management.gateway") for p in problems
    )


def test_route_identical_to_management_gateway_is_accepted() -> None:
    document = base_document()
    document["spec"]["routes"].append({"to": "default", "via": "198.51.100.1"})
    assert parse_document(document).spec.routes[-1].to == "0.0.0.0/0"


def test_yaml_json_and_unreadable_files(tmp_path: Path) -> None:
    as_json = tmp_path / "d.json"
    as_json.write_text(json.dumps(base_document()))
    assert load_document(as_json).metadata.device == "edge-01"
    broken = tmp_path / "d.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(DocumentError) as caught:
        load_document(broken)
    assert str(broken) in str(caught.value) and "not valid YAML or JSON" in str(caught.value)
    with pytest.raises(DocumentError) as missing:
        load_document(tmp_path / "absent.yaml")
    assert "cannot read" in str(missing.value)


def test_digest_ignores_version_and_key_order() -> None:
    a = base_document()
    b = json.loads(json.dumps(base_document(), sort_keys=True))
    b["metadata"]["version"] = 7
    assert document_digest(parse_document(a)) == document_digest(parse_document(b))
    c = base_document(routes=[])
    assert document_digest(parse_document(a)) != document_digest(parse_document(c))


def test_json_schema_is_published_and_closed() -> None:
    schema = json_schema()
    assert schema["title"].startswith("trueup DeviceState")
    assert schema["additionalProperties"] is False
    assert "Management" in schema["$defs"]
    assert schema["$defs"]["Interface"]["additionalProperties"] is False


def test_api_bind_management_means_the_configured_management_address() -> None:
    document = base_document()
    document["spec"]["management"]["addresses"] = ["198.51.100.2/24", "198.51.100.3/24"]
    document["spec"]["management"]["api"] = {"port": 7443, "bind": "management"}
    assert parse_document(document).spec.api_bind_address() == "198.51.100.2"
    document["spec"]["management"]["api"] = {"port": 7443}
    assert parse_document(document).spec.api_bind_address() is None
    document["spec"]["management"]["api"] = {"port": 7443, "bind": "vip"}
    assert any(p.startswith("spec.management.api.bind") for p in _problems(document))


def _dhcp(subnet: dict[str, Any]) -> dict[str, Any]:
    return {"interfaces": ["lan0"], "subnets": [{"id": 1, "subnet": "203.0.113.0/24", **subnet}]}


def test_a_reversed_pool_does_not_hide_a_reservation_outside_its_subnet() -> None:
    document = base_document(
        dhcp=_dhcp(
            {
                "pools": ["203.0.113.200-203.0.113.100"],
                "reservations": [{"hw-address": "02:00:00:00:00:aa", "ip-address": "192.0.2.9"}],
            }
        )
    )
    problems = _problems(document)
    assert any(p.startswith("spec.dhcp.subnets[0].pools[0]: ") for p in problems), problems
    assert (
        "spec.dhcp.subnets[0].reservations[0].ip-address: 192.0.2.9 is not inside 203.0.113.0/24"
        in problems
    ), problems


def test_cross_field_checks_run_beside_a_field_that_failed() -> None:
    document = base_document()
    spec = document["spec"]
    spec["interfaces"][0]["addresses"].append("not-a-prefix")
    spec["routes"] += [
        {"to": "192.0.2.0/24", "via": "203.0.113.254"},  # the same route again
        {"to": "198.51.100.0/24", "via": "203.0.113.254", "table": "nowhere"},
    ]
    spec["tables"]["main2"] = 254
    problems = _problems(document)
    assert any(p.startswith("spec.interfaces[0].addresses[2]: ") for p in problems), problems
    assert any(p.startswith("spec.routes[2]: duplicate route to 192.0.2.0/24") for p in problems)
    assert any(p.startswith("spec.routes[3].table: unknown table 'nowhere'") for p in problems)
    assert "spec.tables.main2: 254 is the main table; use table: main" in problems


def test_a_reservation_reports_its_address_and_its_identifier_together() -> None:
    document = base_document(
        dhcp=_dhcp({"reservations": [{"ip-address": "203.0.113.300", "hostname": "printer"}]})
    )
    problems = _problems(document)
    assert (
        "spec.dhcp.subnets[0].reservations[0].ip-address: '203.0.113.300' is not an IPv4/IPv6 "
        "address" in problems
    ), problems
    assert (
        "spec.dhcp.subnets[0].reservations[0]: a reservation needs exactly one of hw-address or "
        "duid" in problems
    ), problems


def test_a_long_message_is_never_cut() -> None:
    document = base_document(
        ha={
            "role": "primary",
            "vips": [{"interface": "lan0", "vrid": 7, "addresses": ["203.0.113.9/24"]}],
        }
    )
    document["spec"]["management"]["api"] = {"bind": "203.0.113.9"}
    problems = _problems(document)
    assert (
        "spec.management.api.bind: 203.0.113.9 is an HA virtual address "
        "(spec.ha.vips[0].addresses[0]); the API never binds a virtual address (bind the "
        "management address, 'management', or leave it out for the wildcard)"
    ) in problems, problems
    assert not any("more characters" in p for p in problems)


def test_only_quoted_input_is_cut_and_says_so() -> None:
    document = base_document()
    document["spec"]["routes"][0]["table"] = "t" * 5000
    problems = _problems(document)
    (problem,) = [p for p in problems if p.startswith("spec.routes[0].table: ")]
    assert "(input excerpt, " in problem and len(problem) < 300
    assert problem.endswith("; name it in tables"), problem
