"""The subsystems an agent runs, in dependency and tier order.

The subsystems come from the catalog (`trueup.model.catalog`: one line per
subsystem) and from plugins; they never import each other. Registering a
subsystem registers its section of `spec` with the document model and its
scope keys with `scope_for`; `ordered()` sorts subsystems by tier, then by
their declared dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from trueup.model import catalog
from trueup.model.document import DeviceState
from trueup.model.sections import register_section
from trueup.model.types import family_of
from trueup.model.virtual import virtual_addresses
from trueup.subsystems.base import Scope, Subsystem

__all__ = [
    "SUBSYSTEMS",
    "default_subsystems",
    "fence_follower",
    "load_plugin",
    "ordered",
    "register",
    "scope_for",
]

# Every subsystem trueup ships (the catalog lists them by name).
SUBSYSTEMS: list[type[Subsystem]] = [catalog.load(ref) for ref in catalog.SUBSYSTEMS]

_REGISTERED: dict[str, type[Subsystem]] = {}


def register(cls: type[Subsystem]) -> None:
    """Make a subsystem known: its section of `spec` and its scope keys."""
    if isinstance(cls.section, tuple):
        register_section(*cls.section)
    elif cls.section is not None:
        register_section(cls.section)
    _REGISTERED[cls.name] = cls


for _cls in SUBSYSTEMS:
    register(_cls)


def default_subsystems() -> list[Subsystem]:
    return ordered(cls() for cls in SUBSYSTEMS)


def fence_follower(fence: str) -> Subsystem:
    """The subsystem whose daemons follow the durable fence `fence` (its `follow_fence`)."""
    for cls in SUBSYSTEMS:
        if cls.fence == fence:
            return cls()
    raise LookupError(f"no subsystem follows the {fence!r} fence")


def load_plugin(reference: str) -> Subsystem:
    """A subsystem from `package.module:factory` (a class or a callable returning one)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"plugin {reference!r}: expected MODULE:FACTORY")
    module = importlib.import_module(module_name)
    factory = getattr(module, attribute)
    subsystem = factory()
    if not isinstance(subsystem, Subsystem):
        raise ValueError(f"plugin {reference!r} did not produce a Subsystem")
    register(type(subsystem))
    return subsystem


def ordered(subsystems: Iterable[Subsystem]) -> list[Subsystem]:
    pending = sorted(subsystems, key=lambda s: (s.tier.rank, s.name))
    names = {s.name for s in pending}
    done: list[Subsystem] = []
    placed: set[str] = set()
    while pending:
        for sub in pending:
            if all(dep in placed or dep not in names for dep in sub.depends_on):
                done.append(sub)
                placed.add(sub.name)
                pending.remove(sub)
                break
        else:
            cycle = ", ".join(s.name for s in pending)
            raise ValueError(f"subsystem dependency cycle among: {cycle}")
    return done


def scope_for(document: DeviceState, previous: DeviceState | None = None) -> Scope:
    """What `document` manages; `previous` adds the management state trueup assigned before."""
    spec = document.spec
    tables = {254} | {spec.table_number(r.table) for r in spec.routes}
    if previous is not None:
        # Routes the previous revision put in other tables are released by
        # removing them, and they are in the before-image a rollback restores.
        tables |= {previous.spec.table_number(r.table) for r in previous.spec.routes}
    owned = set(spec.management.addresses)
    gateways = set()
    for doc in (document, previous):
        if doc is None:
            continue
        if doc.spec.management.interface == spec.management.interface:
            owned |= set(doc.spec.management.addresses)
        gw = doc.spec.management.gateway
        if gw is not None:
            v6 = family_of(gw) == 6
            gateways.add((254, "::/0" if v6 else "0.0.0.0/0", 1024 if v6 else 0))
    keyed: list[tuple[str, tuple[str, ...]]] = []
    for name, cls in sorted(_REGISTERED.items()):
        keys = set(cls.scope_keys(document))
        if previous is not None:
            # What the previous revision set is in the before-image a rollback restores.
            keys |= cls.scope_keys(previous)
        if keys:
            keyed.append((name, tuple(sorted(keys))))
    return Scope(
        owned=tuple(keyed),
        interfaces=frozenset(spec.managed_interfaces()),
        tables=frozenset(tables),
        management_interface=spec.management.interface,
        management_owned=frozenset(owned),
        management_default_routes=frozenset(gateways),
        virtual_addresses=virtual_addresses(document) | virtual_addresses(previous),
    )
