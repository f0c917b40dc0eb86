"""Profiles: a partial device document, a schema of typed variables and a selector.

    apiVersion: trueup/v1
    kind: Profile
    metadata: {name: edge-ams, priority: 200, description: "edge routers in Amsterdam"}
    spec:
      selector: "site=ams,role=edge"          # "" selects every device
      variables:
        lan_address: {type: ipv4-prefix, required: true}
        lan_mtu: {type: integer, minimum: 1280, maximum: 9000, default: 1500}
      document:                               # same section names as a device's spec
        interfaces:
          - {name: lan0, mtu: "${lan_mtu}", addresses: ["${lan_address}"]}

`parse_profile` checks everything that can be checked without a device: the
fields, the selector, each variable declaration (a default must fit its own
type), the sections the document names, every `${…}` (well formed, declared by
this profile, never in a key) and the merge markers. It raises `ProfileError`
with every problem, each naming its path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypedDict

from trueup.model.digests import json_digest
from trueup.model.document import API_VERSION, DocumentError, decode_text, supported_sections
from trueup.model.jsontypes import JSONObject
from trueup.model.layering.merge import check_layer, is_plain
from trueup.model.layering.selectors import Selector, SelectorError, parse_selector
from trueup.model.layering.substitute import Compiled, compile_document
from trueup.model.layering.variables import Variable, VariableJSON, parse_variable
from trueup.model.limits import DOCUMENT_BYTES

__all__ = ["PROFILE_KIND", "Profile", "ProfileError", "load_profile_text", "parse_profile"]

PROFILE_KIND = "Profile"
DEFAULT_PRIORITY = 100
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_PRIORITY_RANGE = (0, 1_000_000)
_MAX_DESCRIPTION = 4096
_MAX_VARIABLES = 256


class ProfileError(ValueError):
    """A profile that cannot be accepted: `problems` holds one `path: message` each."""

    def __init__(self, problems: list[str], source: str = "profile") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: invalid profile\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class Profile:
    """A parsed profile. `version` is assigned by storage (0 until stored)."""

    name: str
    priority: int
    description: str
    selector: Selector
    variables: Mapping[str, Variable]
    document: Mapping[str, Any]
    version: int = 0
    _compiled: dict[str, Compiled] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def as_json(self) -> ProfileJSON:
        """The profile as a document (what `parse_profile` reads back to an equal profile)."""
        metadata: ProfileMetadataJSON = {"name": self.name, "priority": self.priority}
        if self.description:
            metadata["description"] = self.description
        return {
            "apiVersion": API_VERSION,
            "kind": PROFILE_KIND,
            "metadata": metadata,
            "spec": {
                "selector": self.selector.text,
                "variables": {n: v.as_json() for n, v in sorted(self.variables.items())},
                "document": copy.deepcopy(dict(self.document)),
            },
        }

    @cached_property
    def digest(self) -> str:
        """Content hash of the profile (its version aside)."""
        return json_digest(self.as_json())

    @property
    def compiled(self) -> Compiled:
        """The document compiled for substitution (once per profile)."""
        compiled = self._compiled.get("document")
        if compiled is None:
            compiled = compile_document(self.document, "spec.document")
            self._compiled["document"] = compiled
        return compiled

    @cached_property
    def plain(self) -> bool:
        """No merge marker nor aliased field in the document (substitution adds none)."""
        return is_plain(self.document)

    def with_version(self, version: int) -> Profile:
        return Profile(
            name=self.name,
            priority=self.priority,
            description=self.description,
            selector=self.selector,
            variables=self.variables,
            document=self.document,
            version=version,
        )


def parse_profile(data: Any, *, source: str = "profile", version: int = 0) -> Profile:
    """Validate a decoded profile document; ProfileError lists every problem with its path."""
    if not isinstance(data, Mapping):
        raise ProfileError(["(document): expected a mapping with apiVersion, kind, …"], source)
    problems: list[str] = []
    for key in data:
        if key not in ("apiVersion", "kind", "metadata", "spec"):
            problems.append(f"{key}: unknown field; expected apiVersion, kind, metadata, spec")
    if data.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION}")
    if data.get("kind") != PROFILE_KIND:
        problems.append(f"kind: expected {PROFILE_KIND}")
    name, priority, description = _metadata(data.get("metadata"), problems)
    spec = data.get("spec")
    if not isinstance(spec, Mapping):
        problems.append("spec: expected a mapping with selector, variables, document")
        spec = {}
    for key in spec:
        if key not in ("selector", "variables", "document"):
            problems.append(f"spec.{key}: unknown field; expected selector, variables, document")
    selector = _selector(spec.get("selector", ""), problems)
    variables = _variables(spec.get("variables", {}), problems)
    document = spec.get("document", {})
    if not isinstance(document, Mapping):
        problems.append("spec.document: expected a mapping of spec sections")
        document = {}
    sections = set(supported_sections())
    for key in document:
        if key not in sections:
            problems.append(
                f"spec.document.{key}: not a section of a device's spec "
                f"(sections: {', '.join(sorted(sections))})"
            )
    problems += [f"spec.document.{p}: {m}" for p, m in check_layer(document)]
    compiled = compile_document(document, "spec.document")
    problems += [f"{p}: {m}" for p, m in compiled.problems]
    # A name declared with a problem is reported at its declaration, not as unknown here.
    raw = spec.get("variables", {})
    declared = {str(n) for n in raw} if isinstance(raw, Mapping) else set()
    for where, names in sorted(compiled.templates.items()):
        for ref in names:
            if variables is not None and ref not in variables and ref not in declared:
                problems.append(
                    f"{where}: unknown variable ${{{ref}}}; declare it in spec.variables.{ref}"
                )
    if problems or selector is None or variables is None or name is None:
        raise ProfileError(problems, source)
    profile = Profile(
        name=name,
        priority=priority,
        description=description,
        selector=selector,
        variables=variables,
        document=dict(document),
        version=version,
    )
    profile._compiled["document"] = compiled
    return profile


def load_profile_text(text: str, *, source: str = "profile") -> Profile:
    """A profile from YAML or JSON text (`trueup fleet profile create FILE`), decoded within
    the document limits (size, depth, no YAML aliases)."""
    if len(text.encode()) > DOCUMENT_BYTES:
        raise ProfileError([f"(file): larger than {DOCUMENT_BYTES} bytes"], source)
    try:
        data = decode_text(text, source)
    except DocumentError as exc:
        raise ProfileError(exc.problems, source) from None
    return parse_profile(data, source=source)


def _metadata(metadata: Any, problems: list[str]) -> tuple[str | None, int, str]:
    if not isinstance(metadata, Mapping):
        problems.append("metadata: expected a mapping with name (and priority, description)")
        return None, DEFAULT_PRIORITY, ""
    for key in metadata:
        if key not in ("name", "priority", "description"):
            problems.append(f"metadata.{key}: unknown field; expected name, priority, description")
    name = metadata.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(
            "metadata.name: expected a DNS label (1-63 lower-case letters, digits, '-'; "
            "a letter or digit at each end)"
        )
        name = None
    priority = metadata.get("priority", DEFAULT_PRIORITY)
    low, high = _PRIORITY_RANGE
    if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
        problems.append(
            f"metadata.priority: expected an integer {low}-{high:,} (lower is applied first)"
        )
        priority = DEFAULT_PRIORITY
    description = metadata.get("description", "")
    if not isinstance(description, str) or len(description) > _MAX_DESCRIPTION:
        problems.append(f"metadata.description: expected text (≤ {_MAX_DESCRIPTION} characters)")
        description = ""
    return name, priority, description


def _selector(text: Any, problems: list[str]) -> Selector | None:
    if not isinstance(text, str):
        problems.append('spec.selector: expected a selector as text ("" selects every device)')
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        problems.append(f"spec.selector: {exc}")
        return None


def _variables(data: Any, problems: list[str]) -> dict[str, Variable] | None:
    if not isinstance(data, Mapping):
        problems.append("spec.variables: expected a mapping of NAME: {type: …}")
        return None
    if len(data) > _MAX_VARIABLES:
        problems.append(f"spec.variables: at most {_MAX_VARIABLES} variables")
        return None
    out: dict[str, Variable] = {}
    for name, declaration in data.items():
        variable, found = parse_variable(str(name), declaration)
        problems += [f"spec.variables.{name}{suffix}: {message}" for suffix, message in found]
        if variable is not None:
            out[str(name)] = variable
    return out


class _ProfileName(TypedDict):
    name: str
    priority: int


class ProfileMetadataJSON(_ProfileName, total=False):
    description: str


class ProfileSpecJSON(TypedDict):
    selector: str
    variables: dict[str, VariableJSON]
    # The document layer: a desired-state document fragment, validated once rendered.
    document: JSONObject


class ProfileJSON(TypedDict):
    apiVersion: str
    kind: str
    metadata: ProfileMetadataJSON
    spec: ProfileSpecJSON
