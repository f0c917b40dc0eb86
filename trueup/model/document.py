"""The desired-state document (`apiVersion: trueup/v1`, `kind: DeviceState`).

Pure data: parsing, validation and the JSON Schema. The core sections are
fields of `DeviceSpec`; every other section (sysctl, firewall, dhcp, …) is
owned by its subsystem: a model in the subsystem's module, registered in
`trueup.model.sections` when the subsystem is registered. A section nobody
registered is refused with its path. `DeviceSpec.section(name)` returns a
registered section's validated model (or None when the document has none).

Errors come out as `DocumentError`, one line per problem, each naming the path
in the document (`spec.interfaces[1].addresses[0]: not an IPv4/IPv6 prefix`).

Why this module is over 400 lines: the whole trueup/v1 document with its
cross-section checks and the path-naming error formatter; the checks need
every core section in view.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trueup.model.decode import DecodeError, decode_json, decode_yaml
from trueup.model.digests import json_digest
from trueup.model.jsontypes import JSONObject
from trueup.model.limits import DOCUMENT_BYTES, PROBLEM_CHARS, input_excerpt, quoted
from trueup.model.problems import Checked, PathError, check, describe
from trueup.model.sections import cross_problems, registered_sections, section_model
from trueup.model.types import IfName, IpAddress, IpNetwork, IpPrefix, family_of

__all__ = [
    "API_VERSION",
    "SUPPORTED_API_VERSIONS",
    "ApiListener",
    "ConvergencePolicy",
    "DeviceSpec",
    "DeviceState",
    "DocumentError",
    "Interface",
    "Management",
    "Metadata",
    "Route",
    "document_digest",
    "json_schema",
    "load_document",
    "parse_document",
    "refuse_duplicates",
    "route_table_number",
    "supported_sections",
]

_M = TypeVar("_M", bound=BaseModel)

API_VERSION = "trueup/v1"
SUPPORTED_API_VERSIONS = (API_VERSION,)
KIND = "DeviceState"

MAIN_TABLE = 254
_RESERVED_TABLES = {0: "unspec", 253: "default", 255: "local"}

Policy = Literal["auto", "notify"]


_MAX_PROBLEMS = 50


class DocumentError(ValueError):
    """A document that cannot be accepted. `problems` holds one `path: message` per line."""

    def __init__(self, source: str, problems: list[str], *, unsupported_version: bool = False):
        self.source = source
        # Never cut: each message quotes at most an excerpt of the input where it quotes it.
        problems = [input_excerpt(p, PROBLEM_CHARS) for p in problems[:_MAX_PROBLEMS]] + (
            [f"… and {len(problems) - _MAX_PROBLEMS} more problems"]
            if len(problems) > _MAX_PROBLEMS
            else []
        )
        self.problems = problems
        self.unsupported_version = unsupported_version
        super().__init__(f"{source}: invalid document\n" + "\n".join(f"  {p}" for p in problems))


class _Section(Checked):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApiListener(_Section):
    port: int = Field(7443, ge=1, le=65535, description="TCP port of the agent API")
    bind: IpAddress | Literal["management"] | None = Field(
        None,
        description=(
            "address to bind; 'management' binds the first management address (never an "
            "incidental address such as an HA virtual address); the wildcard when absent"
        ),
    )


class Management(_Section):
    interface: IfName
    addresses: list[IpPrefix] = Field(min_length=1)
    gateway: IpAddress | None = None
    api: ApiListener = ApiListener()

    @check
    def _gateway_family(self) -> Management:
        if self.gateway is not None:
            families = {family_of(a) for a in self.addresses}
            if family_of(self.gateway) not in families:
                raise _PathError(
                    "gateway",
                    f"IPv{family_of(self.gateway)} gateway {self.gateway} but the management "
                    "interface has no address of that family",
                )
        return self


class Interface(_Section):
    name: IfName
    state: Literal["up", "down"] = "up"
    mtu: int | None = Field(None, ge=68, le=65535)
    addresses: list[IpPrefix] = []


class Route(_Section):
    to: IpNetwork
    via: IpAddress | None = None
    dev: IfName | None = None
    metric: int = Field(0, ge=0, le=4294967295)
    table: int | str = Field("main", description="'main', a number, or a name from spec.tables")

    @check
    def _consistent(self) -> Route:
        if self.via is None and self.dev is None:
            raise _PathError("via", "a route needs a gateway (via) or an interface (dev)")
        if self.via is not None and family_of(self.via) != family_of(self.to):
            raise _PathError(
                "via",
                f"IPv{family_of(self.via)} gateway for an IPv{family_of(self.to)} "
                f"destination {self.to}",
            )
        return self


DEFAULT_DEADLINE_SECONDS = 90.0


class ConvergencePolicy(_Section):
    default: Policy = "auto"
    subsystems: dict[str, Policy] = {}
    deadlines: dict[str, float] = Field(
        {},
        description=(
            "seconds a subsystem's work (preparation included) may take; key 'default' "
            f"sets the rest (default {DEFAULT_DEADLINE_SECONDS:g})"
        ),
    )

    def policy_for(self, subsystem: str) -> Policy:
        return self.subsystems.get(subsystem, self.default)

    def deadline_for(self, subsystem: str) -> float:
        return self.deadlines.get(
            subsystem, self.deadlines.get("default", DEFAULT_DEADLINE_SECONDS)
        )

    @check
    def _positive_deadlines(self) -> ConvergencePolicy:
        for name, seconds in self.deadlines.items():
            if not 0 < seconds <= 86400:
                raise _PathError(f"deadlines.{name}", "expected seconds between 0 and 86400")
        return self


class DeviceSpec(_Section):
    # Sections registered by subsystems arrive as extra fields, validated below.
    model_config = ConfigDict(extra="allow", frozen=True)

    management: Management
    interfaces: list[Interface] = []
    routes: list[Route] = []
    tables: dict[str, int] = Field(
        {}, description="names for numbered routing tables, usable as route.table"
    )
    convergence: ConvergencePolicy = ConvergencePolicy()

    @model_validator(mode="before")
    @classmethod
    def _registered_sections(cls, data: Any) -> Any:
        """Validate each registered section with its owner's model; refuse the rest."""
        if not isinstance(data, dict):
            return data
        return _validate_sections(data, set(cls.model_fields))

    @overload
    def section(self, name: str) -> Any: ...

    @overload
    def section(self, name: str, model: type[_M]) -> _M | None: ...

    def section(self, name: str, model: type[BaseModel] | None = None) -> Any:
        """A registered section's validated model, or None when the document has none.

        With `model`, typed (and checked): `spec.section("sysctl", SysctlSection)`.
        """
        value = (self.model_extra or {}).get(name)
        if model is not None and value is not None and not isinstance(value, model):
            raise TypeError(f"spec.{name} is a {type(value).__name__}, not {model.__name__}")
        return value

    @check
    def _table_names(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        for name, number in self.tables.items():
            if name == "main" or not 1 <= number <= 4294967295 or number in _RESERVED_TABLES:
                problems.append((f"tables.{name}", "not a usable routing table (1-252, 256-…)"))
            elif number == MAIN_TABLE:
                problems.append((f"tables.{name}", "254 is the main table; use table: main"))
        return problems

    def _interface_names(self) -> dict[str, str]:
        """Managed interface name → the path naming it first."""
        seen_names: dict[str, str] = {self.management.interface: "spec.management.interface"}
        for i, iface in enumerate(self.interfaces):
            seen_names.setdefault(iface.name, f"spec.interfaces[{i}].name")
        return seen_names

    @check
    def _unique_interfaces(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        seen_names: dict[str, str] = {self.management.interface: "spec.management.interface"}
        seen_addresses: dict[str, str] = {
            a.split("/")[0]: f"spec.management.addresses[{i}]"
            for i, a in enumerate(self.management.addresses)
        }
        for i, iface in enumerate(self.interfaces):
            if iface.name in seen_names:
                problems.append(
                    (
                        f"interfaces[{i}].name",
                        f"duplicate interface name {iface.name} (also {seen_names[iface.name]})",
                    )
                )
            seen_names.setdefault(iface.name, f"spec.interfaces[{i}].name")
            for j, address in enumerate(iface.addresses):
                host = address.split("/")[0]
                if host in seen_addresses:
                    problems.append(
                        (
                            f"interfaces[{i}].addresses[{j}]",
                            f"duplicate address {host} (also {seen_addresses[host]})",
                        )
                    )
                seen_addresses.setdefault(host, f"spec.interfaces[{i}].addresses[{j}]")
        return problems

    @check
    def _routes_fit(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        route_keys: dict[tuple[int, str, int], str] = {}
        for i, route in enumerate(self.routes):
            if isinstance(route.table, str) and route.table != "main":
                if route.table.isdigit():
                    pass
                elif route.table not in self.tables:
                    problems.append(
                        (
                            f"routes[{i}].table",
                            f"unknown table {quoted(route.table)}; name it in tables",
                        )
                    )
                    continue
            table = self.table_number(route.table)
            if table in _RESERVED_TABLES:
                problems.append((f"routes[{i}].table", f"table {table} is reserved"))
                continue
            key = (table, route.to, route.metric)
            if key in route_keys:
                problems.append(
                    (
                        f"routes[{i}]",
                        f"duplicate route to {route.to} metric {route.metric} "
                        f"in table {route.table} (also {route_keys[key]})",
                    )
                )
            route_keys.setdefault(key, f"spec.routes[{i}]")
            gw = self.management.gateway
            if (
                gw is not None
                and table == MAIN_TABLE
                and route.metric == 0
                and route.to in ("0.0.0.0/0", "::/0")
                and family_of(route.to) == family_of(gw)
                and (route.via != gw or route.dev not in (None, self.management.interface))
            ):
                problems.append(
                    (
                        f"routes[{i}]",
                        f"conflicts with spec.management.gateway {gw}: the management "
                        "default route is owned by spec.management",
                    )
                )
        return problems

    @check
    def _route_devices(self) -> list[tuple[str, str]]:
        names = self._interface_names()  # needs the interfaces: left out when they failed
        return [
            (
                f"routes[{i}].dev",
                f"{route.dev} is not a managed interface "
                "(name it in spec.interfaces or spec.management)",
            )
            for i, route in enumerate(self.routes)
            if route.dev is not None and route.dev not in names
        ]

    @check
    def _sections_fit(self) -> list[tuple[str, str]]:
        # Each registered section's declared checks against the rest of the document
        # (`trueup.model.sections.CrossCheck`: (path below spec, message) pairs).
        return cross_problems(self)

    def table_number(self, table: int | str) -> int:
        return route_table_number(table, self.tables)

    def api_bind_address(self) -> str | None:
        """The address the management API binds, if one is named."""
        bind = self.management.api.bind
        if bind == "management":
            return self.management.addresses[0].split("/")[0]
        return bind

    def managed_interfaces(self) -> list[str]:
        return [self.management.interface, *(i.name for i in self.interfaces)]


class Metadata(_Section):
    device: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    version: int | None = Field(None, ge=1, description="assigned by the control plane; grows")


class DeviceState(_Section):
    apiVersion: Literal["trueup/v1"]
    kind: Literal["DeviceState"]
    metadata: Metadata
    spec: DeviceSpec

    def with_version(self, version: int) -> DeviceState:
        return self.model_copy(
            update={"metadata": self.metadata.model_copy(update={"version": version})}
        )

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def _validate_sections(data: dict[str, Any], core: set[str]) -> dict[str, Any]:
    """`data` with registered sections validated by their models; `_PathError` for the rest."""
    problems: list[tuple[str, str]] = []
    out = dict(data)
    for key, value in data.items():
        if key in core:
            continue
        model = section_model(str(key))
        if model is None:
            known = ", ".join(sorted([*core, *registered_sections()]))
            problems.append((str(key), f"unknown field (not part of trueup/v1; sections: {known})"))
            continue
        try:
            out[key] = model.model_validate(value)
        except ValidationError as exc:
            for problem in _problems(exc):
                path, _, message = problem.partition(": ")
                if not path or path.startswith("("):
                    problems.append((str(key), message))
                elif path.startswith("["):
                    problems.append((f"{key}{path}", message))
                else:
                    problems.append((f"{key}.{path}", message))
    if problems:
        raise _PathError.many(problems)
    return out


def route_table_number(table: int | str, names: dict[str, int]) -> int:
    if isinstance(table, int):
        return table
    if table == "main":
        return MAIN_TABLE
    if table.isdigit():
        return int(table)
    return names[table]


# The path-carrying error section validators raise (kept under its old name for them).
_PathError = PathError


def refuse_duplicates(
    keys: list[str], path: Callable[[int], str], say: Callable[[str, int], str]
) -> None:
    """Raise a path error for every key that repeats an earlier one: `path(index)` names
    the repeat, `say(key, first_index)` says what it repeats. Section validators use it."""
    seen: dict[str, int] = {}
    problems = []
    for index, key in enumerate(keys):
        if key in seen:
            problems.append((path(index), say(key, seen[key])))
        seen.setdefault(key, index)
    if problems:
        raise _PathError.many(problems)


def _api_version(item: dict[str, Any]) -> str | None:
    if item["type"] == "literal_error" and tuple(item["loc"]) == ("apiVersion",):
        return f"unsupported apiVersion {quoted(item['input'])}; this agent supports " + ", ".join(
            SUPPORTED_API_VERSIONS
        )
    return None


def _problems(error: ValidationError) -> list[str]:
    return [f"{path}: {message}" for path, message in describe(error, _api_version)]


def parse_document(data: Any, source: str = "<document>") -> DeviceState:
    """Validate already-decoded data; raise DocumentError listing every problem with its path."""
    if not isinstance(data, dict):
        raise DocumentError(source, ["(document): expected a mapping with apiVersion, kind, …"])
    spec = data.get("spec")
    sections = (
        {k: v for k, v in spec.items() if k not in DeviceSpec.model_fields}
        if isinstance(spec, dict)
        else {}
    )
    problems: list[str] = []
    if sections:
        # Core fields and sections are checked apart, so every problem is reported at once.
        assert isinstance(spec, dict)
        core = {**data, "spec": {k: v for k, v in spec.items() if k not in sections}}
        try:
            _validate_sections(sections, set(DeviceSpec.model_fields))
        except _PathError as exc:
            problems += [f"spec.{path}: {message}" for path, message in exc.problems]
    else:
        core = data
    try:
        document = DeviceState.model_validate(core)
    except ValidationError as exc:
        problems = _problems(exc) + problems
    if not problems and sections:
        try:
            document = DeviceState.model_validate(data)
        except ValidationError as exc:  # a section's cross-check against the rest of spec
            problems = _problems(exc)
    if problems:
        unsupported = any(p.startswith("apiVersion: unsupported") for p in problems)
        raise DocumentError(source, problems, unsupported_version=unsupported) from None
    return document


def decode_text(text: str, source: str) -> Any:
    """JSON or YAML text decoded within the limits of `trueup.model.decode` (size, depth,
    no YAML aliases)."""
    try:
        if source.endswith(".json") or text.lstrip().startswith("{"):
            return decode_json(text)
        return decode_yaml(text)
    except DecodeError as exc:
        message = str(exc)
        for prefix in ("not valid YAML: ", "not valid JSON: "):
            message = message.replace(prefix, "not valid YAML or JSON: ", 1)
        raise DocumentError(source, [f"(document): {message}"]) from None


def load_document(path: str | Path) -> DeviceState:
    source = str(path)
    try:
        with open(path, "rb") as stream:
            raw = stream.read(DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise DocumentError(source, [f"(file): cannot read: {exc.strerror}"]) from None
    if len(raw) > DOCUMENT_BYTES:
        raise DocumentError(source, [f"(file): larger than {DOCUMENT_BYTES} bytes"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(source, [f"(file): not UTF-8 text (byte {exc.start})"]) from None
    return parse_document(decode_text(text, source), source)


def supported_sections() -> list[str]:
    """Every section of `spec` this trueup accepts: the core ones and every registered one
    (the catalog's subsystems and loaded plugins), sorted."""
    return sorted({*DeviceSpec.model_fields, *registered_sections()})


def document_digest(document: DeviceState) -> str:
    """Content hash of a document, independent of key order and of metadata.version."""
    body = document.canonical()
    body["metadata"].pop("version", None)
    return json_digest(body)


def json_schema() -> JSONObject:
    schema = DeviceState.model_json_schema()
    defs = schema.setdefault("$defs", {})
    spec = defs["DeviceSpec"]
    spec["additionalProperties"] = False
    for name, model in sorted(registered_sections().items()):
        section = model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(section.pop("$defs", {}))
        spec.setdefault("properties", {})[name] = section
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://trueup.invalid/schema/trueup-v1.json"
    schema["title"] = "trueup DeviceState (trueup/v1)"
    return schema
