"""`spec.proxies`: HAProxy frontends and their backends (pure data, validated; errors name the path).

```yaml
spec:
  proxies:
    - name: web
      bind: 203.0.113.1:80              # ADDRESS:PORT, [V6]:PORT, or *:PORT
      mode: http                        # http | tcp
      tls: {certificate: /etc/trueup/tls/web.pem}   # optional: PEM with the key
      backend:
        balance: roundrobin             # roundrobin | leastconn | source | first
        servers:
          - {name: app1, address: 192.0.2.10:8080, check: true}
        health_check: {path: /healthz, interval: 2s}   # http: GET PATH; tcp: connect
      timeouts: {connect: 5s, client: 30s, server: 30s}
```

Whether a certificate file exists and is a PEM HAProxy accepts is checked
when the section is applied (`haproxy -c`), not here: the model is pure data.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    model_validator,
)

from trueup.model.document import _PathError, refuse_duplicates  # path-carrying errors
from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import CrossCheck, OtherSections, Problem, Section

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec
    from trueup.system.haproxy import ProxyConfig  # a type only: sections import no system module

__all__ = [
    "SECTION",
    "Backend",
    "HealthCheck",
    "Proxy",
    "ProxySection",
    "Server",
    "Timeouts",
    "Tls",
    "split_endpoint",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}\Z")
_FILE_PATH = re.compile(r"^/[A-Za-z0-9._+@%:=,/-]{1,4095}\Z")
_DURATION = re.compile(r"^(\d{1,7})(ms|s|m|h)?\Z")


def split_endpoint(value: str) -> tuple[str, int]:
    """`ADDRESS:PORT` / `[V6]:PORT` / `*:PORT` → (canonical address or "*", port)."""
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            raise ValueError(f"{quoted(value)} is not ADDRESS:PORT ([V6]:PORT for IPv6)")
        version = 6
    else:
        host, sep, port = value.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{quoted(value)} is not ADDRESS:PORT ([V6]:PORT for IPv6)")
        version = 4
    if host != "*":
        try:
            address = ipaddress.ip_address(host)
        except ValueError as exc:
            raise ValueError(f"{quoted(value)}: {quoted(host)} is not an IP address") from exc
        if address.version != version:
            raise ValueError(f"{quoted(value)}: write IPv6 addresses as [ADDRESS]:PORT")
        host = str(address)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{quoted(value)}: the port must be 1-65535")
    return host, int(port)


def _endpoint(value: str) -> str:
    host, port = split_endpoint(value)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _server_endpoint(value: str) -> str:
    text = _endpoint(value)
    if text.startswith("*"):
        raise ValueError(f"{quoted(value)}: a server needs an address, not *")
    return text


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{quoted(value)}: letters, digits, '_', '.', '-' (at most 63)")
    return value


def _duration(value: object) -> str:
    """`2s`, `500ms`, `1m`, `1h` or a number of milliseconds → HAProxy's spelling."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"{quoted(value)} is not a duration (500ms, 2s, 1m, 1h)")
    match = _DURATION.match(str(value).strip())
    if not match:
        raise ValueError(f"{quoted(value)} is not a duration (500ms, 2s, 1m, 1h)")
    number, unit = match.groups()
    if int(number) == 0:
        raise ValueError(f"{quoted(value)}: must be more than zero")
    return f"{int(number)}{unit or 'ms'}"


Name = Annotated[str, AfterValidator(_name)]
Duration = Annotated[str, BeforeValidator(_duration)]


class Tls(Checked):
    model_config = ConfigDict(extra="forbid")

    certificate: str = Field(min_length=2, description="absolute path of a PEM with the key")

    @check
    def _absolute(self) -> Tls:
        if not _FILE_PATH.match(self.certificate):
            raise _PathError(
                "certificate",
                f"{quoted(self.certificate[:80])}: an absolute path of at most 4096 of "
                "A-Z a-z 0-9 / . _ + @ % : = , -",
            )
        return self


class Server(Checked):
    model_config = ConfigDict(extra="forbid")

    name: Name
    address: Annotated[str, AfterValidator(_server_endpoint)]
    check: bool = True
    weight: int = Field(default=1, ge=0, le=256)


