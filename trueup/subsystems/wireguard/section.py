"""`spec.wireguard`: what the document asks of WireGuard (pure data, validated; errors name the path).

```yaml
spec:
  wireguard:
    resolve_interval: 300s              # re-resolve endpoint names (also on failure)
    resolve_timeout: 5s                 # one lookup's bound (the deadline bounds them all)
    interfaces:
      - name: wg0
        private_key: {secret_ref: wg0-key}      # or "secret:wg0-key"; never a literal key
        listen_port: 51820
        addresses: [2001:db8:100::1/64, 192.0.2.129/25]
        mtu: 1420
        peers:
          - public_key: "base64..."
            endpoint: peer.example.test:51820   # HOST:PORT or [IPv6]:PORT
            allowed_ips: [192.0.2.128/25]
            persistent_keepalive: 25
            preshared_key: {secret_ref: wg0-psk}  # optional
```
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from trueup.model.document import refuse_duplicates  # path-carrying errors
from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import CrossCheck, OtherSections, Problem, Section

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec

__all__ = ["SECTION", "WgInterface", "WgPeerSection", "WireguardSection", "ref_name", "secret_name"]

_SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_PUBLIC_KEY = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw480]=\Z")
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}\Z")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\Z")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def secret_name(value: Any) -> str:
    """`{secret_ref: NAME}` or `"secret:NAME"` → `"secret:NAME"` (the canonical reference,
    which a stored revision re-parses to itself); anything else is refused."""
    name: Any = None
    if isinstance(value, dict) and set(value) == {"secret_ref"}:
        name = value["secret_ref"]
    elif isinstance(value, str) and value.startswith("secret:"):
        name = value.removeprefix("secret:")
    elif isinstance(value, str):
        raise ValueError(
            "a literal key is refused: give a secret reference ({secret_ref: NAME} or "
            '"secret:NAME") and store the key with `trueup secret set NAME` or in the '
            "control plane's secrets"
        )
    if not isinstance(name, str) or not _SECRET_NAME.match(name):
        raise ValueError(
            'expected a secret reference: {secret_ref: NAME} or "secret:NAME", NAME of '
            "A-Z a-z 0-9 . _ -"
        )
    return f"secret:{name}"


def ref_name(reference: str) -> str:
    """`"secret:NAME"` → NAME."""
    return reference.removeprefix("secret:")


def _duration(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if match is None:
            raise ValueError(f"{quoted(value)} is not a duration (300, 300s, 5m, 1h)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return seconds


def _public_key(value: str) -> str:
    if not _PUBLIC_KEY.match(value):
        raise ValueError(f"{quoted(value)} is not a WireGuard public key (44 characters of base64)")
    return value


def _prefix(value: str) -> str:
    try:
        return str(ipaddress.ip_interface(value))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 prefix") from exc


def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 network") from exc


def _endpoint(value: str) -> str:
    from trueup.system.resolve import split_endpoint

    host, port = split_endpoint(value.strip())
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})\Z", host) or ".." in host:
            raise ValueError(
                f"{quoted(value)}: {quoted(host)} is neither an address nor a host name"
            ) from None
        return f"{host.lower().rstrip('.')}:{port}"
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _ifname(value: str) -> str:
    if not _IFNAME.match(value):
        raise ValueError(f"{quoted(value)} is not an interface name (1-15 of A-Z a-z 0-9 _ . -)")
    return value


class _SecretRefInput(Checked):
    model_config = ConfigDict(extra="forbid")
    secret_ref: str


# Published in the schema as what may be written: `{secret_ref: NAME}` or `"secret:NAME"`.
SecretRef = Annotated[
    str,
    BeforeValidator(
        secret_name,
        json_schema_input_type=_SecretRefInput | Annotated[str, Field(pattern=r"^secret:")],
    ),
]
Seconds = Annotated[float, BeforeValidator(_duration), Field(gt=0, le=86400)]


class WgPeerSection(Checked):
    model_config = ConfigDict(extra="forbid")

    public_key: Annotated[str, AfterValidator(_public_key)]
    endpoint: Annotated[str, AfterValidator(_endpoint)] | None = None
    allowed_ips: list[Annotated[str, AfterValidator(_network)]] = Field(default_factory=list)
    persistent_keepalive: int = Field(0, ge=0, le=65535)
    preshared_key: SecretRef | None = None

    def endpoint_host(self) -> str | None:
        """The endpoint's host name when it is a name (to resolve), else None."""
        if self.endpoint is None or self.endpoint.startswith("["):
            return None
        host = self.endpoint.rpartition(":")[0]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return host
        return None


class WgInterface(Checked):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, AfterValidator(_ifname)]
    private_key: SecretRef
    listen_port: int | None = Field(None, ge=1, le=65535)
    addresses: list[Annotated[str, AfterValidator(_prefix)]] = Field(default_factory=list)
    mtu: int = Field(1420, ge=1280, le=65535)
    peers: list[WgPeerSection] = Field(default_factory=list)

    @check
    def _unique_peers(self) -> WgInterface:
        refuse_duplicates(
            [peer.public_key for peer in self.peers],
            lambda i: f"peers[{i}].public_key",
            lambda _key, first: f"the same peer as peers[{first}]",
        )
        return self


class WireguardSection(Checked):
    """`spec.wireguard`: WireGuard interfaces and their peers; keys by secret reference."""

    model_config = ConfigDict(extra="forbid")

    resolve_interval: Seconds = 300.0
    resolve_timeout: Seconds = 5.0
    interfaces: list[WgInterface] = Field(default_factory=list)

    @check
    def _unique_names(self) -> WireguardSection:
        refuse_duplicates(
            [interface.name for interface in self.interfaces],
            lambda i: f"interfaces[{i}].name",
            lambda name, first: f"{name} is also interfaces[{first}]",
        )
        return self

    def secret_names(self) -> set[str]:
        names = set()
        for interface in self.interfaces:
            names.add(ref_name(interface.private_key))
            names |= {ref_name(p.preshared_key) for p in interface.peers if p.preshared_key}
        return names


def _own_names(
    wireguard: WireguardSection, spec: DeviceSpec, others: OtherSections
) -> list[Problem]:
    """A WireGuard interface never takes the name of a link spec.management/interfaces own."""
    del others
    owned = {spec.management.interface: "spec.management.interface"}
    for i, link in enumerate(spec.interfaces):
        owned.setdefault(link.name, f"spec.interfaces[{i}].name")
    return [
        (
            f"wireguard.interfaces[{index}].name",
            f"{interface.name} is already {owned[interface.name]}; name the WireGuard "
            "interface differently",
        )
        for index, interface in enumerate(wireguard.interfaces)
        if interface.name in owned
    ]


SECTION = Section("wireguard", WireguardSection, checks=(CrossCheck(_own_names),))
