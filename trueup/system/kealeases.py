"""Read-only lease inspection: Kea's leases, whether Kea runs or not.

Who uses this: `trueup dhcp leases`, the DHCP subsystem's status, and the
DNS subsystem (records derived from leases, seeded at startup). Nothing here
starts, stops or reconfigures Kea, and nothing writes a lease file.

```python
for lease in read_leases(4, socket_path=run / "kea4.sock", lease_file=run / "kea-leases4.csv"):
    print(lease.address, lease.hostname, lease.expire)
```

Two sources, one answer:

* **Kea running** (its control socket answers): `lease4-get-page` /
  `lease6-get-page` (the `lease_cmds` hook trueup always loads), one page of
  `PAGE_SIZE` at a time.
* **Kea stopped** (no socket, or nobody listening): the memfile CSV Kea
  keeps. Kea loads, oldest first, `FILE.completed` if a cleanup finished,
  else `FILE.1` (the previous cleanup's output) then `FILE.2` (the copy a
  cleanup was working on), then `FILE` itself; the last row for an address
  wins, and a row with `valid_lifetime` 0 is a released (deleted) lease. A
  missing or zero-byte file is a valid empty source.

Memory does not grow with the lease rows: the files are read twice, first
remembering only where each address's last row is (one integer per
address), then yielding the winning rows as they stream past. Leases come
out in file order for the memfile and in Kea's order for the socket; sort
them yourself when you need an order.

Released leases and leases Kea declined are reported as Kea reports them
over its socket: released ones not at all, declined ones with `state`
"declined".
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.system.safefile import open_file

__all__ = [
    "PAGE_SIZE",
    "KeaSocketError",
    "Lease",
    "LeaseJSON",
    "kea_command",
    "lease_files",
    "leases_from_memfile",
    "leases_from_socket",
    "read_leases",
]

PAGE_SIZE = 1000
_STATES = {0: "default", 1: "declined", 2: "expired-reclaimed"}


class KeaSocketError(OSError):
    """Kea's control socket did not answer (absent, refused, timed out, garbled)."""


class LeaseJSON(TypedDict):
    """A lease as `trueup dhcp leases -o json` shows it (`prefix_len`, `lease_type`: DHCPv6)."""

    family: int
    address: str
    hwaddr: str
    client_id: str
    hostname: str
    expire: int
    valid_lifetime: int
    subnet_id: int
    state: str
    prefix_len: NotRequired[int]
    lease_type: NotRequired[str]


class Lease(NamedTuple):
    """One lease as Kea holds it. `client_id` is the DHCPv4 client id or the DHCPv6 DUID.

    A named tuple: immutable, hashable and cheap to build by the hundred thousand.
    """

    family: int
    address: str
    hwaddr: str
    client_id: str
    hostname: str
    expire: int  # seconds since the epoch: cltt + valid_lifetime
    valid_lifetime: int
    subnet_id: int
    state: str  # default | declined | expired-reclaimed
    prefix_len: int = 0  # DHCPv6 prefix delegations only
    lease_type: str = ""  # DHCPv6: IA_NA | IA_PD

    def to_json(self) -> LeaseJSON:
        out: LeaseJSON = {
            "family": self.family,
            "address": self.address,
            "hwaddr": self.hwaddr,
            "client_id": self.client_id,
            "hostname": self.hostname,
            "expire": self.expire,
            "valid_lifetime": self.valid_lifetime,
            "subnet_id": self.subnet_id,
            "state": self.state,
        }
        if self.family != 4:
            out["prefix_len"] = self.prefix_len
            out["lease_type"] = self.lease_type
        return out


# -- the control socket -------------------------------------------------------
def kea_command(
    socket_path: Path | str,
    command: str,
    arguments: JSONObject | None = None,
    *,
    timeout: float = 10.0,
) -> JSONObject:
    """Send one command to a Kea control socket; the response object (`result`, `text`, …).

    Raises KeaSocketError when nobody answers. Kea answers one command per
    connection and closes it; the response may arrive in several reads.
    """
    request: JSONObject = {"command": command}
    if arguments is not None:
        request["arguments"] = arguments
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(socket_path))
            conn.sendall(json.dumps(request).encode())
            chunks: list[bytes] = []
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                try:
                    json.loads(b"".join(chunks))
                except ValueError:
                    continue
                break
    except OSError as exc:
        raise KeaSocketError(f"{socket_path}: {command}: {exc}") from exc
    if not chunks:
        raise KeaSocketError(f"{socket_path}: {command}: no answer")
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise KeaSocketError(f"{socket_path}: {command}: garbled answer") from exc
    if isinstance(answer, list):  # some commands answer a one-element list
        answer = answer[0] if answer else {}
    if not isinstance(answer, dict):
        raise KeaSocketError(f"{socket_path}: {command}: unexpected answer {answer!r}")
    return answer


def _from_json(family: int, item: JSONObject) -> Lease:
    cltt = int(item.get("cltt", 0))
    valid = int(item.get("valid-lft", 0))
    return Lease(
        family=family,
        address=str(item["ip-address"]),
        hwaddr=str(item.get("hw-address", "")),
        client_id=str(item.get("client-id" if family == 4 else "duid", "")),
        hostname=str(item.get("hostname", "")),
        expire=cltt + valid,
        valid_lifetime=valid,
        subnet_id=int(item.get("subnet-id", 0)),
        state=_STATES.get(int(item.get("state", 0)), str(item.get("state"))),
        prefix_len=int(item.get("prefix-len", 0)) if family == 6 else 0,
        lease_type=str(item.get("type", "")) if family == 6 else "",
    )


