"""What status shows of routing beside its facts: daemons, BGP sessions, OSPF adjacencies.

Sessions and adjacencies are status, never facts: a neighbour down is what
the network does, not drift, and never fails the subsystem. Read from FRR's
own JSON (`show bgp summary json`, `show ip ospf neighbor json`, `show ipv6
ospf6 neighbor json`); a daemon that does not answer leaves its part empty.
"""

from __future__ import annotations

from typing import TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.system.frr import ALL_DAEMONS, FrrControl, FrrError, FrrPaths, daemon_name
from trueup.system.sources import Sources

__all__ = [
    "BgpPeer",
    "OspfNeighbor",
    "RoutingReport",
    "bgp_peers",
    "ospf6_neighbors",
    "ospf_neighbors",
    "routing_report",
]


class BgpPeer(TypedDict):
    """One BGP neighbour in one address family, as bgpd reports it."""

    family: str
    remote_as: int | None
    state: str
    uptime_msec: int | None
    established: int | None
    prefixes_received: int | None
    prefixes_sent: int | None
    description: str


class OspfNeighbor(TypedDict):
    neighbor_id: str
    state: str
    interface: str


class RoutingReport(TypedDict, total=False):
    """`subsystems.routing.system` in status."""

    daemons: list[str]
    bgp: dict[str, list[BgpPeer]]
    ospf: list[OspfNeighbor]
    ospf6: list[OspfNeighbor]
    problems: list[str]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bgp_peers(summary: JSONObject) -> dict[str, list[BgpPeer]]:
    """Neighbour address → its sessions, from `show bgp summary json`."""
    out: dict[str, list[BgpPeer]] = {}
    for family, body in sorted(summary.items()):
        peers = body.get("peers") if isinstance(body, dict) else None
        if not isinstance(peers, dict):
            continue
        for address, peer in sorted(peers.items()):
            if not isinstance(peer, dict):
                continue
            out.setdefault(address, []).append(
                {
                    "family": family,
                    "remote_as": _int(peer.get("remoteAs")),
                    "state": str(peer.get("state", "")),
                    "uptime_msec": _int(peer.get("peerUptimeMsec")),
                    "established": _int(peer.get("connectionsEstablished")),
                    "prefixes_received": _int(peer.get("pfxRcd")),
                    "prefixes_sent": _int(peer.get("pfxSnt")),
                    "description": str(peer.get("desc", "")),
                }
            )
    return out


def ospf_neighbors(answer: JSONObject) -> list[OspfNeighbor]:
    """From `show ip ospf neighbor json` (neighbour id → its adjacencies)."""
    out: list[OspfNeighbor] = []
    neighbors = answer.get("neighbors")
    if not isinstance(neighbors, dict):
        return out
    for neighbor_id, entries in sorted(neighbors.items()):
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                state = entry.get("nbrState", entry.get("state", ""))
                interface = str(entry.get("ifaceName", "")).split(":", 1)[0]
                out.append(
                    {"neighbor_id": neighbor_id, "state": str(state), "interface": interface}
                )
    return out


def ospf6_neighbors(answer: JSONObject) -> list[OspfNeighbor]:
    """From `show ipv6 ospf6 neighbor json` (a list of adjacencies)."""
    neighbors = answer.get("neighbors")
    return [
        {
            "neighbor_id": str(entry.get("neighborId", "")),
            "state": str(entry.get("state", "")),
            "interface": str(entry.get("interfaceName", "")),
        }
        for entry in (neighbors if isinstance(neighbors, list) else [])
        if isinstance(entry, dict)
    ]


def routing_report(sources: Sources, paths: FrrPaths) -> RoutingReport:
    running = [d for d in ALL_DAEMONS if sources.daemons.running(daemon_name(d))]
    report: RoutingReport = {"daemons": running}
    if not running:
        return report
    frr = FrrControl(sources.runner, paths, timeout=10.0)
    problems: list[str] = []
    try:
        if "bgpd" in running:
            report["bgp"] = bgp_peers(frr.json("show bgp summary json"))
        if "ospfd" in running:
            report["ospf"] = ospf_neighbors(frr.json("show ip ospf neighbor json"))
        if "ospf6d" in running:
            report["ospf6"] = ospf6_neighbors(frr.json("show ipv6 ospf6 neighbor json"))
    except FrrError as exc:
        problems.append(str(exc))
    if problems:
        report["problems"] = problems
    return report
