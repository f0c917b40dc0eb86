"""Rendering a device from profiles: merge rules per section, variables, errors, determinism."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.layering_examples import OTHER_KEY, PUBLIC_KEY, full_document, full_spec, profile
from trueup.model.document import document_digest, parse_document
from trueup.model.layering import (
    LIST_KEYS,
    DeviceInputs,
    Profile,
    Renderer,
    RenderError,
    parse_selector,
    render_device,
)
from trueup.model.layering.variables import Variable
from trueup.model.limits import DOCUMENT_BYTES

REPO = Path(__file__).resolve().parents[2]


def _own(spec: dict[str, Any], **labels: str) -> DeviceInputs:
    return DeviceInputs(name="edge-01", labels=labels, own=spec)


def _render_over_full(own: dict[str, Any]) -> dict[str, Any]:
    """The full spec as a profile, `own` as the device's layer; the rendered spec."""
    base = profile("base", full_spec())
    return render_device([base], _own(own)).document["spec"]


def _problems(error: pytest.ExceptionInfo[RenderError]) -> list[tuple[str, str | None, str | None]]:
    return [(p.path, p.profile, p.variable) for p in error.value.problems]


# --- compatibility ---------------------------------------------------------------------


def test_a_device_with_only_its_own_document_renders_to_exactly_that_document() -> None:
    document = full_document()
    expected = parse_document(copy.deepcopy(document))
    for own in (document["spec"], document):
        rendered = render_device([], _own(copy.deepcopy(own)))
        assert rendered.document == expected.canonical()
        assert rendered.digest == document_digest(expected)
        assert rendered.provenance.profiles == ()
        assert rendered.provenance.own_digest is not None


def test_a_whole_document_for_another_device_is_refused() -> None:
    with pytest.raises(RenderError) as error:
        render_device([], _own(full_document("edge-99")))
    assert _problems(error) == [("own.metadata.device", None, None)]
    assert "edge-99" in str(error.value)


@pytest.mark.parametrize("metadata", ["edge-01", ["edge-01"], 5])
def test_a_whole_document_whose_metadata_is_not_a_mapping_is_refused(metadata: Any) -> None:
    document = full_document()
    document["metadata"] = metadata
    with pytest.raises(RenderError) as error:
        render_device([], _own(document))
    assert _problems(error) == [("own.metadata", None, None)]
    assert "expected a mapping" in str(error.value)


def test_the_rendered_document_is_named_for_the_device() -> None:
    rendered = render_device([profile("base", full_spec())], DeviceInputs(name="edge-07"))
    assert rendered.document["metadata"] == {"device": "edge-07"}
    assert rendered.device == "edge-07"


# --- merge rules, section by section ---------------------------------------------------


