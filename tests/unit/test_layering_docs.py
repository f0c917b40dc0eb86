"""docs/fleet.md's profiles section: its worked example renders to what the page shows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trueup.model.layering import DeviceInputs, Renderer, RenderError, parse_profile

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"


def _section() -> str:
    text = PAGE.read_text()
    start = text.index("<!-- section: profiles")
    return text[start : text.index("<!-- /section: profiles -->")]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", _section(), re.S)


def _subset(expected: Any, actual: Any, path: str = "spec") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} missing"
            _subset(value, actual[key], f"{path}.{key}")
    else:
        assert expected == actual, path


def test_the_worked_example_renders_as_shown() -> None:
    profiles_text, device_text, result_text = _blocks("yaml")
    profiles = [parse_profile(d, source="docs/fleet.md") for d in yaml.safe_load_all(profiles_text)]
    device = yaml.safe_load(device_text)
    inputs = DeviceInputs(device["device"], device["labels"], device["variables"], device["own"])
    rendered = Renderer(profiles).render(inputs)
    _subset(yaml.safe_load(result_text), rendered.document["spec"])
    assert [name for name, _ in rendered.provenance.profiles] == ["base", "edge-ams"]


@pytest.mark.parametrize(
    "variables",
    [
        {"mgmt_address": "198.51.100.2/24", "lan_address": "203.0.113.1/24", "lan_mtu": 70},
        {"lan_address": "203.0.113.1/24", "color": "blue"},
        {"mgmt_address": "198.51.100.2/24", "lan_address": "198.51.100.2/24"},
    ],
)
def test_the_errors_shown_are_the_errors_given(variables: dict[str, Any]) -> None:
    profiles_text = _blocks("yaml")[0]
    (shown,) = _blocks("text")
    profiles = [parse_profile(d) for d in yaml.safe_load_all(profiles_text)]
    with pytest.raises(RenderError) as error:
        Renderer(profiles).render(
            DeviceInputs("edge-01", {"site": "ams", "role": "edge"}, variables)
        )
    lines = shown.splitlines()
    for problem in error.value.problems:
        assert f"edge-01: {problem}" in lines
