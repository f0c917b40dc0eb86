"""The firewall's facts: nft's JSON objects of table `inet trueup`, normalised.

One fact per thing an operator names, so drift reports point at it:

| path | value |
|---|---|
| `spec.firewall` | `"inet trueup"` while the table exists, None when it must not |
| `spec.firewall.sets[NAME]` | the set as nft lists it (type, flags, sorted elements) |
| `spec.firewall.chains[NAME]` | type, hook, prio, policy of a base chain; `{}` for a regular chain |
| `spec.firewall.chains[NAME].rules[I]` | the rule's `expr` (and `comment`) |
| `spec.firewall.objects[KIND NAME]` | any other object in the table (a named counter, …) |

Normalised away: handles, the family and table (always `inet trueup`),
counter and quota values, element expiry. Facts are canonical because they
come from nft itself: the document's rules are loaded into an empty scratch
namespace and listed (`scratch_list`), the system's are listed — never
parsed by trueup. The same facts load back (`batch`), which is how a
before-image is restored exactly.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import Facts
from trueup.subsystems.firewall.section import FirewallSection, rule_path

__all__ = ["FAMILY", "TABLE", "TABLE_PATH", "batch", "facts_from_objects", "script"]

FAMILY = "inet"
TABLE = "trueup"
TABLE_PATH = "spec.firewall"
_RULE_PATH = re.compile(r"^spec\.firewall\.chains\[([^\]]+)\]\.rules\[(\d+)\]$")
_CHAIN_PATH = re.compile(r"^spec\.firewall\.chains\[([^\]]+)\]$")
_SET_PATH = re.compile(r"^spec\.firewall\.sets\[([^\]]+)\]$")
_OBJECT_PATH = re.compile(r"^spec\.firewall\.objects\[(\S+) ([^\]]+)\]$")
_ADDRESSING = ("family", "table", "handle", "name", "chain")


def _clean(value: Any) -> Any:
    """`value` without what changes by itself: counters, quota use, expiry, handles.

    Scalars are returned without a call per leaf: a 5,000-rule listing has
    hundreds of thousands of them.
    """
    if type(value) is list:
        return [_clean(v) if type(v) is dict or type(v) is list else v for v in value]
    if type(value) is not dict:
        return value
    out: JSONObject = {}
    for key, item in value.items():
        if key == "handle" or key == "expires":
            continue
        kind = type(item)
        if kind is dict:
            if key == "counter" and "packets" in item:
                item = {**item, "packets": 0, "bytes": 0}
            elif key == "quota":
                item = {k: v for k, v in item.items() if k not in ("used", "used_unit")}
            item = _clean(item)
        elif kind is list:
            item = _clean(item)
        out[key] = item
    return out


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def facts_from_objects(objects: list[JSONObject] | None) -> Facts:
    """Facts of the table listed as `objects` (`nft -j list table`); None: no table."""
    if objects is None:
        return {TABLE_PATH: None}
    facts: Facts = {}
    counts: dict[str, int] = {}
    for obj in objects:
        ((kind, body),) = obj.items()
        if kind == "table":
            facts[TABLE_PATH] = f"{FAMILY} {TABLE}"
            continue
        fields = {k: _clean(v) for k, v in body.items() if k not in _ADDRESSING}
        if kind == "chain":
            facts[f"spec.firewall.chains[{body['name']}]"] = fields
        elif kind == "rule":
            chain = body["chain"]
            index = counts.get(chain, 0)
            counts[chain] = index + 1
            facts[rule_path(chain, index)] = fields
        else:
            if "elem" in fields:
                fields["elem"] = sorted(fields["elem"], key=_sort_key)
            if kind == "set":
                facts[f"spec.firewall.sets[{body['name']}]"] = fields
            else:
                facts[f"spec.firewall.objects[{kind} {body.get('name', '')}]"] = fields
    return facts


def script(section: FirewallSection) -> tuple[str, dict[int, str]]:
    """An nft script that builds `section` in an empty ruleset, and its line → document path."""
    table = f"{FAMILY} {TABLE}"
    lines = [f"add table {table}"]
    paths = {1: TABLE_PATH}
    for nft_set in section.sets:
        parts = [f"type {nft_set.type};"]
        if nft_set.flags:
            parts.append(f"flags {','.join(nft_set.flags)};")
        if nft_set.elements:
            parts.append(f"elements = {{ {', '.join(map(str, nft_set.elements))} }}")
        lines.append(f"add set {table} {nft_set.name} {{ {' '.join(parts)} }}")
        paths[len(lines)] = f"spec.firewall.sets[{nft_set.name}]"
    for chain in section.chains:
        if chain.base:
            lines.append(
                f"add chain {table} {chain.name} {{ type {chain.type} hook {chain.hook} "
                f"priority {chain.priority}; policy {chain.policy}; }}"
            )
        else:
            lines.append(f"add chain {table} {chain.name}")
        paths[len(lines)] = f"spec.firewall.chains[{chain.name}]"
    for chain in section.chains:
        for index, rule in enumerate(chain.rules):
            lines.append(f"add rule {table} {chain.name} {rule}")
            paths[len(lines)] = rule_path(chain.name, index)
    return "\n".join(lines) + "\n", paths


def _ordered(facts: Facts) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    sets: list[tuple[str, Any]] = []
    objects: list[tuple[str, str, Any]] = []
    chains: list[tuple[str, Any]] = []
    rules: list[tuple[str, int, Any]] = []
    for path, value in facts.items():
        if value is None:
            continue
        if match := _RULE_PATH.match(path):
            rules.append((match.group(1), int(match.group(2)), value))
        elif match := _CHAIN_PATH.match(path):
            chains.append((match.group(1), value))
        elif match := _SET_PATH.match(path):
            sets.append((match.group(1), value))
        elif match := _OBJECT_PATH.match(path):
            objects.append((match.group(1), match.group(2), value))
    return sorted(sets), sorted(objects), sorted(chains), sorted(rules, key=lambda r: r[:2])


def batch(facts: Facts) -> str:
    """A JSON batch replacing table `inet trueup` by `facts` in one transaction.

    The table is added (so deleting it cannot fail), deleted and — unless the
    facts say it must not exist — added again with its sets, objects, chains
    and rules, in one `nft -j -f`: all or nothing.
    """
    table = {"family": FAMILY, "name": TABLE}
    commands: list[JSONObject] = [{"add": {"table": table}}, {"delete": {"table": table}}]
    if facts.get(TABLE_PATH) is not None:
        commands.append({"add": {"table": table}})
        sets, objects, chains, rules = _ordered(facts)
        where = {"family": FAMILY, "table": TABLE}
        for name, value in sets:
            commands.append({"add": {"set": {**where, "name": name, **value}}})
        for kind, name, value in objects:
            commands.append({"add": {kind: {**where, "name": name, **value}}})
        for name, value in chains:
            commands.append({"add": {"chain": {**where, "name": name, **value}}})
        for chain, _index, value in rules:
            commands.append({"add": {"rule": {**where, "chain": chain, **value}}})
    return json.dumps({"nftables": commands}, separators=(",", ":"))