def _by(items: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {item[key]: item for item in items}


def test_interfaces_merge_by_name_and_their_addresses_by_value() -> None:
    spec = _render_over_full(
        {"interfaces": [{"name": "lan0", "mtu": 9000, "addresses": ["203.0.113.5/24"]}]}
    )
    assert [i["name"] for i in spec["interfaces"]] == ["lan0", "lan1"]
    lan0 = _by(spec["interfaces"], "name")["lan0"]
    assert lan0["mtu"] == 9000
    assert lan0["addresses"] == ["203.0.113.1/24", "203.0.113.5/24"]
    assert _by(spec["interfaces"], "name")["lan1"]["addresses"] == [
        "192.0.2.1/25",
        "2001:db8:1::1/64",
    ]


def test_an_address_written_differently_is_the_same_address() -> None:
    spec = _render_over_full({"interfaces": [{"name": "lan1", "addresses": ["2001:DB8:1::1/64"]}]})
    assert _by(spec["interfaces"], "name")["lan1"]["addresses"] == [
        "192.0.2.1/25",
        "2001:db8:1::1/64",
    ]


def test_a_keyed_item_is_deleted_and_a_list_replaced_with_markers() -> None:
    spec = _render_over_full(
        {
            "interfaces": [
                {"name": "lan1", "$delete": True},
                {"name": "lan0", "addresses": {"$replace": ["203.0.113.9/24"]}},
                {"name": "eth9", "$delete": True},  # not there: nothing to delete
            ],
            "routes": [{"to": "192.0.2.128/25", "table": "isp", "$delete": True}],
            "dhcp": {"subnets": {"$replace": [{"subnet": "203.0.113.0/24"}]}},
        }
    )
    assert [i["name"] for i in spec["interfaces"]] == ["lan0"]
    assert spec["interfaces"][0]["addresses"] == ["203.0.113.9/24"]
    assert [r["to"] for r in spec["routes"]] == ["203.0.113.128/25"]
    assert spec["dhcp"]["subnets"][0]["pools"] == []


def test_routes_merge_by_destination_table_and_metric() -> None:
    spec = _render_over_full(
        {
            "routes": [
                {"to": "203.0.113.128/25", "via": "203.0.113.3"},  # table main, metric 0
                {"to": "203.0.113.128/25", "via": "203.0.113.4", "metric": 100},  # a backup
                {"to": "192.0.2.128/25", "table": "isp", "metric": 0, "dev": "lan0"},
            ]
        }
    )
    routes = [
        (r["to"], r.get("via"), r.get("dev"), r["table"], r["metric"]) for r in spec["routes"]
    ]
    assert routes == [
        ("203.0.113.128/25", "203.0.113.3", None, "main", 0),
        ("192.0.2.128/25", None, "lan0", "isp", 0),
        ("203.0.113.128/25", "203.0.113.4", None, "main", 100),
    ]
    assert LIST_KEYS["routes"] == ("to", "table", "metric")


def test_firewall_chains_and_sets_merge_by_name_and_rules_are_replaced_whole() -> None:
    spec = _render_over_full(
        {
            "firewall": {
                "chains": [
                    {"name": "web", "rules": ["tcp dport 8443 accept"]},
                    {"name": "extra", "rules": ["counter"]},
                ],
                "sets": [{"name": "ops", "elements": ["198.51.100.8"]}],
            }
        }
    )
    chains = _by(spec["firewall"]["chains"], "name")
    assert list(chains) == ["input", "web", "extra"]
    assert chains["web"]["rules"] == ["tcp dport 8443 accept"]
    assert chains["input"]["policy"] == "drop"
    assert chains["input"]["rules"] == ["ct state established,related accept", "jump web"]
    ops = spec["firewall"]["sets"][0]
    assert ops["elements"] == ["198.51.100.8"] and ops["type"] == "ipv4_addr"


def test_dhcp_subnets_merge_by_prefix_and_reservations_by_address() -> None:
    spec = _render_over_full(
        {
            "dhcp": {
                "subnets": [
                    {
                        "subnet": "203.0.113.0/24",
                        "reservations": [
                            # the stored spelling of the profile's `ip-address`: the same field
                            {"ip_address": "203.0.113.20", "hw_address": "02:00:00:00:00:bb"},
                            {"ip-address": "203.0.113.21", "hw-address": "02:00:00:00:00:cc"},
                        ],
                    }
                ],
                "ha": {"peers": [{"name": "edge-02", "url": "http://192.0.2.9:8000/"}]},
            }
        }
    )
    subnet = spec["dhcp"]["subnets"][0]
    assert subnet["pools"] == ["203.0.113.100-203.0.113.150"]
    assert [(r["ip_address"], r["hw_address"]) for r in subnet["reservations"]] == [
        ("203.0.113.20", "02:00:00:00:00:bb"),
        ("203.0.113.21", "02:00:00:00:00:cc"),
    ]
    peers = _by(spec["dhcp"]["ha"]["peers"], "name")
    assert peers["edge-02"] == {
        "name": "edge-02",
        "url": "http://192.0.2.9:8000/",
        "role": "standby",
        "auto_failover": True,
    }


def test_dns_records_merge_by_name_type_and_value_and_listen_is_replaced() -> None:
    spec = _render_over_full(
        {
            "dns": {
                "listen": ["203.0.113.1@5353"],
                "records": [
                    {"name": "www", "type": "CNAME", "value": "router", "ttl": 120},
                    {"name": "router", "type": "A", "value": "203.0.113.2"},
                ],
            }
        }
    )
    records = [(r["name"], r["type"], r["value"], r.get("ttl")) for r in spec["dns"]["records"]]
    assert records == [
        ("router", "A", "203.0.113.1", None),
        ("www", "CNAME", "router", 120),
        ("router", "A", "203.0.113.2", None),
    ]
    assert spec["dns"]["listen"] == ["203.0.113.1@5353"]
    assert spec["dns"]["zone"] == "lan.test."


def test_ha_vips_merge_by_interface_and_vrid() -> None:
    spec = _render_over_full(
        {
            "ha": {
                "priority": 150,
                "vips": [
                    {"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.253/24"]},
                    {"interface": "lan1", "vrid": 52, "addresses": ["192.0.2.126/25"]},
                ],
            }
        }
    )
    assert (spec["ha"]["role"], spec["ha"]["priority"]) == ("primary", 150)
    assert [(v["interface"], v["vrid"], v["addresses"]) for v in spec["ha"]["vips"]] == [
        ("lan0", 51, ["203.0.113.253/24"]),
        ("lan1", 52, ["192.0.2.126/25"]),
    ]


