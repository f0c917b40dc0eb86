"""WireGuard (`spec.wireguard`): interfaces and peers, keys by secret reference.

What trueup owns: each interface the section names — the link (a kernel
WireGuard link, or a TUN device of a `wireguard-go` process that the agent
runs in the foreground under its daemon supervisor, run directory
`STATE_DIR/run/wg-NAME`, 0700), its private key, listen port and peers (set
with `wg syncconf` from a 0600 file removed at once), its addresses, MTU and
admin state (netlink). What it never owns: handshakes, sessions and the
counters, which are WireGuard's (reported in status).

Facts, per interface (`P = spec.wireguard.interfaces[NAME]`):

| path | desired | observed |
|---|---|---|
| `P.running` | true | `wg show NAME dump` answers (and the daemon runs, for wireguard-go) |
| `P.private_key` | `secret:REF` | `secret:REF` when the live key is the stored secret's value (digests compared), else `key PUBLIC` |
| `P.listen_port` | the port (when given) | the dump's |
| `P.link`, `P.addresses` | `{state: up, mtu}`, prefixes | netlink |
| `P.peers` | public keys | the dump's |
| `P.peers[KEY]` | endpoint (resolved), allowed IPs, keepalive, preshared key ref | the dump's (roaming below) |

No fact, step argument, status field or log line carries a key: the key
fact is a reference, the live key a digest or its public key.

**Roaming.** WireGuard moves a peer's endpoint to wherever authenticated
traffic comes from. trueup compares the live endpoint only with the one it
last set; a different live endpoint is accepted as a roam while the peer's
latest handshake is newer than that setting and younger than
`ROAM_FRESH` seconds (three minutes, past WireGuard's rekey interval): the
tunnel works, so trueup does not fight it. Once the roamed session goes
quiet, the endpoint is drift and is set back to the resolved one — once,
not in a loop, because a returning peer roams again only by talking.

Steps: `create` (kernel link or `wireguard-go`), `configure` (`wg
syncconf`), `set-link` (MTU, up, addresses), `remove`.
"""

from __future__ import annotations

import time
from typing import TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, StepError, Subsystem
from trueup.subsystems.wireguard.resolution import ResolutionJSON, ResolveFn, Resolver
from trueup.subsystems.wireguard.section import SECTION, WireguardSection
from trueup.subsystems.wireguard.state import (
    EndpointSet,
    InterfaceReport,
    conf_args,
    dump_report,
    key_fact,
    psk_fact,
    read_record,
    remove_record,
    secret_value,
    update_record,
)
from trueup.system.daemonspec import DaemonError
from trueup.system.netlink import NetlinkError
from trueup.system.requirements import Requirement
from trueup.system.resolve import resolve_endpoint
from trueup.system.watches import every, rtnetlink
from trueup.system.wireguard import (
    PeerConf,
    WgControl,
    WgError,
    daemon_name,
    daemon_spec,
    kernel_has_wireguard,
    render_conf,
)
from trueup.system.wireguard import requirements as wg_requirements

__all__ = ["ROAM_FRESH", "WireguardSection", "WireguardSubsystem"]

ROAM_FRESH = 180.0
_LINK_TIMEOUT = 10.0


class WireguardReport(TypedDict):
    """What status shows beside the facts: each interface, and the endpoint names' resolution."""

    interfaces: dict[str, InterfaceReport]
    resolution: dict[str, ResolutionJSON]


def _p(name: str, what: str) -> str:
    return f"spec.wireguard.interfaces[{name}].{what}"


def _iface_of(path: str) -> str:
    return path.split("[", 1)[1].split("]", 1)[0]


