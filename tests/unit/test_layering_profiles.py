"""Profiles and their typed variables: what `parse_profile` accepts and refuses, with paths."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.layering_examples import profile
from trueup.model.layering import (
    ProfileError,
    Variable,
    load_profile_text,
    parse_profile,
    variables_digest,
)
from trueup.model.layering.variables import parse_variable
from trueup.model.limits import DOCUMENT_BYTES


def _profile_data(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "Profile",
        "metadata": {"name": "edge-ams", "priority": 200, "description": "edge in Amsterdam"},
        "spec": {"selector": "site=ams,role in (edge)", **spec},
    }


def _refused(data: Any) -> list[str]:
    with pytest.raises(ProfileError) as error:
        parse_profile(data, source="profiles/edge-ams.yaml")
    assert str(error.value).startswith("profiles/edge-ams.yaml: invalid profile")
    return error.value.problems


def test_a_profile_parses_and_reads_back_equal() -> None:
    data = _profile_data(
        variables={"mtu": {"type": "integer", "minimum": 1280, "default": 1500}},
        document={"interfaces": [{"name": "lan0", "mtu": "${mtu}"}]},
    )
    parsed = parse_profile(data)
    assert (parsed.name, parsed.priority, parsed.version) == ("edge-ams", 200, 0)
    assert parsed.selector.matches({"site": "ams", "role": "edge"})
    assert not parsed.selector.matches({"site": "ams", "role": "core"})
    assert parsed.variables["mtu"] == Variable("mtu", "integer", default=1500, minimum=1280)
    again = parse_profile(parsed.as_json())
    assert again.as_json() == parsed.as_json()
    assert again.digest == parsed.digest
    assert parsed.with_version(4).version == 4
    assert parsed.with_version(4).digest == parsed.digest
    shown = parsed.as_json()
    shown["spec"]["document"]["interfaces"][0]["mtu"] = 1  # a copy: the profile is unchanged
    assert parsed.document["interfaces"][0]["mtu"] == "${mtu}"
    changed = parse_profile({**data, "metadata": {**data["metadata"], "priority": 201}})
    assert changed.digest != parsed.digest


def test_defaults_of_a_profile() -> None:
    parsed = parse_profile(
        {"apiVersion": "trueup/v1", "kind": "Profile", "metadata": {"name": "all"}, "spec": {}}
    )
    assert (parsed.priority, parsed.selector.text, dict(parsed.document)) == (100, "", {})
    assert parsed.selector.matches({"anything": "at-all"})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"apiVersion": "v2"}, "apiVersion: expected trueup/v1"),
        ({"kind": "DeviceState"}, "kind: expected Profile"),
        ({"metadata": {"name": "Edge_AMS"}}, "metadata.name: expected a DNS label"),
        ({"metadata": {"name": "x", "priority": "high"}}, "metadata.priority: expected an integer"),
        ({"metadata": {"name": "x", "owner": "me"}}, "metadata.owner: unknown field"),
        ({"status": {}}, "status: unknown field"),
    ],
)
def test_bad_fields_are_refused_with_their_path(change: dict[str, Any], problem: str) -> None:
    problems = _refused({**_profile_data(), **change})
    assert any(p.startswith(problem) for p in problems), problems


def test_a_bad_selector_is_refused_with_its_position() -> None:
    (problem,) = _refused({**_profile_data(), "spec": {"selector": "site in (ams"}})
    assert problem.startswith("spec.selector: selector 'site in (ams': at position 13: expected")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"vpn": {}}, "spec.document.vpn: not a section of a device's spec"),
        ({"sysctl": {"${k}": 1}}, "spec.document.sysctl.${k}: a variable cannot name a key"),
        ({"interfaces": [{"name": "${k"}]}, "spec.document.interfaces[0].name: unclosed ${"),
        ({"dns": {"zone": "${9x}"}}, "spec.document.dns.zone: '${9x}' does not name a variable"),
        (
            {"dns": {"zone": "${undeclared}"}},
            "spec.document.dns.zone: unknown variable ${undeclared}; declare it",
        ),
        ({"dns": {"zone": "x", "$delete": True}}, "spec.document.dns.$delete: $delete belongs"),
        (
            {"interfaces": [{"name": "lan0", "$delete": "yes"}]},
            "spec.document.interfaces[0].$delete: expected $delete: true",
        ),
        ({"dns": {"$merge": True}}, "spec.document.dns.$merge: unknown marker"),
        ({"routes": {"$replace": "all"}}, "spec.document.routes.$replace: expected the list"),
    ],
)
def test_bad_documents_are_refused_with_their_path(document: dict[str, Any], problem: str) -> None:
    problems = _refused(_profile_data(document=document, variables={"k": {"type": "string"}}))
    assert any(p.startswith(problem) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = _refused(
        {
            **_profile_data(
                variables={"mtu": {"type": "integr"}},
                document={"vpn": {}, "dns": {"zone": "${nope}"}},
            ),
            "kind": "Thing",
        }
    )
    assert len(problems) == 4, problems


# --- variable declarations -------------------------------------------------------------


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ({"type": "float"}, ".type: expected one of string, integer"),
        ({"type": "list"}, ".items: a list needs items"),
        ({"type": "list", "items": "list"}, ".items: a list needs items"),
        ({"type": "string", "items": "string"}, ".items: only a list has items"),
        ({"type": "integer", "pattern": "x"}, ".pattern: only a string"),
        ({"type": "string", "pattern": "(["}, ".pattern: not a regular expression"),
        ({"type": "string", "pattern": "(a+)+b"}, ".pattern: a repeated group that itself repeats"),
        ({"type": "string", "pattern": "([a-z0-9]+-)*[a-z0-9]+"}, ".pattern: a repeated group"),
        ({"type": "string", "pattern": "(x|(y*))*"}, ".pattern: a repeated group"),
        ({"type": "string", "minimum": 1}, ".minimum: only an integer"),
        ({"type": "integer", "minimum": 10, "maximum": 5}, ".minimum: 10 is above the maximum 5"),
        ({"type": "integer", "required": True, "default": 1}, ".default: a required variable"),
        ({"type": "ipv4", "default": "2001:db8::1"}, ".default: '2001:db8::1' is not an IPv4"),
        ({"type": "integer", "default": 99, "maximum": 10}, ".default: 99 is above the maximum"),
        ({"type": "string", "secret": True}, ".secret: unknown field"),
        ("integer", ": expected a mapping with at least a type"),
    ],
)
def test_bad_declarations_are_refused_naming_the_variable(declaration: Any, problem: str) -> None:
    problems = _refused(_profile_data(variables={"mtu": declaration}))
    assert any(p.startswith("spec.variables.mtu" + problem) for p in problems), problems


def test_a_variable_with_a_bad_declaration_is_not_also_called_unknown_where_it_is_used() -> None:
    problems = _refused(
        _profile_data(
            variables={"mtu": {"type": "integer", "minimum": 1280, "default": 100}},
            document={"interfaces": [{"name": "lan0", "mtu": "${mtu}"}]},
        )
    )
    assert problems == ["spec.variables.mtu.default: 100 is below the minimum 1280"], problems


def test_a_bad_variable_name_is_refused() -> None:
    problems = _refused(_profile_data(variables={"lan-mtu": {"type": "integer"}}))
    assert problems[0].startswith("spec.variables.lan-mtu: not a variable name")


_ACCEPTED: list[tuple[dict[str, Any], Any, Any]] = [
    ({"type": "string"}, "ams", "ams"),
    ({"type": "string", "pattern": "[a-z]{3}"}, "ams", "ams"),
    ({"type": "string", "pattern": "((?>[a-z0-9]+)-)*[a-z0-9]+"}, "edge-01-ams", "edge-01-ams"),
    ({"type": "string", "pattern": "([a-z]{1,8}\\.){0,3}[a-z]+"}, "a.b.c", "a.b.c"),
    ({"type": "integer", "minimum": 1280, "maximum": 9000}, 1280, 1280),
    ({"type": "integer"}, -3, -3),
    ({"type": "boolean"}, False, False),
    ({"type": "ipv4"}, "192.0.2.1", "192.0.2.1"),
    ({"type": "ipv6"}, "2001:DB8::1", "2001:db8::1"),
    ({"type": "ip"}, "2001:db8:0::1", "2001:db8::1"),
    ({"type": "ip"}, "198.51.100.9", "198.51.100.9"),
    ({"type": "prefix"}, "203.0.113.7/24", "203.0.113.7/24"),
    ({"type": "ipv4-prefix"}, "192.0.2.1/32", "192.0.2.1/32"),
    ({"type": "ipv6-prefix"}, "2001:DB8::1/64", "2001:db8::1/64"),
    ({"type": "list", "items": "ipv4"}, ["192.0.2.1", "192.0.2.2"], ["192.0.2.1", "192.0.2.2"]),
    ({"type": "list", "items": "integer", "maximum": 10}, [], []),
]

_REFUSED: list[tuple[dict[str, Any], Any, str]] = [
    ({"type": "string"}, 5, "expected a string, got a number (5)"),
    ({"type": "string", "pattern": "[a-z]{3}"}, "amsx", "does not match the pattern [a-z]{3}"),
    ({"type": "integer"}, "1500", "expected an integer, got the string '1500'"),
    ({"type": "integer"}, True, "expected an integer, got a boolean"),
    ({"type": "integer"}, 1.5, "expected an integer, got a number (1.5)"),
    ({"type": "integer", "minimum": 1280}, 1279, "1279 is below the minimum 1280"),
    ({"type": "integer", "maximum": 9000}, 9001, "9001 is above the maximum 9000"),
    ({"type": "boolean"}, "yes", "expected true or false"),
    ({"type": "ipv4"}, "2001:db8::1", "is not an IPv4 address"),
    ({"type": "ipv6"}, "192.0.2.1", "is not an IPv6 address"),
    ({"type": "ip"}, "192.0.2.300", "is not an IPv4/IPv6 address"),
    ({"type": "ip"}, "192.0.2.1/24", "is not an IPv4/IPv6 address"),
    ({"type": "prefix"}, "192.0.2.1", "expected an IPv4/IPv6 prefix ADDRESS/LENGTH"),
    ({"type": "ipv4-prefix"}, "2001:db8::1/64", "is not an IPv4 prefix"),
    ({"type": "ipv6-prefix"}, "192.0.2.1/24", "is not an IPv6 prefix"),
    ({"type": "prefix"}, "192.0.2.1/33", "is not an IPv4/IPv6 prefix"),
    ({"type": "list", "items": "ipv4"}, "192.0.2.1", "expected a list of ipv4"),
    ({"type": "list", "items": "ipv4"}, ["192.0.2.1", "x"], "[1]: 'x' is not an IPv4 address"),
    ({"type": "list", "items": "integer", "maximum": 10}, [11], "[0]: 11 is above the maximum"),
    ({"type": "string"}, None, "expected a string, got null"),
]


def _variable(declaration: dict[str, Any]) -> Variable:
    variable, problems = parse_variable("v", declaration)
    assert variable is not None, problems
    return variable


@pytest.mark.parametrize(("declaration", "value", "canonical"), _ACCEPTED)
def test_each_type_accepts_its_values_in_canonical_form(
    declaration: dict[str, Any], value: Any, canonical: Any
) -> None:
    assert _variable(declaration).check(value) == canonical


@pytest.mark.parametrize(("declaration", "value", "message"), _REFUSED)
def test_each_type_refuses_other_values_saying_what_it_expects(
    declaration: dict[str, Any], value: Any, message: str
) -> None:
    with pytest.raises(ValueError) as error:
        _variable(declaration).check(value)
    assert message in str(error.value)


def test_values_given_as_text_are_converted_then_checked() -> None:
    assert _variable({"type": "integer"}).from_text("9000") == 9000
    assert _variable({"type": "boolean"}).from_text("True") is True
    assert _variable({"type": "list", "items": "ip"}).from_text("192.0.2.1, 2001:DB8::2") == [
        "192.0.2.1",
        "2001:db8::2",
    ]
    assert _variable({"type": "list", "items": "ip"}).from_text("") == []
    with pytest.raises(ValueError, match="expected an integer"):
        _variable({"type": "integer"}).from_text("nine")


def test_the_variables_digest_ignores_key_order() -> None:
    one = variables_digest({"a": 1, "b": ["192.0.2.1"]})
    assert one == variables_digest({"b": ["192.0.2.1"], "a": 1})
    assert one != variables_digest({"a": 2, "b": ["192.0.2.1"]})
    assert one.startswith("sha256:")


def test_a_default_is_kept_canonical_and_shown_back() -> None:
    parsed = profile("p", {}, variables={"gw": {"type": "ipv6", "default": "2001:DB8::1"}})
    assert parsed.variables["gw"].default == "2001:db8::1"
    assert parsed.as_json()["spec"]["variables"]["gw"] == {"type": "ipv6", "default": "2001:db8::1"}


def test_a_profile_is_read_from_yaml_or_json_text_within_the_limits() -> None:
    text = """
apiVersion: trueup/v1
kind: Profile
metadata: {name: all}
spec:
  variables: {mtu: {type: integer, default: 1500}}
  document: {interfaces: [{name: lan0, mtu: "${mtu}"}]}
"""
    parsed = load_profile_text(text, source="all.yaml")
    assert parsed.variables["mtu"].default == 1500
    assert load_profile_text(json.dumps(parsed.as_json())).digest == parsed.digest
    with pytest.raises(ProfileError) as error:
        load_profile_text("a: &x [1]\nb: *x\n", source="alias.yaml")
    assert error.value.problems[0].startswith("(document): ")
    with pytest.raises(ProfileError, match="larger than"):
        load_profile_text("#" * (DOCUMENT_BYTES + 1))
