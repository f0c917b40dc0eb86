"""IPv6 BGP on real FRR: two routers run by trueup peer over IPv6, and a neighbour's families hold.

Topology (the two-router pair of test_routing, namespaces named per test):

    router A  wan0 2001:db8:0:1::1/64 ─── wan0 2001:db8:0:1::2/64  router B
              wan1 192.0.2.5/30       ─── wan1 192.0.2.6/30
    lan0 2001:db8:a::1/64, 203.0.113.1/25   lan0 2001:db8:b::1/64, 203.0.113.129/25

The session over wan0 is IPv6 (ipv6 unicast, its address's family); the one
over wan1 is IPv4 and activated for ipv4 unicast only, so each family's
prefixes cross on their own session and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_routing import Pair, apply, vtysh
from tests.routers import Router, base_document, require_root

pytestmark = pytest.mark.root

SIDES = {
    "a": {
        "asn": 64601,
        "lan": ["2001:db8:a::1/64", "203.0.113.1/25"],
        "wan0": "2001:db8:0:1::1/64",
        "wan1": "192.0.2.5/30",
        "networks": ("2001:db8:a::/64", "203.0.113.0/25"),
    },
    "b": {
        "asn": 64602,
        "lan": ["2001:db8:b::1/64", "203.0.113.129/25"],
        "wan0": "2001:db8:0:1::2/64",
        "wan1": "192.0.2.6/30",
        "networks": ("2001:db8:b::/64", "203.0.113.128/25"),
    },
}
PEER6 = {"a": "2001:db8:0:1::2", "b": "2001:db8:0:1::1"}
PEER4 = {"a": "192.0.2.6", "b": "192.0.2.5"}


def v6_document(side: str) -> dict[str, Any]:
    mine, other = SIDES[side], SIDES["b" if side == "a" else "a"]
    six, four = mine["networks"]
    return base_document(
        interfaces=[
            {"name": "lan0", "addresses": mine["lan"]},
            {"name": "wan0", "addresses": [mine["wan0"]]},
            {"name": "wan1", "addresses": [mine["wan1"]]},
        ],
        routes=[],
        tables={},
        routing={
            "router_id": str(mine["wan1"]).split("/")[0],
            "bgp": {
                "asn": mine["asn"],
                "neighbors": [
                    {
                        "address": PEER6[side],
                        "remote_as": other["asn"],
                        "description": "six",
                        "timers": {"keepalive": 1, "hold": 3},
                    },
                    {
                        "address": PEER4[side],
                        "remote_as": other["asn"],
                        "description": "four",
                        "timers": {"keepalive": 1, "hold": 3},
                        "families": ["ipv4_unicast"],
                    },
                ],
                "ipv4_unicast": {"networks": [four]},
                "ipv6_unicast": {"networks": [six]},
            },
        },
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    require_root()
    both = Pair(tmp_path)
    try:
        yield both
    finally:
        both.close()


def summary(router: Router) -> dict[str, Any]:
    try:
        return dict(json.loads(vtysh(router, "show bgp summary json") or "{}"))
    except (AssertionError, ValueError):
        return {}


def family_peers(router: Router, family: str) -> dict[str, Any]:
    return dict(summary(router).get(family, {}).get("peers", {}))


def bgp_routes(router: Router, family: str) -> list[str]:
    return sorted(r["dst"] for r in router.ip_json(family, "route", "show", "proto", "bgp"))


def learnt(router: Router, family: str) -> dict[str, list[str]]:
    """Each prefix bgpd holds in `family` (ipv4/ipv6 unicast), and the peers it came from."""
    shown = json.loads(vtysh(router, f"show bgp {family} unicast json") or "{}")
    return {
        prefix: sorted(p.get("peerId", "") for p in paths if p.get("peerId"))
        for prefix, paths in shown.get("routes", {}).items()
    }


def test_ipv6_bgp_exchanges_ipv6_prefixes_and_an_ipv4_only_neighbor_carries_no_ipv6(
    pair: Pair,
) -> None:
    a, b = pair.routers()
    for side, router in (("a", a), ("b", b)):
        done = apply(router, "v6.yaml", v6_document(side))
        assert done.returncode == 0, done.stdout + done.stderr

    def up(router: Router, side: str) -> bool:
        six = family_peers(router, "ipv6Unicast").get(PEER6[side], {})
        four = family_peers(router, "ipv4Unicast").get(PEER4[side], {})
        return six.get("state") == "Established" and four.get("state") == "Established"

    a.wait_for(lambda: up(a, "a") and up(b, "b"), what="the IPv6 and IPv4 sessions established")
    a.wait_for(lambda: bgp_routes(a, "-6") == ["2001:db8:b::/64"], what="B's IPv6 prefix in A")
    b.wait_for(lambda: bgp_routes(b, "-6") == ["2001:db8:a::/64"], what="A's IPv6 prefix in B")
    a.wait_for(lambda: bgp_routes(a, "-4") == ["203.0.113.128/25"], what="B's IPv4 prefix in A")
    b.wait_for(lambda: bgp_routes(b, "-4") == ["203.0.113.0/25"], what="A's IPv4 prefix in B")

    for side, router in (("a", a), ("b", b)):
        # Each neighbour is in its own family only: the IPv4 one carries no IPv6, and back.
        assert set(family_peers(router, "ipv6Unicast")) == {PEER6[side]}
        assert set(family_peers(router, "ipv4Unicast")) == {PEER4[side]}
        other = SIDES["b" if side == "a" else "a"]["networks"]
        assert learnt(router, "ipv6")[other[0]] == [PEER6[side]]
        assert learnt(router, "ipv4")[other[1]] == [PEER4[side]]
        drift = router.trueup("drift")
        assert drift.returncode == 0, drift.stdout

    a.start_agent()
    status = a.api("/v1/status")["subsystems"]["routing"]
    assert status["health"] == "ok"
    sessions = status["system"]["bgp"]
    six = sessions[PEER6["a"]]
    assert [s["family"] for s in six] == ["ipv6Unicast"]
    assert six[0]["state"] == "Established"
    assert six[0]["remote_as"] == 64602
    # Sent: A's own prefix, and B's back to B (bgpd's eBGP default; B drops it, its AS in the path).
    assert six[0]["prefixes_received"] == 1 and six[0]["prefixes_sent"] == 2
    four = sessions[PEER4["a"]]
    assert [s["family"] for s in four] == ["ipv4Unicast"]
    assert four[0]["prefixes_received"] == 1 and four[0]["prefixes_sent"] == 2
