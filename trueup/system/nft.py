"""nftables: the `nft` program (scripts in, JSON out) and the ruleset's generation number.

Who calls this: the firewall subsystem (`trueup.subsystems.firewall`), through
`Sources.nft` for observing and loading and through its own instance for
canonicalising a document's rules.

* `run(script)` loads a script (`nft -f -`, or `nft -j -f -` for a JSON
  batch) as one kernel transaction; a refusal is an `NftError` carrying the
  script's line numbers nft named, so callers map them back to document paths.
* `list_table(family, name)` is `nft -j list table`, the objects without the
  metainfo; None when the table does not exist.
* `scratch_list(script, family, name)` loads `script` in a new, empty network
  namespace (`unshare --net`) and lists the table there: how a document's rules
  get nft's canonical JSON form without touching the real ruleset or
  re-implementing nft's grammar.
* `generation()` is the kernel's ruleset generation (`NFT_MSG_GETGEN` on a
  netfilter netlink socket, well under a millisecond), with the network
  namespace it belongs to: every committed nftables transaction increments it,
  so an unchanged generation means an unchanged ruleset and a cached listing
  can be reused.

Why the `nft` program rather than libnftables through ctypes: the cost of
listing or loading thousands of rules is nft's own parsing and JSON
printing, the same in the library; starting the program adds about 3 ms
(measured with 5,000 rules: `nft -f` 150 ms, `nft -c -f` 180 ms, `nft -j list
table` 160 ms). The program is also what operators run by hand.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from dataclasses import dataclass, field
from typing import Protocol

from trueup.model.jsontypes import JSONObject
from trueup.system.requirements import Requirement, binary
from trueup.system.runner import Runner, SubprocessRunner

__all__ = ["REQUIREMENTS", "HostNftables", "NftError", "Nftables", "error_lines"]

# What `trueup preflight` checks before an agent that owns a firewall starts: nft, and
# unshare for the scratch namespace documents are canonicalised in.
REQUIREMENTS: tuple[Requirement, ...] = (
    binary("nft", "nftables", ("-v",)),
    binary("unshare", "util-linux", ("--version",)),
)

_ERROR_LINE = re.compile(r"^(?:/dev/stdin|-):(\d+):[\d-]+: (.*)$")


class NftError(RuntimeError):
    """nft refused a script; `lines` maps the script's line numbers to nft's messages."""

    def __init__(self, message: str, lines: dict[int, str] | None = None) -> None:
        self.lines = dict(lines or {})
        super().__init__(message)


def error_lines(stderr: str) -> dict[int, str]:
    """The script lines nft's error output names (`/dev/stdin:5:30-33: Error: …`)."""
    out: dict[int, str] = {}
    for line in stderr.splitlines():
        match = _ERROR_LINE.match(line.strip())
        if match:
            out.setdefault(int(match.group(1)), match.group(2))
    return out


class Nftables(Protocol):
    def generation(self) -> tuple[int, int] | None:
        """(network namespace inode, ruleset generation), or None when unknown."""
        ...

    def list_table(self, family: str, name: str) -> list[JSONObject] | None: ...

    def tables(self) -> list[tuple[str, str]]: ...

    def run(self, script: str, *, json_input: bool = False) -> None: ...

    def scratch_list(self, script: str, family: str, name: str) -> list[JSONObject]: ...


def _objects(stdout: str) -> list[JSONObject]:
    data = json.loads(stdout or '{"nftables": []}')
    return [o for o in data.get("nftables", []) if "metainfo" not in o]


# netfilter netlink: NFNL_SUBSYS_NFTABLES (10) << 8 | NFT_MSG_GETGEN (16); NFTA_GEN_ID = 1.
_NETLINK_NETFILTER = 12
_GETGEN = (10 << 8) | 16
_NEWGEN = (10 << 8) | 15
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2


def _read_generation() -> int | None:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    except OSError:
        return None
    with sock:
        sock.settimeout(1.0)
        request = struct.pack("=IHHII", 20, _GETGEN, _NLM_F_REQUEST, 1, 0) + struct.pack(
            "=BBH", socket.AF_UNSPEC, 0, 0
        )
        try:
            sock.send(request)
            data = sock.recv(4096)
        except OSError:
            return None
    if len(data) < 20:
        return None
    length, kind = struct.unpack_from("=IH", data, 0)
    if kind != _NEWGEN:
        return None
    offset = 20
    while offset + 4 <= min(length, len(data)):
        size, attr = struct.unpack_from("=HH", data, offset)
        if size < 4:
            return None
        if attr & 0x3FFF == 1 and size >= 8:
            return int(struct.unpack_from(">I", data, offset + 4)[0])
        offset += (size + 3) & ~3
    return None


def _netns() -> int:
    try:
        return os.stat("/proc/thread-self/ns/net").st_ino
    except OSError:
        return 0


@dataclass
class HostNftables:
    """The machine's nftables, through the `nft` program."""

    runner: Runner = field(default_factory=SubprocessRunner)
    binary: str = "nft"
    timeout: float = 60.0

    def generation(self) -> tuple[int, int] | None:
        gen = _read_generation()
        return None if gen is None else (_netns(), gen)

    def list_table(self, family: str, name: str) -> list[JSONObject] | None:
        done = self.runner.run([self.binary, "-j", "list", "table", family, name], timeout=30)
        if not done.ok:
            if "No such file or directory" in done.stderr:
                return None
            raise NftError(f"nft list table {family} {name}: {done.stderr.strip()}")
        return _objects(done.stdout)

    def tables(self) -> list[tuple[str, str]]:
        done = self.runner.run([self.binary, "-j", "list", "tables"], timeout=30)
        if not done.ok:
            raise NftError(f"nft list tables: {done.stderr.strip()}")
        return [(t["table"]["family"], t["table"]["name"]) for t in _objects(done.stdout)]

    def run(self, script: str, *, json_input: bool = False) -> None:
        argv = [self.binary, *(["-j"] if json_input else []), "-f", "-"]
        done = self.runner.run(argv, input=script, timeout=self.timeout)
        if not done.ok:
            raise NftError(
                done.stderr.strip() or f"nft exited {done.returncode}", error_lines(done.stderr)
            )

    def scratch_list(self, script: str, family: str, name: str) -> list[JSONObject]:
        argv = [
            "unshare",
            "--net",
            "--",
            "sh",
            "-c",
            f'{self.binary} -f /dev/stdin && exec {self.binary} -j list table "$0" "$1"',
            family,
            name,
        ]
        done = self.runner.run(argv, input=script, timeout=self.timeout)
        if not done.ok:
            raise NftError(
                done.stderr.strip() or f"nft exited {done.returncode}", error_lines(done.stderr)
            )
        return _objects(done.stdout)