def leases_from_socket(family: int, socket_path: Path | str) -> Iterator[Lease]:
    """Every lease Kea holds, one page at a time. Raises KeaSocketError when Kea is not there."""
    command = f"lease{family}-get-page"
    start: str = "start"
    while True:
        answer = kea_command(socket_path, command, {"from": start, "limit": PAGE_SIZE})
        result = answer.get("result")
        if result == 3:  # empty: no (more) leases
            return
        if result != 0:
            raise KeaSocketError(f"{socket_path}: {command}: {answer.get('text', answer)}")
        items = (answer.get("arguments") or {}).get("leases") or []
        for item in items:
            yield _from_json(family, item)
        if len(items) < PAGE_SIZE:
            return
        start = str(items[-1]["ip-address"])


# -- the memfile ---------------------------------------------------------------
def lease_files(lease_file: Path | str) -> list[Path]:
    """The files Kea loads, oldest first (see the module docstring)."""
    base = Path(lease_file)
    completed = base.with_name(base.name + ".completed")
    older = (
        [completed] if completed.exists() else [base.with_name(base.name + s) for s in (".1", ".2")]
    )
    return [p for p in [*older, base] if p.exists()]


def _unescape(text: str) -> str:
    # Kea escapes commas (and other CSV specials) in text fields as &#xNN.
    if "&#x" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("&#x", i) and i + 5 <= len(text):
            try:
                out.append(chr(int(text[i + 3 : i + 5], 16)))
                i += 5
                continue
            except ValueError:
                pass
        out.append(text[i])
        i += 1
    return "".join(out)


_V4 = (
    "address",
    "hwaddr",
    "client_id",
    "valid_lifetime",
    "expire",
    "subnet_id",
    "hostname",
    "state",
)
_V6 = ("address", "hwaddr", "duid", "valid_lifetime", "expire", "subnet_id", "hostname", "state",
       "prefix_len", "lease_type")  # fmt: skip
_LEASE_TYPES = {"0": "IA_NA", "1": "IA_TA", "2": "IA_PD"}


def _columns(family: int, header: dict[str, int]) -> tuple[int, ...]:
    """Where each field Lease needs sits in this file's rows (-1: the file has no such column)."""
    return tuple(header.get(name, -1) for name in (_V4 if family == 4 else _V6))


def _rows(paths: Iterable[Path]) -> Iterator[tuple[int, dict[str, int], str]]:
    """(row number across files, header index, line) for every data row."""
    number = 0
    for path in paths:
        # Never through a link (trueup.system.safefile): a host file is no lease file.
        fd = open_file(path, os.O_RDONLY)
        with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
            header: dict[str, int] | None = None
            for line in handle:
                line = line.rstrip("\r\n")
                if not line:
                    continue
                if header is None:
                    header = {name: i for i, name in enumerate(line.split(","))}
                    if "address" not in header:
                        raise ValueError(f"{path}: not a Kea lease file (no address column)")
                    continue
                number += 1
                yield number, header, line


def _from_row(family: int, columns: tuple[int, ...], line: str) -> Lease | None:
    fields = line.split(",")
    if len(fields) <= max(columns):
        fields += [""] * (max(columns) + 1 - len(fields))
    fields.append("")  # column -1: absent from this file
    try:
        valid = int(fields[columns[3]] or 0)
        if valid == 0:
            return None  # released
        expire = int(fields[columns[4]] or 0)
        subnet = int(fields[columns[5]] or 0)
        state = int(fields[columns[7]] or 0)
        prefix_len = int(fields[columns[8]] or 0) if family == 6 else 0
    except ValueError:
        return None  # Kea skips rows it cannot parse too
    hostname = fields[columns[6]]
    return Lease(
        family,
        fields[columns[0]],
        fields[columns[1]],
        fields[columns[2]],
        _unescape(hostname) if "&#x" in hostname else hostname,
        expire,
        valid,
        subnet,
        _STATES.get(state) or str(state),
        prefix_len,
        _LEASE_TYPES.get(fields[columns[9]], "") if family == 6 else "",
    )


def leases_from_memfile(family: int, lease_file: Path | str) -> Iterator[Lease]:
    """The leases Kea would load from its memfile, streamed (see the module docstring)."""
    paths = lease_files(lease_file)
    last: dict[str, int] = {}
    for number, _header, line in _rows(paths):
        last[line[: line.find(",")]] = number
    columns: dict[int, tuple[int, ...]] = {}  # per header (by identity): its column positions
    for number, header, line in _rows(paths):
        if last.get(line[: line.find(",")]) != number:
            continue
        key = id(header)
        if key not in columns:
            columns[key] = _columns(family, header)
        lease = _from_row(family, columns[key], line)
        if lease is not None:
            yield lease


def read_leases(
    family: int, *, socket_path: Path | str | None, lease_file: Path | str
) -> tuple[str, Iterator[Lease]]:
    """(source, leases): from the socket when Kea answers there, else from the memfile.

    `source` is "socket" or "memfile". The first socket page is fetched here,
    so a Kea that does not answer falls back to the file before anything is
    yielded.
    """
    if socket_path is not None and Path(socket_path).exists():
        iterator = leases_from_socket(family, socket_path)
        try:
            first = next(iterator)
        except StopIteration:
            return "socket", iter(())
        except KeaSocketError:
            pass
        else:

            def chained() -> Iterator[Lease]:
                yield first
                yield from iterator

            return "socket", chained()
    return "memfile", leases_from_memfile(family, lease_file)
