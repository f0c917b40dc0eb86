"""In-memory stand-ins for the system seam, for unit tests.

`FakeNetlink` behaves like one network namespace: links must exist before
addresses go on them, duplicates are refused with EEXIST, a gateway must be
on-link (inside a prefix on an up link) as the kernel demands.

Why this module is over 400 lines: one fake per seam (netlink with its rules,
nftables, daemons, files, commands), each as small as the behaviour the
unit tests lean on; splitting them would scatter the seam's one stand-in.
"""

from __future__ import annotations

import copy
import errno
import ipaddress
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.system.atomicfile import write_atomic
from trueup.system.daemonspec import DaemonError, DaemonSpec, DaemonStatus
from trueup.system.netlink import AddrInfo, LinkInfo, NetlinkError, RouteInfo, RuleInfo
from trueup.system.nft import NftError
from trueup.system.runner import Completed
from trueup.system.safefile import ensure_dir, read_file

__all__ = [
    "FakeAnnouncer",
    "FakeDaemons",
    "FakeFiles",
    "FakeNetlink",
    "FakeNftables",
    "FakeRunner",
]


class FakeDaemons:
    """A daemon supervisor in memory (`trueup.system.daemon.Daemons`).

    `specs` holds what each daemon was last ensured with, `alive` which run,
    `events` every ensure/stop/restart in order; `fail_start` names daemons
    whose start raises DaemonError. `before_start`/`after_start` are called
    like the real supervisor calls them (`after_start` with a made-up pid).
    """

    def __init__(self, run_root: Path = Path("/run/trueup-fake")) -> None:
        self.run_root = run_root
        self.specs: dict[str, DaemonSpec] = {}
        self.alive: dict[str, bool] = {}
        self.events: list[tuple[str, str]] = []
        self.fail_start: set[str] = set()
        self._pid = 1000

    def run_dir(self, name: str) -> Path:
        return self.run_root / name

    def _start(self, spec: DaemonSpec) -> None:
        if spec.name in self.fail_start:
            raise DaemonError(f"{spec.name}: cannot start (fake)")
        if spec.before_start is not None:
            spec.before_start()
        self._pid += 1
        self.alive[spec.name] = True
        if spec.after_start is not None:
            spec.after_start(self._pid)

    def ensure(self, spec: DaemonSpec) -> DaemonStatus:
        self.events.append(("ensure", spec.name))
        previous = self.specs.get(spec.name)
        self.specs[spec.name] = spec
        if not self.alive.get(spec.name) or (previous is not None and previous.argv != spec.argv):
            self._start(spec)
        return self.status(spec.name)

    def stop(self, name: str) -> None:
        self.events.append(("stop", name))
        self.alive[name] = False

    def restart(self, name: str) -> DaemonStatus:
        self.events.append(("restart", name))
        self.alive[name] = False
        self._start(self.specs[name])
        return self.status(name)

    def crash(self, name: str) -> None:
        """The daemon exits on its own; the real supervisor would restart it (see `restart`)."""
        self.alive[name] = False

    def running(self, name: str) -> bool:
        return self.alive.get(name, False)

    def signal(self, name: str, sig: int) -> bool:
        self.events.append((f"signal:{int(sig)}", name))
        return self.alive.get(name, False)

    def status(self, name: str) -> DaemonStatus:
        running = self.alive.get(name, False)
        return DaemonStatus(name, running, self._pid if running else None)