def test_proxies_merge_by_name_and_their_servers_by_name() -> None:
    spec = _render_over_full(
        {
            "proxies": [
                {
                    "name": "web",
                    "backend": {"servers": [{"name": "app2", "address": "192.0.2.11:8080"}]},
                }
            ]
        }
    )
    (web,) = spec["proxies"]
    assert web["bind"] == "203.0.113.1:80"
    assert [s["name"] for s in web["backend"]["servers"]] == ["app1", "app2"]


def test_wireguard_interfaces_merge_by_name_and_peers_by_public_key() -> None:
    spec = _render_over_full(
        {
            "wireguard": {
                "interfaces": [
                    {
                        "name": "wg0",
                        "peers": [
                            {"public_key": PUBLIC_KEY, "persistent_keepalive": 25},
                            {"public_key": OTHER_KEY, "allowed_ips": ["198.51.100.64/26"]},
                        ],
                    }
                ]
            }
        }
    )
    peers = spec["wireguard"]["interfaces"][0]["peers"]
    assert [(p["public_key"], p["persistent_keepalive"], p["allowed_ips"]) for p in peers] == [
        (PUBLIC_KEY, 25, ["198.51.100.128/25"]),
        (OTHER_KEY, 0, ["198.51.100.64/26"]),
    ]


def test_mappings_merge_key_by_key_and_null_removes_a_key() -> None:
    spec = _render_over_full(
        {
            "management": {"gateway": None, "addresses": ["198.51.100.3/24"]},
            "sysctl": {"net.ipv6.conf.all.forwarding": 1, "net.ipv4.ip_forward": None},
            "convergence": {"subsystems": {"ha": "notify"}},
            "interfaces": [{"name": "lan0", "mtu": None}],
        }
    )
    assert spec["management"] == {
        "interface": "mgmt0",
        "addresses": ["198.51.100.3/24"],  # a list without a key: replaced whole
        "api": {"port": 7443},
    }
    assert spec["sysctl"] == {"net.ipv6.conf.all.forwarding": "1"}
    assert spec["convergence"]["subsystems"] == {"dhcp": "notify", "ha": "notify"}
    assert "mtu" not in _by(spec["interfaces"], "name")["lan0"]


def test_a_layer_repeating_a_key_is_refused_not_folded() -> None:
    with pytest.raises(RenderError) as error:
        _render_over_full({"interfaces": [{"name": "lan9"}, {"name": "lan9", "mtu": 9000}]})
    assert ("spec.interfaces[3].name", None, None) in _problems(error)
    assert "duplicate interface name lan9" in str(error.value)