class WireguardSubsystem(Subsystem):
    name = "wireguard"
    tier = Tier.OPTIONAL
    depends_on = ("addresses",)
    section = SECTION
    # `wg set` sends no notification: look every 10 s; a deleted link or a killed
    # wireguard-go (its TUN device goes) is seen at once through rtnetlink.
    watches = (every(10.0), rtnetlink("link", "address"))

    def __init__(self, resolve: ResolveFn = resolve_endpoint, *, refresh: bool = True) -> None:
        self.resolver = Resolver(resolve, refresh=refresh)

    def requirements(self, document: DeviceState) -> list[Requirement]:
        section = document.spec.section("wireguard", WireguardSection)
        if section is None or not section.interfaces:
            return []
        return wg_requirements(kernel_wireguard=kernel_has_wireguard())

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("wireguard", WireguardSection) is not None

    @classmethod
    def scope_keys(cls, document: DeviceState) -> frozenset[str]:
        section = document.spec.section("wireguard", WireguardSection)
        return frozenset(i.name for i in section.interfaces) if section else frozenset()

    # -- preparation: endpoint names --------------------------------------------
    def prepare(self, document: DeviceState) -> None:
        section = document.spec.section("wireguard", WireguardSection)
        if section is None:
            return
        names = [
            (f"spec.wireguard.interfaces[{i}].peers[{j}].endpoint", str(peer.endpoint))
            for i, interface in enumerate(section.interfaces)
            for j, peer in enumerate(interface.peers)
            if peer.endpoint_host() is not None
        ]
        if names:
            self.resolver.prepare(names, section.resolve_interval, section.resolve_timeout)

    def _endpoint(self, configured: str | None) -> str | None:
        if configured is None:
            return None
        host = configured.rpartition(":")[0]
        if configured.startswith("[") or host.replace(".", "").isdigit():
            return configured
        return self.resolver.endpoint(configured) or f"unresolved {configured}"

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("wireguard", WireguardSection)
        interfaces = {i.name: i for i in (section.interfaces if section else [])}
        facts: Facts = {}
        for name in sorted(scope.keys_for(self.name) | set(interfaces)):
            interface = interfaces.get(name)
            if interface is None:
                facts[_p(name, "running")] = None
                continue
            facts[_p(name, "running")] = True
            facts[_p(name, "private_key")] = interface.private_key  # "secret:NAME"
            if interface.listen_port is not None:
                facts[_p(name, "listen_port")] = interface.listen_port
            facts[_p(name, "link")] = {"state": "up", "mtu": interface.mtu}
            facts[_p(name, "addresses")] = sorted(interface.addresses)
            facts[_p(name, "peers")] = sorted(p.public_key for p in interface.peers)
            for peer in interface.peers:
                facts[_p(name, f"peers[{peer.public_key}]")] = {
                    "endpoint": self._endpoint(peer.endpoint),
                    "endpoint_name": peer.endpoint,
                    "allowed_ips": sorted(peer.allowed_ips),
                    "persistent_keepalive": peer.persistent_keepalive,
                    "preshared_key": peer.preshared_key if peer.preshared_key else "none",
                }
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        facts: Facts = {}
        names = sorted(scope.keys_for(self.name))
        if not names:
            return facts
        # wireguard-go creates its TUN device outside this pass's netlink writes (and a
        # step may have run on another worker's handle): never trust a cached dump.
        forget = getattr(sources.netlink, "forget", None)
        if callable(forget):
            forget()
        links = {link.name: link for link in sources.netlink.links()}
        addresses: dict[str, list[str]] = {}
        for addr in sources.netlink.addresses():
            addresses.setdefault(addr.ifname, []).append(addr.prefix)
        wg = WgControl(sources.runner)
        for name in names:
            record = read_record(sources, name)
            dump = wg.show(name) if name in links else None
            userspace = record.get("mode") != "kernel"
            if dump is None or (userspace and not sources.daemons.running(daemon_name(name))):
                facts[_p(name, "running")] = None
                continue
            facts[_p(name, "running")] = True
            facts[_p(name, "private_key")] = key_fact(sources, record, dump)
            facts[_p(name, "listen_port")] = dump.listen_port
            link = links[name]
            facts[_p(name, "link")] = {"state": link.state, "mtu": link.mtu}
            facts[_p(name, "addresses")] = sorted(addresses.get(name, []))
            facts[_p(name, "peers")] = sorted(dump.peers)
            endpoints = record.get("endpoints", {})
            psks = record.get("psk", {})
            set_at = float(record.get("set_at", 0.0))
            now = time.time()
            for key, peer in dump.peers.items():
                last: EndpointSet | dict[str, None] = endpoints.get(key, {})
                endpoint = peer.endpoint
                roamed = (
                    last.get("endpoint")
                    and endpoint != last.get("endpoint")
                    and peer.latest_handshake >= int(set_at)
                    and now - peer.latest_handshake < ROAM_FRESH
                )
                if roamed:
                    endpoint = last.get("endpoint")  # a roam WireGuard made: accepted (module doc)
                facts[_p(name, f"peers[{key}]")] = {
                    "endpoint": endpoint,
                    "endpoint_name": last.get("name"),
                    "allowed_ips": sorted(peer.allowed_ips),
                    "persistent_keepalive": peer.keepalive,
                    "preshared_key": psk_fact(sources, psks.get(key), peer.preshared_digest),
                }
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        steps: list[Step] = []
        differing = {d.path for d in self.diff(desired, observed)}
        names = sorted({_iface_of(p) for p in desired if p.endswith(".running")})
        for name in names:
            running = _p(name, "running")
            if desired.get(running) is None:
                if observed.get(running):
                    steps.append(Step(self.name, "remove", running, {"name": name}))
                continue
            mine = {p for p in differing if _iface_of(p) == name}
            created = not observed.get(running)
            if created:
                steps.append(Step(self.name, "create", running, {"name": name}))
            config_paths = mine - {_p(name, "link"), _p(name, "addresses"), running}
            if created or config_paths:
                path = min(config_paths) if config_paths else _p(name, "private_key")
                steps.append(Step(self.name, "configure", path, dict(conf_args(name, desired))))
            if created or mine & {_p(name, "link"), _p(name, "addresses")}:
                link = desired.get(_p(name, "link")) or {}
                steps.append(
                    Step(
                        self.name,
                        "set-link",
                        _p(name, "link"),
                        {
                            "name": name,
                            "mtu": link.get("mtu"),
                            "addresses": list(desired.get(_p(name, "addresses")) or []),
                        },
                    )
                )
        return Plan(self.name, steps, [] if steps else ["WireGuard holds the document's tunnels"])

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        name = str(step.args["name"])
        try:
            if step.action == "create":
                self._create(sources, name)
            elif step.action == "configure":
                self._configure(sources, step)
            elif step.action == "set-link":
                self._set_link(sources, name, step.args.get("mtu"), step.args["addresses"])
            elif step.action == "remove":
                self._remove(sources, name)
            else:
                raise ValueError(f"unknown wireguard step {step.action}")
        except (WgError, DaemonError, NetlinkError, OSError) as exc:
            raise StepError(step, str(exc)) from exc

    def _create(self, sources: Sources, name: str) -> None:
        wg = WgControl(sources.runner)
        if wg.add_kernel_link(name):
            update_record(sources, name, {"mode": "kernel"})
        else:
            update_record(sources, name, {"mode": "userspace"})
            sources.daemons.ensure(daemon_spec(name))
        deadline = time.monotonic() + _LINK_TIMEOUT
        while True:
            if wg.show(name) is not None:
                return
            if time.monotonic() > deadline:
                status = sources.daemons.status(daemon_name(name))
                detail = f" ({status.last_error})" if status.last_error else ""
                raise WgError(
                    f"{name}: the interface did not appear within {_LINK_TIMEOUT:g}s{detail}"
                )
            time.sleep(0.05)

    def _configure(self, sources: Sources, step: Step) -> None:
        name = str(step.args["name"])
        ref = str(step.args["private_key"])
        private = secret_value(sources, step, ref, _p(name, "private_key"))
        peers: list[PeerConf] = []
        endpoints: dict[str, EndpointSet] = {}
        psks: dict[str, str] = {}
        for index, peer in enumerate(step.args["peers"]):
            endpoint = peer.get("endpoint")
            if endpoint is not None and endpoint.startswith("unresolved "):
                raise StepError(
                    step, f"peers[{index}]: {endpoint.removeprefix('unresolved ')} is not resolved"
                )
            psk = None
            if peer.get("preshared_key"):
                psk = secret_value(
                    sources, step, peer["preshared_key"], _p(name, f"peers[{index}].preshared_key")
                )
                psks[peer["public_key"]] = peer["preshared_key"]
            peers.append(
                PeerConf(
                    public_key=peer["public_key"],
                    preshared_key=psk,
                    endpoint=endpoint,
                    allowed_ips=tuple(peer["allowed_ips"]),
                    keepalive=int(peer["persistent_keepalive"]),
                )
            )
            endpoints[peer["public_key"]] = {
                "endpoint": endpoint,
                "name": peer.get("endpoint_name"),
            }
        conf = render_conf(private, step.args.get("listen_port"), peers)
        WgControl(sources.runner).syncconf(name, sources.daemons.run_dir(daemon_name(name)), conf)
        update_record(
            sources,
            name,
            {"private_key": ref, "psk": psks, "endpoints": endpoints, "set_at": time.time()},
        )

    def _set_link(self, sources: Sources, name: str, mtu: int | None, addresses: list[str]) -> None:
        net = sources.netlink
        net.set_link(name, mtu=mtu, state="up")
        have = {a.prefix for a in net.addresses() if a.ifname == name}
        want = set(addresses)
        for prefix in sorted(have - want):
            net.del_address(name, prefix)
        for prefix in sorted(want - have):
            net.add_address(name, prefix)

    def _remove(self, sources: Sources, name: str) -> None:
        record = read_record(sources, name)
        if record.get("mode") == "kernel":
            WgControl(sources.runner).delete_link(name)
        else:
            sources.daemons.stop(daemon_name(name))
        remove_record(sources, name)

    # -- status -------------------------------------------------------------------
    def report(self, sources: Sources, scope: Scope) -> WireguardReport:
        out: WireguardReport = {"interfaces": {}, "resolution": self.resolver.snapshot()}
        wg = WgControl(sources.runner)
        for name in sorted(scope.keys_for(self.name)):
            record = read_record(sources, name)
            dump = wg.show(name)
            entry: InterfaceReport = {"mode": record.get("mode"), "present": dump is not None}
            if record.get("mode") == "userspace":
                entry["daemon"] = sources.daemons.status(daemon_name(name)).to_json()
            if dump is not None:
                dump_report(dump, record, entry)
            out["interfaces"][name] = entry
        return out
