"""What a transaction may observe and change: `Scope`, and its one union.

`trueup.subsystems.registry.scope_for` builds a document's scope; the
journal keeps it with each `begin`; crash recovery widens the committed
revision's scope by the interrupted transaction's with `Scope.union`, the
one merge of every field (a unit test fails when a field has no rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from trueup.model.records import ScopeJSON
from trueup.model.virtual import is_virtual

__all__ = ["Scope"]


@dataclass(frozen=True)
class Scope:
    """What a transaction may observe and change.

    `management_owned` lists management addresses trueup itself assigned (the
    previous and the new document's): only those are ever removed from the
    management interface, so the management address survives everything but
    an edit of `spec.management`. `exact` is set for rollbacks, which restore
    a before-image precisely. `virtual_addresses` are the HA virtual
    addresses (`spec.ha.vips`) of the previous and the new document: they
    belong to the HA role, so the `addresses` and `management` subsystems
    neither observe nor remove them.
    """

    interfaces: frozenset[str] = frozenset()
    tables: frozenset[int] = frozenset({254})
    management_interface: str = ""
    management_owned: frozenset[str] = frozenset()
    management_default_routes: frozenset[tuple[int, str, int]] = frozenset()
    exact: bool = False
    # Per subsystem, the keys it manages beyond interfaces and tables (sysctl names, …).
    owned: tuple[tuple[str, tuple[str, ...]], ...] = ()
    virtual_addresses: frozenset[str] = frozenset()

    def union(self, other: Scope) -> Scope:
        """This scope widened by everything `other` manages: the one merge of every field.

        Crash recovery converges the committed revision's scope widened by the
        interrupted transaction's, so what either manages (an nft table, a
        sysctl name, a WireGuard interface) is observed and put back. The
        management interface and exactness stay this scope's; `other`'s
        management addresses are owned only when they are on that same
        interface.
        Every field has its rule in `_MERGES`: a field without one is refused
        here (and by the unit test), never silently dropped.
        """
        merged: dict[str, Any] = {}
        for item in fields(self):
            rule = _MERGES.get(item.name)
            if rule is None:
                raise TypeError(f"Scope.{item.name} has no merge rule in trueup.subsystems.base")
            merged[item.name] = rule(self, other)
        return Scope(**merged)

    def is_virtual(self, prefix: str) -> bool:
        """Whether `prefix` (`A/LEN` as netlink reports it) is an HA virtual address."""
        return is_virtual(prefix, self.virtual_addresses)

    def for_rollback(self) -> Scope:
        return replace(self, exact=True)

    def keys_for(self, subsystem: str) -> frozenset[str]:
        return frozenset(k for name, keys in self.owned if name == subsystem for k in keys)

    def to_json(self) -> ScopeJSON:
        return {
            "interfaces": sorted(self.interfaces),
            "tables": sorted(self.tables),
            "management_interface": self.management_interface,
            "management_owned": sorted(self.management_owned),
            "management_default_routes": sorted(list(k) for k in self.management_default_routes),
            "exact": self.exact,
            "owned": {name: list(keys) for name, keys in self.owned},
            "virtual_addresses": sorted(self.virtual_addresses),
        }

    @classmethod
    def from_json(cls, data: ScopeJSON) -> Scope:
        return cls(
            interfaces=frozenset(data["interfaces"]),
            tables=frozenset(data["tables"]),
            management_interface=data["management_interface"],
            management_owned=frozenset(data["management_owned"]),
            management_default_routes=frozenset(
                (int(t), str(to), int(m)) for t, to, m in data["management_default_routes"]
            ),
            exact=bool(data.get("exact", False)),
            owned=tuple(
                (str(name), tuple(str(k) for k in keys))
                for name, keys in sorted(dict(data.get("owned", {})).items())
            ),
            # Journals written before HA existed have none.
            virtual_addresses=frozenset(str(a) for a in data.get("virtual_addresses", [])),
        )


def _union_owned(
    mine: tuple[tuple[str, tuple[str, ...]], ...], theirs: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    keys: dict[str, set[str]] = {}
    for name, owned in (*mine, *theirs):
        keys.setdefault(name, set()).update(owned)
    return tuple((name, tuple(sorted(keys[name]))) for name in sorted(keys) if keys[name])


# How `Scope.union` merges each field (see there): one rule per field.
_MERGES: dict[str, Callable[[Scope, Scope], Any]] = {
    "interfaces": lambda a, b: a.interfaces | b.interfaces,
    "tables": lambda a, b: a.tables | b.tables,
    "management_interface": lambda a, b: a.management_interface,
    "management_owned": lambda a, b: (
        a.management_owned | b.management_owned
        if b.management_interface == a.management_interface
        else a.management_owned
    ),
    "management_default_routes": lambda a, b: (
        a.management_default_routes | b.management_default_routes
    ),
    # Exactness is never widened: a journaled scope that says exact (a rollback's) must
    # not make recovery remove what trueup did not assign (the management interface's).
    "exact": lambda a, b: a.exact,
    "owned": lambda a, b: _union_owned(a.owned, b.owned),
    "virtual_addresses": lambda a, b: a.virtual_addresses | b.virtual_addresses,
}