def test_a_layer_repeating_a_key_an_earlier_layer_has_is_refused_not_folded() -> None:
    # lan0 is in the profile: two lan0 items in the own layer must not fold into it silently.
    with pytest.raises(RenderError) as error:
        _render_over_full(
            {"interfaces": [{"name": "lan0", "mtu": 1400}, {"name": "lan0", "mtu": 9000}]}
        )
    assert "duplicate interface name lan0" in str(error.value)
    routes = [
        {"to": "203.0.113.128/25", "via": "203.0.113.3"},
        {"to": "203.0.113.128/25", "via": "203.0.113.4"},
    ]
    with pytest.raises(RenderError) as error:
        _render_over_full({"routes": routes})
    assert "203.0.113.128/25" in str(error.value)
    base = profile("base", full_spec(), priority=10)
    variables = {"a": {"type": "string"}, "b": {"type": "string"}}
    twice = profile(
        "twice",
        {"interfaces": [{"name": "${a}", "mtu": 1400}, {"name": "${b}", "mtu": 9000}]},
        variables=variables,
    )
    with pytest.raises(RenderError) as error:
        render_device(
            [base, twice], DeviceInputs(name="edge-01", variables={"a": "lan1", "b": "lan1"})
        )
    assert "duplicate interface name lan1" in str(error.value)
    assert any(p.profile == "twice" for p in error.value.problems)


def test_a_duplicate_key_that_a_variable_wrote_names_that_variable() -> None:
    base = profile("base", full_spec(), priority=10)
    variables = {"a": {"type": "string"}, "b": {"type": "string"}}
    twice = profile(
        "twice",
        {"interfaces": [{"name": "${a}", "mtu": 1400}, {"name": "${b}", "mtu": 9000}]},
        variables=variables,
    )
    with pytest.raises(RenderError) as error:
        render_device(
            [base, twice], DeviceInputs(name="edge-01", variables={"a": "lan7", "b": "lan7"})
        )
    assert _problems(error) == [("spec.interfaces[3].name", "twice", "b")]


# --- order, selection, provenance ------------------------------------------------------


def _mtu_profile(name: str, mtu: int, priority: int, selector: str = "") -> Profile:
    return profile(
        name,
        {"interfaces": [{"name": "lan0", "mtu": mtu}]},
        priority=priority,
        selector=selector,
        version=priority,
    )


def test_profiles_apply_by_priority_then_name_and_the_device_last() -> None:
    base = profile("base", full_spec(), priority=0, version=3)
    profiles = [
        _mtu_profile("zeta", 1400, 50),
        _mtu_profile("alpha", 1450, 50),
        _mtu_profile("late", 1300, 900),
        base,
    ]
    rendered = render_device(profiles, DeviceInputs(name="edge-01"))
    assert _by(rendered.document["spec"]["interfaces"], "name")["lan0"]["mtu"] == 1300
    assert rendered.provenance.profiles == (("base", 3), ("alpha", 50), ("zeta", 50), ("late", 900))
    assert rendered.provenance.own_digest is None
    own = render_device(profiles, _own({"interfaces": [{"name": "lan0", "mtu": 1280}]}))
    assert _by(own.document["spec"]["interfaces"], "name")["lan0"]["mtu"] == 1280
    without_late = render_device([*profiles[:2], base], DeviceInputs(name="edge-01"))
    assert _by(without_late.document["spec"]["interfaces"], "name")["lan0"]["mtu"] == 1400


def test_only_profiles_whose_selector_matches_apply() -> None:
    profiles = [
        profile("base", full_spec(), priority=0),
        _mtu_profile("ams", 9000, 10, "site=ams"),
        _mtu_profile("lab", 1400, 20, "site=ams,!lab"),
    ]
    renderer = Renderer(profiles)
    ams = renderer.render(_own({}, site="ams"))
    assert [n for n, _ in ams.provenance.profiles] == ["base", "ams", "lab"]
    lab = renderer.render(_own({}, site="ams", lab="yes"))
    assert [n for n, _ in lab.provenance.profiles] == ["base", "ams"]
    assert _by(lab.document["spec"]["interfaces"], "name")["lan0"]["mtu"] == 9000
    other = renderer.render(_own({}, site="fra"))
    assert [n for n, _ in other.provenance.profiles] == ["base"]
    assert len({ams.digest, lab.digest, other.digest}) == 3