class HealthCheck(Checked):
    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        default=None, pattern=r"^/[A-Za-z0-9._~!&()*+,;=:@%/?-]{0,1023}$", max_length=1024
    )
    interval: Duration = "2s"


class Backend(Checked):
    model_config = ConfigDict(extra="forbid")

    balance: Literal["roundrobin", "leastconn", "source", "first"] = "roundrobin"
    servers: list[Server] = Field(min_length=1)
    health_check: HealthCheck | None = None

    @check
    def _unique(self) -> Backend:
        refuse_duplicates(
            [server.name for server in self.servers],
            lambda i: f"servers[{i}].name",
            lambda name, first: f"duplicate server name {name} (also servers[{first}])",
        )
        return self


class Timeouts(Checked):
    model_config = ConfigDict(extra="forbid")

    connect: Duration = "5s"
    client: Duration = "30s"
    server: Duration = "30s"


class Proxy(Checked):
    """One frontend and its backend."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    bind: Annotated[str, AfterValidator(_endpoint)]
    mode: Literal["http", "tcp"] = "http"
    tls: Tls | None = None
    backend: Backend
    timeouts: Timeouts = Timeouts()

    @check
    def _check_fits_mode(self) -> Proxy:
        check = self.backend.health_check
        if self.mode == "tcp" and check is not None and check.path is not None:
            raise _PathError("backend.health_check.path", "tcp mode checks connect only: no path")
        return self

    @property
    def address(self) -> str:
        """The bind address (canonical; "*" for every address)."""
        return split_endpoint(self.bind)[0]

    @property
    def port(self) -> int:
        return split_endpoint(self.bind)[1]


class ProxySection(RootModel[list[Proxy]]):
    """`spec.proxies`: a list of frontends, names and bind endpoints unique."""

    root: list[Proxy]

    # One field (the list): nothing for a partial check to keep, pydantic's own order holds.
    @model_validator(mode="after")
    def _unique(self) -> ProxySection:
        problems: list[tuple[str, str]] = []
        names: dict[str, int] = {}
        binds: dict[tuple[str, int], int] = {}
        for index, proxy in enumerate(self.root):
            if proxy.name in names:
                problems.append(
                    (
                        f"[{index}].name",
                        f"duplicate proxy name {proxy.name} (also [{names[proxy.name]}])",
                    )
                )
            names.setdefault(proxy.name, index)
            key = (proxy.address, proxy.port)
            clash = binds.get(key)
            if clash is None:
                # A wildcard bind takes the port on every address of its family.
                wildcard = next(
                    (i for (a, p), i in binds.items() if p == proxy.port and "*" in (a, key[0])),
                    None,
                )
                clash = wildcard
            if clash is not None:
                problems.append(
                    (
                        f"[{index}].bind",
                        f"{proxy.bind} is also bound by [{clash}] ({self.root[clash].name})",
                    )
                )
            binds.setdefault(key, index)
        if problems:
            raise _PathError.many(problems)
        return self

    def canonical(self) -> list[ProxyConfig]:
        """The section as canonical JSON (defaults filled in, keys sorted), sorted by name.

        Keys are sorted so that the value compares equal however it was stored
        (facts are compared as text, and state files sort their keys)."""
        entries = sorted((p.model_dump(mode="json") for p in self.root), key=lambda p: p["name"])
        result: list[ProxyConfig] = json.loads(json.dumps(entries, sort_keys=True))
        return result


def _keeps_api_port(
    proxies: ProxySection, spec: DeviceSpec, others: OtherSections
) -> list[Problem]:
    """A frontend never takes the management API's address:port (the way in stays open)."""
    del others
    api_port = spec.management.api.port
    api_bind = spec.api_bind_address()
    problems: list[Problem] = []
    for index, proxy in enumerate(proxies.root):
        if proxy.port != api_port:
            continue
        if api_bind is None or proxy.address == "*" or proxy.address == api_bind:
            problems.append(
                (
                    f"proxies[{index}].bind",
                    f"{proxy.bind} takes the management API's port {api_port} "
                    f"(spec.management.api); use another port",
                )
            )
    return problems


SECTION = Section("proxies", ProxySection, checks=(CrossCheck(_keeps_api_port),))
