"""Would a ruleset cut the management API off? Evaluated on the canonical facts, at plan time.

Who calls this: `FirewallSubsystem.management_risks`, which the engine's
management guard asks before any apply or rollback; a finding refuses the
document unless the caller arranged a confirmation (`--confirm-within`).

The question is asked for three packets arriving on the management interface:

* a new TCP connection to the management API port (`ct state new`);
* an established packet and a related packet (`ct state established`,
  `related`): the return traffic of the API's connections and of everything
  the router itself opened (the control plane, name resolution).

Every base chain of trueup's table hooked at `input` sees every such packet
(an accept in one chain does not skip the next), so each is evaluated on its
own, rule by rule, like the kernel would:

* a rule's matches are each *certainly true*, *certainly false* or *unknown*
  for the packet. Known are the input interface (`iifname`/`iif`), the
  layer-4 protocol and TCP destination port (values, sets, ranges, `!=`) and
  `ct state`. Anything else (source addresses, marks, rate limits, …) is
  unknown: the packet might or might not match.
* only a rule that *certainly* matches decides: `accept` accepts, `drop` and
  `reject` block, `jump`/`goto` evaluate their chain (a `jump` that falls
  through continues, a `goto` that falls through ends at the base chain's
  policy). A rule that only *might* match decides nothing.
* falling off the end means the chain's policy: `drop` blocks.

So the finding is precisely the brief's: a policy drop without an earlier
accept that certainly admits the packet, or a rule that certainly drops it.
This is conservative where it matters: management admitted only from some
sources (`ip saddr 192.0.2.0/24 tcp dport 7443 accept`) counts as blocked,
because a client elsewhere would be cut off; a drop that only *might* apply
(`ip saddr 203.0.113.9 drop`) is not reported, since refusing every ruleset
with a conditional drop would make the guard useless. Other tables are not
trueup's and are not evaluated (they are listed as unmanaged in status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import Facts

__all__ = ["Packet", "management_findings"]

_CHAIN = re.compile(r"^spec\.firewall\.chains\[([^\]]+)\]$")
_RULE = re.compile(r"^spec\.firewall\.chains\[([^\]]+)\]\.rules\[(\d+)\]$")
_NEUTRAL = {"counter", "log", "notrack"}
_MAX_DEPTH = 16


@dataclass(frozen=True)
class Packet:
    what: str
    iifname: str
    ct_state: str
    l4proto: str | None = None
    dport: int | None = None


def _in(value: Any, right: Any) -> bool | None:
    """Whether `value` is `right` (a value, a set, a range, a wildcard name), or unknown."""
    if isinstance(right, dict) and "set" in right:
        results = [_in(value, item) for item in right["set"]]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if isinstance(right, list):
        return _in(value, {"set": right})
    if isinstance(right, dict) and "range" in right:
        low, high = right["range"]
        if isinstance(value, int) and isinstance(low, int) and isinstance(high, int):
            return low <= value <= high
        return None
    if isinstance(right, str) and isinstance(value, str):
        if right.endswith("*") and not right.endswith("\\*"):
            return value.startswith(right[:-1])
        return value == right
    if isinstance(right, int) and isinstance(value, int):
        return value == right
    if isinstance(right, (str, int)) and isinstance(value, (str, int)):
        return str(value) == str(right)
    return None


_PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1, "ipv6-icmp": 58, "icmpv6": 58}


def _match(match: JSONObject, packet: Packet) -> bool | None:
    left, right, op = match.get("left"), match.get("right"), match.get("op", "==")
    value: Any = None
    if isinstance(left, dict) and "meta" in left:
        key = left["meta"].get("key")
        if key in ("iifname", "iif"):
            value = packet.iifname
        elif key == "l4proto":
            value = packet.l4proto
    elif isinstance(left, dict) and "payload" in left:
        payload = left["payload"]
        if payload.get("protocol") == "tcp" and payload.get("field") == "dport":
            if packet.l4proto is None:
                return None
            if packet.l4proto != "tcp":
                return False
            value = packet.dport
        elif (payload.get("protocol"), payload.get("field")) in (
            ("ip", "protocol"),
            ("ip6", "nexthdr"),
        ):
            value = packet.l4proto
    elif isinstance(left, dict) and "ct" in left and left["ct"].get("key") == "state":
        value = packet.ct_state
    if value is None:
        return None
    if isinstance(value, str) and value in _PROTOCOLS and isinstance(right, int):
        value = _PROTOCOLS[value]
    result = _in(value, right)
    if op in ("==", "in"):
        return result
    if op == "!=":
        return None if result is None else not result
    return None


def _rule(rule: JSONObject, packet: Packet) -> tuple[bool | None, JSONObject | None]:
    """(whether the rule matches the packet, its verdict statement or None)."""
    certain: bool | None = True
    verdict: JSONObject | None = None
    for statement in rule.get("expr", []):
        ((kind, body),) = statement.items()
        if kind == "match":
            result = _match(body, packet)
            if result is False:
                return False, None
            if result is None:
                certain = None
        elif kind in ("accept", "drop", "reject", "jump", "goto", "return"):
            verdict = {kind: body}
        elif kind not in _NEUTRAL:
            certain = None  # a rate limit, a quota, …: the packet may or may not pass it
    return certain, verdict


@dataclass
class _Verdict:
    kind: str  # accept | drop | end (goto fell through: the base chain's policy)
    path: str


def _chain(
    facts: Facts,
    rules: dict[str, list[tuple[int, Any]]],
    name: str,
    packet: Packet,
    depth: int,
) -> _Verdict | None:
    if depth > _MAX_DEPTH:
        return None
    for index, rule in rules.get(name, []):
        path = f"spec.firewall.chains[{name}].rules[{index}]"
        matches, verdict = _rule(rule, packet)
        if matches is not True or verdict is None:
            continue
        ((kind, body),) = verdict.items()
        if kind == "accept":
            return _Verdict("accept", path)
        if kind in ("drop", "reject"):
            return _Verdict("drop", path)
        if kind == "return":
            return None
        target = body.get("target") if isinstance(body, dict) else None
        inner = _chain(facts, rules, str(target), packet, depth + 1) if target else None
        if inner is not None:
            return inner
        if kind == "goto":
            return _Verdict("end", path)
    return None


def management_findings(facts: Facts, interface: str, port: int) -> list[str]:
    """Why the ruleset in `facts` would block management on `interface`, TCP `port`."""
    packets = [
        Packet(f"new connections to the management API (tcp port {port} on {interface})",
               interface, "new", "tcp", port),
        Packet(f"established return traffic on {interface}", interface, "established"),
        Packet(f"related return traffic on {interface}", interface, "related"),
    ]  # fmt: skip
    rules: dict[str, list[tuple[int, Any]]] = {}
    bases: list[tuple[str, str]] = []
    for path, value in facts.items():
        if value is None:
            continue
        if match := _RULE.match(path):
            rules.setdefault(match.group(1), []).append((int(match.group(2)), value))
        elif (
            (match := _CHAIN.match(path))
            and value.get("hook") == "input"
            and value.get("type", "filter") == "filter"
        ):
            bases.append((match.group(1), str(value.get("policy", "accept"))))
    for chain_rules in rules.values():
        chain_rules.sort(key=lambda r: r[0])
    findings: list[str] = []
    for name, policy in sorted(bases):
        for packet in packets:
            verdict = _chain(facts, rules, name, packet, 0)
            if verdict is not None and verdict.kind == "drop":
                findings.append(f"{verdict.path} drops {packet.what}")
            elif (verdict is None or verdict.kind == "end") and policy == "drop":
                findings.append(
                    f"spec.firewall.chains[{name}] has policy drop and no earlier rule that "
                    f"certainly accepts {packet.what}"
                )
    return findings