def test_two_profiles_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two profiles named base"):
        Renderer([profile("base", {}), profile("base", {})])


# --- variables -------------------------------------------------------------------------

_VARS = {
    "lan_address": {"type": "ipv4-prefix", "required": True},
    "lan_mtu": {"type": "integer", "minimum": 1280, "maximum": 9000, "default": 1500},
    "site": {"type": "string", "pattern": "[a-z]{3}"},
    "resolvers": {"type": "list", "items": "ip", "default": ["203.0.113.53"]},
}


def _site_profile() -> Profile:
    document = {
        "interfaces": [
            {"name": "lan0", "mtu": "${lan_mtu}", "addresses": ["${lan_address}"]},
        ],
        "dns": {"zone": "${site}.example.test", "listen": "${resolvers}"},
    }
    return profile("site", document, priority=200, variables=_VARS, version=7)


def _device(**variables: Any) -> DeviceInputs:
    return DeviceInputs(name="edge-01", variables=variables)


def _site_renderer() -> Renderer:
    return Renderer([profile("base", full_spec(), priority=0), _site_profile()])


def test_variables_substitute_typed_values_and_interpolate_text() -> None:
    rendered = _site_renderer().render(
        _device(lan_address="203.0.113.7/24", site="ams", resolvers=["203.0.113.1", "192.0.2.1"])
    )
    spec = rendered.document["spec"]
    lan0 = _by(spec["interfaces"], "name")["lan0"]
    assert lan0["mtu"] == 1500  # the default, an integer
    assert lan0["addresses"] == ["203.0.113.1/24", "203.0.113.7/24"]
    assert spec["dns"]["zone"] == "ams.example.test."
    assert spec["dns"]["listen"] == ["203.0.113.1@53", "192.0.2.1@53"]
    assert rendered.provenance.profiles == (("base", 1), ("site", 7))


def test_a_bad_variable_value_names_the_variable_and_the_profile() -> None:
    with pytest.raises(RenderError) as error:
        _site_renderer().render(_device(lan_address="203.0.113.7/24", site="ams", lan_mtu=70))
    assert _problems(error) == [("variables.lan_mtu", "site", "lan_mtu")]
    assert "below the minimum 1280" in str(error.value)


def test_a_required_variable_missing_is_refused() -> None:
    with pytest.raises(RenderError) as error:
        _site_renderer().render(_device(site="ams"))
    assert _problems(error) == [("variables.lan_address", "site", "lan_address")]
    assert "required" in str(error.value)


def test_a_variable_without_value_or_default_names_the_path_that_uses_it() -> None:
    with pytest.raises(RenderError) as error:
        _site_renderer().render(_device(lan_address="203.0.113.7/24"))
    assert _problems(error) == [("spec.document.dns.zone", "site", "site")]
    assert "no value" in str(error.value)


def test_a_device_variable_no_selected_profile_declares_is_refused() -> None:
    with pytest.raises(RenderError) as error:
        _site_renderer().render(_device(lan_address="203.0.113.7/24", site="ams", color="blue"))
    assert _problems(error) == [("variables.color", None, "color")]
    assert "selected: base, site" in str(error.value)


def test_an_unknown_variable_in_a_profile_built_without_parsing_is_refused_at_render() -> None:
    parsed = profile("ghost", {"interfaces": [{"name": "lan0", "mtu": 1500}]})
    ghost = Profile(
        name=parsed.name,
        priority=parsed.priority,
        description="",
        selector=parse_selector(""),
        variables={},
        document={"interfaces": [{"name": "lan0", "mtu": "${nope}"}]},
    )
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), ghost], _device())
    assert _problems(error) == [("spec.document.interfaces[0].mtu", "ghost", "nope")]
    assert "unknown variable ${nope}" in str(error.value)


