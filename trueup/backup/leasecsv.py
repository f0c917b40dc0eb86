"""Kea memfile CSV from Kea's control socket, one page at a time (`lease4/6-get-page`).

Who uses this: `trueup.backup.create` when Kea runs: the archive then holds
the leases exactly as Kea's own memfile would (same header and columns,
text fields escaped Kea's way), so a restore writes one kind of file
whatever the source. Memory holds one page (`PAGE_SIZE` leases) at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.system.kealeases import PAGE_SIZE, KeaSocketError, kea_command

__all__ = ["HEADER4", "HEADER6", "csv_pages"]

HEADER4 = (
    "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,hostname,"
    "state,user_context,pool_id"
)
HEADER6 = (
    "address,duid,valid_lifetime,expire,subnet_id,pref_lifetime,lease_type,iaid,prefix_len,"
    "fqdn_fwd,fqdn_rev,hostname,hwaddr,state,user_context,hwtype,hwaddr_source,pool_id"
)
_TYPES = {"IA_NA": "0", "IA_TA": "1", "IA_PD": "2"}


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text.replace("&", "&#x26").replace(",", "&#x2c").replace("\n", "&#x0a")


def _flag(value: Any) -> str:
    return "1" if value else "0"


def _row(family: int, item: JSONObject) -> str:  # a lease as Kea answers it
    valid = int(item.get("valid-lft", 0))
    expire = int(item.get("cltt", 0)) + valid
    context = _text(item.get("user-context")) if item.get("user-context") else ""
    if family == 4:
        fields = [
            item["ip-address"],
            item.get("hw-address", ""),
            item.get("client-id", ""),
            valid,
            expire,
            item.get("subnet-id", 0),
            _flag(item.get("fqdn-fwd")),
            _flag(item.get("fqdn-rev")),
            _text(item.get("hostname", "")),
            item.get("state", 0),
            context,
            item.get("pool-id", 0),
        ]
    else:
        fields = [
            item["ip-address"],
            item.get("duid", ""),
            valid,
            expire,
            item.get("subnet-id", 0),
            item.get("preferred-lft", valid),
            _TYPES.get(str(item.get("type", "IA_NA")), "0"),
            item.get("iaid", 0),
            item.get("prefix-len", 128),
            _flag(item.get("fqdn-fwd")),
            _flag(item.get("fqdn-rev")),
            _text(item.get("hostname", "")),
            item.get("hw-address", ""),
            item.get("state", 0),
            context,
            1,
            0,
            item.get("pool-id", 0),
        ]
    return ",".join(str(f) for f in fields)


def csv_pages(family: int, socket_path: Path | str, counter: list[int]) -> Iterator[bytes]:
    """The memfile CSV of every lease Kea holds, one chunk per page; `counter[0]` counts leases.

    Raises `KeaSocketError` when Kea does not answer (before or during).
    """
    yield ((HEADER4 if family == 4 else HEADER6) + "\n").encode()
    command = f"lease{family}-get-page"
    start = "start"
    while True:
        answer = kea_command(socket_path, command, {"from": start, "limit": PAGE_SIZE})
        if answer.get("result") == 3:
            return
        if answer.get("result") != 0:
            raise KeaSocketError(f"{socket_path}: {command}: {answer.get('text', answer)}")
        items = (answer.get("arguments") or {}).get("leases") or []
        counter[0] += len(items)
        yield "".join(_row(family, item) + "\n" for item in items).encode()
        if len(items) < PAGE_SIZE:
            return
        start = str(items[-1]["ip-address"])
