"""A repeated name, server or peer in a services section is refused at its own path."""

from __future__ import annotations

from typing import Any

import pytest

from trueup.model.document import DocumentError, parse_document

KEY_A = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="


def _document(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "edge-01"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
            **spec,
        },
    }


def _server(name: str) -> dict[str, str]:
    return {"name": name, "address": "203.0.113.10:8000"}


def _peer() -> dict[str, Any]:
    return {"public_key": KEY_A, "allowed_ips": ["192.0.2.128/25"]}


def _wg(name: str, peers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "private_key": "secret:k", "addresses": [], "peers": peers}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {
                "proxies": [
                    {
                        "name": "web",
                        "bind": "203.0.113.1:80",
                        "backend": {"servers": [_server("a"), _server("b"), _server("a")]},
                    }
                ]
            },
            "spec.proxies[0].backend.servers[2].name: duplicate server name a (also servers[0])",
        ),
        (
            {"wireguard": {"interfaces": [_wg("wg0", [_peer(), _peer()])]}},
            "spec.wireguard.interfaces[0].peers[1].public_key: the same peer as peers[0]",
        ),
        (
            {"wireguard": {"interfaces": [_wg("wg0", []), _wg("wg0", [])]}},
            "spec.wireguard.interfaces[1].name: wg0 is also interfaces[0]",
        ),
    ],
)
def test_a_repeat_is_refused_at_its_path(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(DocumentError) as refused:
        parse_document(_document(spec), "edge.yaml")
    assert expected in str(refused.value)