def test_a_value_the_document_refuses_names_the_profile_and_variable_that_set_it() -> None:
    variables = {"lan_mtu": {"type": "integer"}}
    mtu = profile(
        "mtu",
        {"interfaces": [{"name": "lan1", "mtu": "${lan_mtu}"}]},
        variables=variables,
        priority=300,
    )
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), mtu], _device(lan_mtu=20))
    assert _problems(error) == [("spec.interfaces[1].mtu", "mtu", "lan_mtu")]
    assert "greater than or equal to 68" in str(error.value)


def test_a_value_the_document_refuses_names_the_profile_or_the_own_layer() -> None:
    base = profile("base", full_spec(), priority=0)
    broken = profile("broken", {"routes": [{"to": "203.0.113.128/25", "via": "2001:db8::1"}]})
    with pytest.raises(RenderError) as error:
        render_device([base, broken], _device())
    assert _problems(error) == [("spec.routes[0].via", "broken", None)]
    with pytest.raises(RenderError) as error:
        render_device([base], _own({"dhcp": {"interfaces": ["lan0", "lan9x!"]}}))
    ((path, who, _),) = _problems(error)
    assert path == "spec.dhcp.interfaces[1]" and who is None
    assert "the device's own layer" in str(error.value)


def test_two_profiles_declaring_one_variable_with_two_types_are_refused() -> None:
    first = profile("first", {}, variables={"mtu": {"type": "integer"}}, priority=1)
    second = profile("second", {}, variables={"mtu": {"type": "string"}}, priority=2)
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), first, second], _device(mtu=1))
    assert _problems(error) == [("spec.variables.mtu", "second", "mtu")]
    assert "by profile first" in str(error.value)


def test_a_value_must_fit_every_profile_that_declares_the_variable() -> None:
    wide = profile("wide", {}, variables={"mtu": {"type": "integer", "maximum": 9000}})
    narrow = profile("narrow", {}, variables={"mtu": {"type": "integer", "maximum": 1500}})
    base = profile("base", full_spec(), priority=0)
    render_device([base, wide, narrow], _device(mtu=1500))
    with pytest.raises(RenderError) as error:
        render_device([base, wide, narrow], _device(mtu=9000))
    assert _problems(error) == [("variables.mtu", "narrow", "mtu")]


def test_a_default_must_fit_every_profile_that_declares_the_variable() -> None:
    # narrow's lan0 may not exceed 1500; wide's default 9000 must not reach it unchecked.
    narrow = profile(
        "narrow",
        {"interfaces": [{"name": "lan0", "mtu": "${mtu}"}]},
        variables={"mtu": {"type": "integer", "maximum": 1500, "default": 1500}},
        priority=10,
    )
    wide = profile(
        "wide",
        {"interfaces": [{"name": "lan1", "mtu": "${mtu}"}]},
        variables={"mtu": {"type": "integer", "default": 9000}},
        priority=20,
    )
    base = profile("base", full_spec(), priority=0)
    with pytest.raises(RenderError) as error:
        render_device([base, narrow, wide], _device())
    assert _problems(error) == [("variables.mtu", "narrow", "mtu")]
    assert "9000 is above the maximum 1500" in str(error.value)
    assert "default of profile wide" in str(error.value)
    rendered = render_device([base, narrow, wide], _device(mtu=1400))
    assert {i["name"]: i.get("mtu") for i in rendered.document["spec"]["interfaces"]}[
        "lan1"
    ] == 1400
    alone = render_device([base, wide], _device())
    assert {i["name"]: i.get("mtu") for i in alone.document["spec"]["interfaces"]}["lan1"] == 9000


# --- a variable can never add a key ----------------------------------------------------


