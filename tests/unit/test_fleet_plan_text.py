"""`trueup fleet plan` text and `NAME=VALUE` arguments, without a server."""

from __future__ import annotations

import pytest
import typer

from trueup.cli.fleet_inputs import parse_assignments, render_plan


def test_assignments_read_json_values_else_text_and_a_trailing_dash_removes() -> None:
    assert parse_assignments(
        ["mtu=9000", "on=true", 'dns=["192.0.2.53","2001:db8::53"]', "site=01", "old-", "x=null"]
    ) == {
        "mtu": 9000,
        "on": True,
        "dns": ["192.0.2.53", "2001:db8::53"],
        "site": "01",  # not JSON: text, never the number 1
        "old": None,
        "x": "null",  # null is not a value: the text
    }
    assert parse_assignments(["addr=198.51.100.2/24"]) == {"addr": "198.51.100.2/24"}


@pytest.mark.parametrize("bad", ["novalue", "=1", "-"])
def test_an_argument_that_is_neither_is_refused(bad: str) -> None:
    with pytest.raises(typer.Exit) as raised:
        parse_assignments([bad])
    assert raised.value.exit_code == 1


def test_the_plan_reads_per_device_then_refusals_then_counts() -> None:
    text = render_plan(
        {
            "targets": [
                {
                    "device": "edge-01",
                    "from_version": 3,
                    "changes": [
                        {
                            "path": "spec.interfaces[lan0].mtu",
                            "op": "change",
                            "old": 1500,
                            "new": 9000,
                        },
                        {"path": "spec.dns", "op": "add", "old": None, "new": {"zone": "ams"}},
                        {
                            "path": "spec.routes[to=192.0.2.0/24]",
                            "op": "remove",
                            "old": {},
                            "new": None,
                        },
                    ],
                }
            ],
            "refused": [
                {"device": "edge-02", "kind": "render", "problems": ["variables.mtu: too big"]}
            ],
            "counts": {"changed": 1, "refused": 1, "unchanged": 7},
        }
    )
    assert text.splitlines() == [
        "edge-01: desired version 3 -> new",
        "  ~ spec.interfaces[lan0].mtu: 1500 -> 9000",
        '  + spec.dns: (none) -> {"zone": "ams"}',
        "  - spec.routes[to=192.0.2.0/24]: {} -> (none)",
        "edge-02: REFUSED (render)",
        "  variables.mtu: too big",
        "Plan: 1 to change, 1 refused, 7 unchanged.",
    ]
