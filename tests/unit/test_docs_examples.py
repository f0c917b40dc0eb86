"""The services' pages open with an example an operator copies: each must validate as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trueup.model.document import parse_document

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _base() -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "edge-01"},
        "spec": {
            "management": {
                "interface": "mgmt0",
                "addresses": ["198.51.100.2/24"],
                "api": {"port": 7443},
            },
            "interfaces": [{"name": "lan0", "state": "up", "addresses": ["203.0.113.1/24"]}],
        },
    }


@pytest.mark.parametrize("page", ["ha.md", "proxy.md", "wireguard.md", "routing.md", "gateways.md"])
def test_the_first_example_of_each_service_page_validates(page: str) -> None:
    match = re.search(r"```yaml\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert match, f"docs/{page} has no yaml example"
    example = yaml.safe_load(match.group(1))
    document = _base()
    document["spec"].update(example.get("spec", example))
    parsed = parse_document(document, f"docs/{page}")
    assert parsed.metadata.device == "edge-01"