def test_a_key_holding_a_variable_is_refused_in_profiles_and_in_the_own_layer() -> None:
    with pytest.raises(ValueError, match=r"spec.document.sysctl.\$\{name\}: a variable cannot"):
        profile("keys", {"sysctl": {"${name}": 1}}, variables={"name": {"type": "string"}})
    with pytest.raises(RenderError) as error:
        render_device([], _own({**full_spec(), "sysctl": {"${name}": 1}}))
    assert _problems(error) == [("spec.sysctl.${name}", None, None)]


def test_a_mapping_value_is_never_substituted() -> None:
    from trueup.model.layering.substitute import SubstitutionErrors, compile_document

    compiled = compile_document({"management": "${x}"}, "spec.document")
    with pytest.raises(SubstitutionErrors) as error:
        compiled.render({"x": {"interface": "mgmt0"}})
    ((only),) = error.value.errors
    assert (only.path, only.variable) == ("spec.document.management", "x")
    assert "cannot be a mapping" in only.message
    for kind in ("string", "integer", "boolean", "ip", "prefix"):
        with pytest.raises(ValueError):
            Variable("x", kind).check({"interface": "mgmt0"})
    with pytest.raises(ValueError):
        Variable("x", "list", items="string").check([{"a": "b"}])


def test_every_value_that_cannot_be_substituted_is_reported() -> None:
    variables = {"a": {"type": "string"}, "b": {"type": "list", "items": "string", "default": []}}
    document = {"dns": {"zone": "${a}", "listen": ["x-${b}"]}, "sysctl": {"k.v": "${a}"}}
    both = profile("both", document, variables=variables)
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), both], _device())
    assert sorted(_problems(error)) == [
        ("spec.document.dns.listen[0]", "both", "b"),
        ("spec.document.dns.zone", "both", "a"),
        ("spec.document.sysctl.k.v", "both", "a"),
    ]


def test_a_list_cannot_be_interpolated_into_text() -> None:
    variables = {"names": {"type": "list", "items": "string", "default": ["a"]}}
    texts = profile("texts", {"dns": {"zone": "x-${names}"}}, variables=variables)
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), texts], _device())
    assert _problems(error) == [("spec.document.dns.zone", "texts", "names")]


def test_a_value_holding_dollar_brace_is_not_substituted_again() -> None:
    variables = {"text": {"type": "string"}, "other": {"type": "string", "default": "x"}}
    record = {"name": "t", "type": "TXT", "value": "v=${text}"}
    texts = profile("texts", {"dns": {"records": [record]}}, variables=variables)
    base = profile("base", full_spec(), priority=0)
    rendered = render_device([base, texts], _device(text="${other}"))
    values = [r["value"] for r in rendered.document["spec"]["dns"]["records"]]
    assert values == ["203.0.113.1", "router", "v=${other}"]


def test_a_list_variable_is_a_whole_list_never_an_item() -> None:
    variables = {"resolvers": {"type": "list", "items": "ip", "default": ["203.0.113.53"]}}
    nested = profile("nested", {"dns": {"listen": ["${resolvers}"]}}, variables=variables)
    with pytest.raises(RenderError) as error:
        render_device([profile("base", full_spec(), priority=0), nested], _device())
    assert _problems(error) == [("spec.document.dns.listen[0]", "nested", "resolvers")]
    assert 'write the list as "${resolvers}"' in str(error.value)


def test_a_literal_dollar_brace_is_written_twice() -> None:
    texts = profile("texts", {"firewall": {"chains": [{"name": "web", "rules": ["$${x} $1"]}]}})
    rendered = render_device([profile("base", full_spec(), priority=0), texts], _device())
    chains = _by(rendered.document["spec"]["firewall"]["chains"], "name")
    assert chains["web"]["rules"] == ["${x} $1"]


def test_references_name_the_variables_a_device_uses() -> None:
    renderer = Renderer([_site_profile(), _mtu_profile("ams", 9000, 10, "site=ams")])
    assert renderer.references({}) == {"lan_mtu", "lan_address", "site", "resolvers"}
    only = Renderer([_mtu_profile("ams", 9000, 10, "site=ams")])
    assert only.references({"site": "ams"}) == frozenset()


