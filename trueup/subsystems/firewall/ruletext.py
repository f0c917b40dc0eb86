"""A rule fact (nft's JSON: `{"expr": [...], "comment": …}`) as the nft rule text it lists as.

Who uses this: `FirewallSubsystem.diff`, so drift and status show
`tcp dport 22 accept` against `tcp dport 22 drop` — never `{}` for a verdict
whose JSON value is null. Pure: no nft call, so rendering a difference costs
nothing and works with the agent stopped.

It covers the statements trueup's documents use (matches on payload, meta,
ct, sets and prefixes; verdicts; counter, log, limit, reject; NAT;
notrack). A statement it does not know is shown as its compact JSON, marked
as such, rather than guessed at.
"""

from __future__ import annotations

import json
from typing import Any

from trueup.model.jsontypes import JSONObject

__all__ = ["rule_text"]

# Meta keys nft prints without `meta` (nft's "unqualified" keys).
_BARE_META = frozenset(
    {
        "iif",
        "oif",
        "iifname",
        "oifname",
        "iiftype",
        "oiftype",
        "mark",
        "skuid",
        "skgid",
        "rtclassid",
        "nftrace",
        "ibrname",
        "obrname",
        "iifgroup",
        "oifgroup",
        "cgroup",
        "random",
        "ipsec",
        "cpu",
        "pkttype",
    }
)
# Keys whose string values nft quotes (interface and bridge names).
_QUOTED = frozenset({"iifname", "oifname", "ibrname", "obrname"})
_VERDICTS = frozenset({"accept", "drop", "continue", "return", "queue"})


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _value(value: Any, quote: bool = False) -> str:
    """The right-hand side of a match, or any expression."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return _quote(value) if quote and not value.startswith("@") else value
    if isinstance(value, list):  # flags: `established,related`
        return ",".join(_value(v, quote) for v in value)
    if not isinstance(value, dict) or len(value) != 1:
        return _unknown(value)
    ((kind, body),) = value.items()
    if kind == "set":
        items = body if isinstance(body, list) else [body]
        return "{ " + ", ".join(_value(v, quote) for v in items) + " }"
    if kind == "prefix" and isinstance(body, dict):
        return f"{_value(body.get('addr'))}/{body.get('len')}"
    if kind == "range" and isinstance(body, list) and len(body) == 2:
        return f"{_value(body[0], quote)}-{_value(body[1], quote)}"
    if kind == "payload" and isinstance(body, dict):
        if "protocol" in body:
            return f"{body['protocol']} {body.get('field')}"
        return f"@{body.get('base')},{body.get('offset')},{body.get('len')}"
    if kind == "meta" and isinstance(body, dict):
        key = str(body.get("key"))
        return key if key in _BARE_META else f"meta {key}"
    if kind == "ct" and isinstance(body, dict):
        parts = ["ct"]
        if body.get("dir"):
            parts.append(str(body["dir"]))
        if body.get("family"):
            parts.append(str(body["family"]))
        parts.append(str(body.get("key")))
        return " ".join(parts)
    if kind == "concat" and isinstance(body, list):
        return " . ".join(_value(v, quote) for v in body)
    if kind == "elem" and isinstance(body, dict):
        return _value(body.get("val"), quote)
    if kind in ("&", "|", "^", "<<", ">>") and isinstance(body, list) and len(body) == 2:
        return f"{_value(body[0])} {kind} {_value(body[1])}"
    if kind == "fib" and isinstance(body, dict):
        flags = body.get("flags") or []
        flags = flags if isinstance(flags, list) else [flags]
        return f"fib {' . '.join(map(str, flags))} {body.get('result')}"
    return _unknown(value)


def _quotes(left: Any) -> bool:
    return isinstance(left, dict) and str((left.get("meta") or {}).get("key")) in _QUOTED


def _match(body: JSONObject) -> str:
    left, right, op = body.get("left"), body.get("right"), body.get("op", "==")
    text = _value(left)
    shown = "" if op in ("==", "in") else f"{op} "
    return f"{text} {shown}{_value(right, quote=_quotes(left))}"


def _statement(statement: Any) -> str:
    if not isinstance(statement, dict) or len(statement) != 1:
        return _unknown(statement)
    ((kind, body),) = statement.items()
    if kind == "match" and isinstance(body, dict):
        return _match(body)
    if kind in _VERDICTS:
        return str(kind)
    if kind in ("jump", "goto") and isinstance(body, dict):
        return f"{kind} {body.get('target')}"
    if kind == "counter":
        return "counter"
    if kind == "notrack":
        return "notrack"
    if kind == "log":
        parts = ["log"]
        for key in ("prefix", "group", "level", "snaplen"):
            if isinstance(body, dict) and body.get(key) is not None:
                value = body[key]
                parts.append(f"{key} {_quote(value) if key == 'prefix' else value}")
        return " ".join(parts)
    if kind == "limit" and isinstance(body, dict):
        over = "over " if body.get("inv") else ""
        unit = f" {body['rate_unit']}" if body.get("rate_unit") not in (None, "packets") else ""
        burst = f" burst {body['burst']} packets" if body.get("burst") else ""
        return f"limit rate {over}{body.get('rate')}{unit}/{body.get('per')}{burst}"
    if kind == "reject":
        if isinstance(body, dict) and body.get("type"):
            expr = f" {body['expr']}" if body.get("expr") else ""
            return f"reject with {body['type']}{expr}"
        return "reject"
    if kind in ("snat", "dnat", "masquerade", "redirect"):
        if not isinstance(body, dict) or not body:
            return str(kind)
        target = ""
        if body.get("addr") is not None:
            target = _value(body["addr"])
        if body.get("port") is not None:
            target += f":{_value(body['port'])}"
        words = [kind]
        if body.get("family"):
            words.append(str(body["family"]))
        if target:
            words.append(f"to {target}")
        return " ".join(words)
    if kind == "mangle" and isinstance(body, dict):
        return f"{_value(body.get('key'))} set {_value(body.get('value'))}"
    return _unknown(statement)


def _unknown(value: Any) -> str:
    return "<json " + json.dumps(value, separators=(",", ":"), sort_keys=True) + ">"


def rule_text(fact: Any) -> Any:
    """The rule as nft lists it (`tcp dport 22 accept`, `… comment "ssh"`); anything that is
    not a rule fact (None: absent) is returned as it is."""
    if not isinstance(fact, dict) or not isinstance(fact.get("expr"), list):
        return fact
    text = " ".join(_statement(s) for s in fact["expr"])
    if fact.get("comment"):
        text += f" comment {_quote(str(fact['comment']))}"
    return text
