"""A `knotc` in memory, for unit tests of the DNS subsystem (`trueup.system.knot`).

`FakeKnotc` is a `Runner`: it answers the `knotc` commands trueup sends
(`status`, `conf-read`, `zone-read`, `zone-begin`/`zone-set`/`zone-unset`/
`zone-commit`/`zone-abort`, and batches of them on stdin) from `zones`
(zone → records, SOA first) and `conf` (item → values), and records every
call. `answering` False makes it behave like a stopped server; `refuse` maps
a record text to the error a `zone-set` of it gets. Other programs get 127.

`start_from(paths)` loads what a real `knotd` would at start: the listen
addresses and zones of the configuration trueup wrote, and each zone file
(`FakeDaemons` subclasses call it when they "start" Knot).
"""

from __future__ import annotations

import re
import shlex

from trueup.system.knot import KnotPaths
from trueup.system.runner import Completed

__all__ = ["FakeKnotc"]


class FakeKnotc:
    def __init__(self) -> None:
        self.zones: dict[str, list[str]] = {}
        self.conf: dict[str, list[str]] = {}
        self.answering = True
        self.refuse: dict[str, str] = {}
        self.calls: list[tuple[str, ...]] = []
        self._open: dict[str, list[str]] = {}

    def serve(self, zones: list[str], listen: list[str]) -> None:
        """What a freshly started Knot holds: each zone with its SOA only."""
        self.answering = True
        self.zones = {
            z: [f"{z} 3600 SOA ns.{z} hostmaster.{z} 1 3600 900 604800 60"] for z in zones
        }
        self.conf = {"server.listen": list(listen), "zone.domain": sorted(zones)}

    def start_from(self, paths: KnotPaths) -> None:
        config = paths.config.read_text()
        listen = re.findall(r'"([^"]+@\d+)"', config)
        zones = re.findall(r'domain: "([^"]+)"', config)
        self.serve(zones, listen)
        for zone in zones:
            records = []
            for line in paths.zone_file(zone).read_text().splitlines():
                if line and not line.startswith(";"):
                    owner, ttl, _class, rtype, rdata = line.split(" ", 4)
                    records.append(f"{owner} {ttl} {rtype} {rdata}")
            self.zones[zone] = records

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        del timeout
        key = tuple(argv)
        self.calls.append(key)
        if not argv or argv[0] != "knotc":
            return Completed(key, 127, "", f"{argv[0] if argv else '?'}: not faked")
        if not self.answering:
            return Completed(key, 1, "", "error: failed to connect to socket (not exists)")
        args = list(argv[1:])
        while args and args[0] in ("-s", "-t"):
            args = args[2:]
        if not args:
            lines = [shlex.split(line) for line in (input or "").splitlines() if line.strip()]
            return Completed(key, 0, "\n".join(self._one(words) for words in lines) + "\n", "")
        out = self._one(args)
        return Completed(key, 1 if out.startswith("error:") else 0, out + "\n", "")

    def _one(self, words: list[str]) -> str:
        command, rest = words[0], words[1:]
        if command == "status":
            return "Running"
        if command == "conf-read":
            return "\n".join(f"{rest[0]} = {v}" for v in self.conf.get(rest[0], []))
        zone = rest[0] if rest else ""
        if zone not in self.zones:
            return f"error: (no such zone found) [{zone}]"
        if command == "zone-read":
            return "\n".join(f"[{zone}] {r}" for r in self.zones[zone])
        if command == "zone-begin":
            if zone in self._open:
                return f"error: [{zone}] (too many transactions)"
            self._open[zone] = list(self.zones[zone])
            return "OK"
        if zone not in self._open:
            return f"error: (no active transaction) [{zone}]"
        if command == "zone-abort":
            del self._open[zone]
            return "OK"
        if command == "zone-commit":
            self.zones[zone] = self._open.pop(zone)
            return "OK"
        if command == "zone-set":
            owner, ttl, rtype, rdata = rest[1:5]
            record = f"{owner} {ttl} {rtype} {rdata}"
            if record in self.refuse:
                return f"error: ({self.refuse[record]}) [{zone}] {record}"
            self._open[zone].append(record)
            return "OK"
        if command == "zone-unset":
            owner, rtype, rdata = rest[1:4]
            matching = [r for r in self._open[zone] if r.split(" ", 3)[::2] == [owner, rtype]]
            matching = [r for r in matching if r.split(" ", 3)[3] == rdata]
            if not matching:
                return f"error: (no such record in zone found) [{zone}] {owner} {rtype} {rdata}"
            self._open[zone].remove(matching[0])
            return "OK"
        return f"error: {command}: not faked"