# --- determinism -----------------------------------------------------------------------

_SCRIPT = """
import json, sys
from tests.unit.layering_examples import full_spec, profile
from tests.unit.test_layering_render import _site_profile
from trueup.model.layering import DeviceInputs, render_device
variables = json.loads(sys.argv[1])
base = profile("base", full_spec(), priority=0)
rendered = render_device([_site_profile(), base], DeviceInputs("edge-01", {}, variables))
print(rendered.digest, rendered.provenance.variables_digest)
"""


def test_the_digest_is_the_same_in_another_process_and_for_any_key_order() -> None:
    variables = {"site": "ams", "lan_address": "203.0.113.7/24", "lan_mtu": 9000}
    here = _site_renderer().render(_device(**variables))
    reordered = dict(reversed(list(variables.items())))
    again = _site_renderer().render(_device(**reordered))
    assert (again.digest, again.provenance) == (here.digest, here.provenance)
    outputs = set()
    for seed in ("0", "12345"):
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, json.dumps(reordered)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            check=False,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.add(proc.stdout.strip())
    assert outputs == {f"{here.digest} {here.provenance.variables_digest}"}


def test_rendering_never_changes_a_profile_or_the_inputs() -> None:
    site = _site_profile()
    base = profile("base", full_spec(), priority=0)
    before = (copy.deepcopy(dict(site.document)), copy.deepcopy(dict(base.document)))
    own = {
        "interfaces": [{"name": "lan0", "mtu": 9000}],
        "routes": [{"to": "192.0.2.128/25", "table": "isp", "$delete": True}],
    }
    own_before = copy.deepcopy(own)
    inputs = DeviceInputs("edge-01", {}, {"lan_address": "203.0.113.7/24", "site": "ams"}, own)
    first = render_device([base, site], inputs)
    first.document["spec"]["interfaces"][0]["addresses"].append("192.0.2.99/24")
    second = render_device([base, site], inputs)
    assert (dict(site.document), dict(base.document)) == before
    assert own == own_before
    assert second.digest == render_device([base, site], inputs).digest
    assert "192.0.2.99/24" not in second.document["spec"]["interfaces"][0]["addresses"]


@pytest.mark.parametrize("section", sorted(full_spec()))
def test_a_document_split_into_a_profile_and_the_own_layer_renders_the_same(section: str) -> None:
    whole = parse_document(full_document())
    spec = full_spec()
    part = profile("part", {section: spec.pop(section)})
    rendered = render_device([part], _own(spec))
    assert rendered.digest == document_digest(whole)


def test_a_layer_repeating_the_profile_changes_nothing() -> None:
    whole = parse_document(full_document())
    rendered = render_device([profile("base", full_spec())], _own(full_spec()))
    assert rendered.document == whole.canonical()
    twice = render_device([profile("a", full_spec()), profile("b", full_spec())], _own({}))
    assert twice.digest == document_digest(whole)


def test_a_rendered_document_larger_than_any_document_may_be_is_refused() -> None:
    # Each profile is within the document limit; merged, the device's document is not:
    # no PUT could store it and no agent would take it.
    layers = [profile("base", full_spec(), priority=10)]
    for index in range(2):
        records = [
            {"name": f"h{index}-{n}", "type": "A", "value": "203.0.113.1"} for n in range(12_000)
        ]
        layers.append(profile(f"records-{index}", {"dns": {"records": records}}))
        assert len(json.dumps(layers[-1].as_json())) < DOCUMENT_BYTES
    with pytest.raises(RenderError) as error:
        render_device(layers, DeviceInputs(name="edge-01"))
    (problem,) = error.value.problems
    assert problem.path == "spec"
    assert f"at most {DOCUMENT_BYTES} bytes" in problem.message
    assert str(error.value).startswith("edge-01: ")
