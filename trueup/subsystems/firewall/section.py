"""`spec.firewall`: the ruleset of the one nftables table trueup owns (`inet trueup`).

```yaml
spec:
  firewall:
    sets:
      - {name: admins, type: ipv4_addr, flags: [interval], elements: [192.0.2.0/24]}
    chains:
      - name: input
        type: filter
        hook: input
        priority: 0
        policy: drop
        rules:
          - ct state established,related accept
          - iifname "mgmt0" tcp dport 7443 accept
          - ip saddr @admins tcp dport 22 accept
```

Rules are nft syntax, one rule per entry. What is checked here is only what
keeps a rule a single rule of trueup's table (one line, no `;`, within a
length); whether nft accepts it is decided by nft itself when the document is
planned (`trueup.subsystems.firewall`), and a refusal names the rule's path.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field

from trueup.model.document import _PathError  # the document's path-carrying error
from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import Section

__all__ = ["SECTION", "Chain", "FirewallSection", "NftSet", "rule_path"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
_PRIORITY_NAMES = {"raw", "mangle", "dstnat", "filter", "security", "srcnat"}
_MAX_RULE = 4096


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{quoted(value)} is not an nft name (letters, digits, _ and -; up to 64)")
    return value


def _rule(value: str) -> str:
    text = " ".join(value.split())
    if not text:
        raise ValueError("empty rule")
    if "\n" in value or "\r" in value or ";" in value:
        raise ValueError("a rule is one line without ';' (one list entry per rule)")
    if len(text) > _MAX_RULE:
        raise ValueError(f"rule longer than {_MAX_RULE} characters")
    return text


def _priority(value: int | str) -> int | str:
    if isinstance(value, int):
        if not -2147483648 <= value <= 2147483647:
            raise ValueError("priority out of range")
        return value
    text = " ".join(value.split())
    base, _, offset = text.partition(" ")
    if base not in _PRIORITY_NAMES or (offset and not re.fullmatch(r"[+-] ?\d{1,9}", offset)):
        raise ValueError(
            f"{quoted(value)} is not a priority: a number or one of {sorted(_PRIORITY_NAMES)} "
            "optionally followed by + or - a number"
        )
    return text


def _element(value: str | int) -> str:
    text = " ".join(str(value).split())
    if not text or any(c in text for c in ";{}\n"):
        raise ValueError(f"{quoted(value)} is not a set element")
    return text


Name = Annotated[str, AfterValidator(_name)]
Element = Annotated[str | int, AfterValidator(_element)]


class _Model(Checked):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NftSet(_Model):
    name: Name
    type: str = Field(pattern=r"^[a-z0-9_]+( \. [a-z0-9_]+)*$", description="e.g. ipv4_addr")
    flags: list[Literal["constant", "interval", "timeout"]] = []
    elements: list[Element] = []


class Chain(_Model):
    name: Name
    type: Literal["filter", "nat", "route"] | None = Field(
        None, description="with hook: a base chain; without: a regular chain (jump/goto target)"
    )
    hook: Literal["prerouting", "input", "forward", "output", "postrouting"] | None = None
    priority: Annotated[int | str, AfterValidator(_priority)] = 0
    policy: Literal["accept", "drop"] = "accept"
    rules: list[str] = Field([], description="nft rules, one per entry (checked by nft)")

    @check
    def _base_or_regular(self) -> Chain:
        if (self.type is None) != (self.hook is None):
            raise ValueError("a base chain has both type and hook; a regular chain neither")
        return self

    @property
    def base(self) -> bool:
        return self.hook is not None


class FirewallSection(_Model):
    """`spec.firewall`: named sets and chains of table `inet trueup`."""

    sets: list[NftSet] = []
    chains: list[Chain] = []

    @check
    def _checks(self) -> FirewallSection:
        """Unique names; each rule one line of trueup's table — reported at `chains[NAME].rules[I]`."""
        problems: list[tuple[str, str]] = []
        for kind, names in (
            ("sets", [s.name for s in self.sets]),
            ("chains", [c.name for c in self.chains]),
        ):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    problems.append((f"{kind}[{name}]", f"duplicate name {quoted(name)}"))
                seen.add(name)
        rules: dict[str, list[str]] = {}
        for chain in self.chains:
            rules[chain.name] = []
            for index, rule in enumerate(chain.rules):
                try:
                    rules[chain.name].append(_rule(rule))
                except ValueError as exc:
                    problems.append((f"chains[{chain.name}].rules[{index}]", str(exc)))
        if problems:
            raise _PathError.many(problems)
        for chain in self.chains:  # normalised whitespace: one canonical text per rule
            object.__setattr__(chain, "rules", rules[chain.name])
        return self


def rule_path(chain: str, index: int) -> str:
    return f"spec.firewall.chains[{chain}].rules[{index}]"


SECTION = Section("firewall", FirewallSection)