class FakeRunner:
    """Answers commands from a table (`argv` tuple → Completed); records every call."""

    def __init__(self, answers: dict[tuple[str, ...], Completed] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        del input, timeout
        key = tuple(argv)
        self.calls.append(key)
        return self.answers.get(key, Completed(key, 127, "", f"{argv[0]}: not faked"))


class FakeAnnouncer:
    """Records announcements instead of sending them."""

    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []

    def announce(self, ifname: str, prefix: str) -> None:
        self.announced.append((ifname, prefix))


class FakeFiles:
    """Files in memory (`path → text`); `fail_on` maps a path to the OSError a write raises.

    The agent's own files (`read_private`, `write_private`, …) are real files, recorded."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files: dict[str, str] = dict(files or {})
        self.fail_on: dict[str, OSError] = {}
        self.writes: list[tuple[str, str]] = []
        self.private_writes: list[Path] = []
        self.private_dirs: list[Path] = []

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def write(self, path: str, text: str) -> None:
        if path in self.fail_on:
            raise self.fail_on[path]
        self.writes.append((path, text))
        self.files[path] = text

    def remove(self, path: str) -> None:
        if path in self.fail_on:
            raise self.fail_on[path]
        self.files.pop(path, None)

    # The agent's own files (run directories) are real files below the test's directory,
    # where the daemons and their fakes read them; each write is recorded, and a path in
    # `fail_on` fails as the host would.

    def read_private(self, path: Path) -> bytes:
        if str(path) in self.fail_on:
            raise self.fail_on[str(path)]
        return read_file(path)

    def write_private(self, path: Path, data: bytes, *, durable: bool = True) -> None:
        if str(path) in self.fail_on:
            raise self.fail_on[str(path)]
        self.private_writes.append(path)
        ensure_dir(path.parent)
        write_atomic(path, data, 0o600, durable=durable)

    def remove_private(self, path: Path) -> None:
        if str(path) in self.fail_on:
            raise self.fail_on[str(path)]
        path.unlink(missing_ok=True)

    def replace_private(self, source: Path, target: Path) -> None:
        if str(target) in self.fail_on:
            raise self.fail_on[str(target)]
        self.private_writes.append(target)
        source.replace(target)

    def make_private_dir(self, path: Path) -> None:
        if str(path) in self.fail_on:
            raise self.fail_on[str(path)]
        self.private_dirs.append(path)
        ensure_dir(path)


class FakeNetlink:
    def __init__(self, links: dict[str, int] | None = None) -> None:
        self.link_state: dict[str, LinkInfo] = {}
        self.addrs: list[AddrInfo] = []
        self.route_table: list[RouteInfo] = []
        self.rule_table: list[RuleInfo] = []
        self.calls: list[str] = []
        self.fail_on: dict[str, NetlinkError] = {}
        for index, (name, mtu) in enumerate((links or {}).items(), start=2):
            self.link_state[name] = LinkInfo(name, index, "down", mtu, carrier=False)

    def _check(self, operation: str) -> None:
        self.calls.append(operation)
        for needle, error in self.fail_on.items():
            if needle in operation:
                raise error

    def _link(self, name: str, operation: str) -> LinkInfo:
        if name not in self.link_state:
            raise NetlinkError(operation, "No such device", errno.ENODEV)
        return self.link_state[name]

    def links(self) -> list[LinkInfo]:
        return list(self.link_state.values())

    def addresses(self) -> list[AddrInfo]:
        return list(self.addrs)

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        return [r for r in self.route_table if r.table in tables]

    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        operation = f"set link {name}"
        self._check(operation)
        link = self._link(name, operation)
        self.link_state[name] = LinkInfo(
            name, link.index, state or link.state, mtu or link.mtu, link.carrier
        )

    def add_address(self, ifname: str, prefix: str) -> None:
        operation = f"add address {prefix} on {ifname}"
        self._check(operation)
        self._link(ifname, operation)
        info = AddrInfo(ifname, prefix, ipaddress.ip_interface(prefix).version)
        if info not in self.addrs:  # like KernelNetlink: present counts as added
            self.addrs.append(info)

    def del_address(self, ifname: str, prefix: str) -> None:
        operation = f"delete address {prefix} on {ifname}"
        self._check(operation)
        info = AddrInfo(ifname, prefix, ipaddress.ip_interface(prefix).version)
        if info in self.addrs:  # like KernelNetlink: absent counts as removed
            self.addrs.remove(info)
            # Like the kernel: routes whose gateway is no longer on-link are flushed.
            self.route_table = [r for r in self.route_table if self._onlink(r)]

    def _onlink(self, route: RouteInfo) -> bool:
        if route.via is None:
            return True
        gateway = ipaddress.ip_address(route.via)
        return any(
            gateway in ipaddress.ip_interface(a.prefix).network
            for a in self.addrs
            if route.dev is None or a.ifname == route.dev
        )

    def add_route(self, route: RouteInfo) -> None:
        operation = f"add route to {route.to} (table {route.table})"
        self._check(operation)
        dev = route.dev
        if route.via is not None:
            gateway = ipaddress.ip_address(route.via)
            onlink = [
                a
                for a in self.addrs
                if gateway in ipaddress.ip_interface(a.prefix).network
                and (dev is None or a.ifname == dev)
            ]
            if not onlink:
                raise NetlinkError(operation, "Network is unreachable", errno.ENETUNREACH)
            dev = onlink[0].ifname
        self.route_table = [r for r in self.route_table if r.key != route.key]
        self.route_table.append(replace(route, dev=dev))

    def del_route(self, route: RouteInfo) -> None:
        operation = f"delete route to {route.to} (table {route.table})"
        self._check(operation)
        for existing in self.route_table:
            if existing.key == route.key:
                self.route_table.remove(existing)
                return

    def rules(self) -> list[RuleInfo]:
        return list(self.rule_table)

    def add_rule(self, rule: RuleInfo) -> None:
        self._check(f"add rule oif {rule.oif} lookup {rule.table}")
        if rule not in self.rule_table:  # like KernelNetlink: present counts as added
            self.rule_table.append(rule)

    def del_rule(self, rule: RuleInfo) -> None:
        self._check(f"delete rule oif {rule.oif} lookup {rule.table}")
        if rule in self.rule_table:
            self.rule_table.remove(rule)

    def close(self) -> None:
        pass


_SCRIPT_LINE = re.compile(r"^add (table|set|chain|rule) (\S+) (\S+)(?: (\S+))?(?: (.*))?$")


class FakeNftables:
    """nftables in memory: tables of nft JSON objects, a generation, scripts in trueup's shape.

    `scratch_list` understands the scripts `trueup.subsystems.firewall` writes
    (one `add` per line); a rule's canonical `expr` comes from `canonical`
    (rule text → expr, default `[{"rule": TEXT}]`), and `refuse` (rule text →
    message) makes nft refuse the line naming it, like `nft -f` does.
    `run` applies JSON batches; `fail_next` makes the next one fail.
    """

    def __init__(self) -> None:
        self.ruleset: dict[tuple[str, str], list[JSONObject]] = {}
        self.gen = 1
        self.canonical: dict[str, list[Any]] = {}
        self.refuse: dict[str, str] = {}
        self.fail_next: str | None = None
        self.batches: list[JSONObject] = []
        self.scripts: list[str] = []
        self.listings = 0

    def generation(self) -> tuple[int, int] | None:
        return (1, self.gen)

    def list_table(self, family: str, name: str) -> list[JSONObject] | None:
        self.listings += 1
        objects = self.ruleset.get((family, name))
        return copy.deepcopy(objects) if objects is not None else None

    def tables(self) -> list[tuple[str, str]]:
        return sorted(self.ruleset)

    def add_rule(self, family: str, table: str, chain: str, expr: list[Any]) -> None:
        """Someone else's `nft add rule`."""
        body = {"family": family, "table": table, "chain": chain, "expr": expr}
        self.ruleset[(family, table)].append({"rule": body})
        self.gen += 1

    def run(self, script: str, *, json_input: bool = False) -> None:
        if self.fail_next is not None:
            message, self.fail_next = self.fail_next, None
            raise NftError(message)
        if not json_input:
            self._run_script(script)
            return
        data = json.loads(script)
        self.batches.append(data)
        staged = copy.deepcopy(self.ruleset)
        for command in data["nftables"]:
            ((verb, obj),) = command.items()
            ((kind, body),) = obj.items()
            key = (body["family"], body["table"] if kind != "table" else body["name"])
            if kind == "table" and verb == "add":
                staged.setdefault(key, [{"table": dict(body)}])
            elif kind == "table" and verb == "delete":
                staged.pop(key, None)
            else:
                staged[key].append({kind: dict(body)})
        self.ruleset = staged
        self.gen += 1

    def _run_script(self, script: str) -> None:
        """trueup's load script: `add table T; delete table T;` then the table, all or nothing."""
        lines = script.splitlines()
        head = "add table inet trueup"
        if lines[:2] != [head, "delete table inet trueup"]:
            raise NftError("the fake runs trueup's load scripts only")
        objects = self.scratch_list("\n".join(lines[2:]) + "\n", "inet", "trueup")
        self.scripts.append(script)
        self.ruleset[("inet", "trueup")] = objects
        self.gen += 1

    def scratch_list(self, script: str, family: str, name: str) -> list[JSONObject]:
        objects: list[JSONObject] = []
        errors: dict[int, str] = {}
        for number, line in enumerate(script.splitlines(), start=1):
            match = _SCRIPT_LINE.match(line)
            if match is None:
                errors[number] = "Error: syntax error"
                continue
            kind, fam, table, what, rest = match.groups()
            where = {"family": fam, "table": table}
            if kind == "table":
                objects.append({"table": {"family": fam, "name": table}})
            elif kind == "set":
                body = {**where, "name": what}
                for part in (rest or "").strip("{} ").split(";"):
                    key, _, value = part.strip().partition(" ")
                    if key == "type":
                        body["type"] = value
                    elif key == "flags":
                        body["flags"] = value.split(",")
                    elif key == "elements":
                        body["elem"] = sorted(e.strip() for e in value.strip("= {}").split(","))
                objects.append({"set": body})
            elif kind == "chain":
                body = {**where, "name": what}
                spec = re.match(
                    r"\{ type (\S+) hook (\S+) priority (\S+); policy (\S+); \}", rest or ""
                )
                if spec:
                    prio = spec.group(3)
                    body |= {"type": spec.group(1), "hook": spec.group(2),
                             "prio": int(prio) if prio.lstrip("-").isdigit() else prio,
                             "policy": spec.group(4)}  # fmt: skip
                objects.append({"chain": body})
            else:
                text = rest or ""
                if text in self.refuse:
                    errors[number] = self.refuse[text]
                    continue
                expr = self.canonical.get(text, [{"rule": text}])
                objects.append({"rule": {**where, "chain": what, "expr": copy.deepcopy(expr)}})
        if errors:
            raise NftError("\n".join(f"/dev/stdin:{n}:1-1: {m}" for n, m in errors.items()), errors)
        return [o for o in objects if next(iter(o.values())).get("family") == family]
