"""Records carry their types: `dict[str, Any]` only shrinks, and typed modules stay typed.

* A ratchet on `dict[str, Any]` in `trueup/` (migrations aside): the count may
  go down, never up. A name given to it (`X: TypeAlias = dict[str, Any]`, other
  than `JSONObject`) is counted at every line that uses it: renaming is not
  typing. A new record gets a type (a dataclass, a TypedDict, a
  pydantic model, an enum); a JSON object at the edge whose shape is not
  trueup's is `trueup.model.jsontypes.JSONObject`.
* The modules whose records are typed end to end (the status document, the
  drift and control-plane reports, the applied record, the report ingest)
  offer no function to another package that takes or returns a
  `dict[str, Any]`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "trueup"
UNTYPED = "dict[str, Any]"

# The count after the records were typed; lower it when you type more, never raise it.
CEILING = 143

# `Name: TypeAlias = dict[str, Any]`: an untyped record under another name.
_ALIAS = re.compile(r"^(\w+): TypeAlias = dict\[str, Any\]", re.M)
# Where a name is only mentioned: an import, an `__all__` entry.
_MENTION = re.compile(r"^\s*(from |import |\"\w+\",$)")

# Modules whose cross-package functions are typed (no `dict[str, Any]` in a signature).
TYPED_MODULES = (
    "trueup.model",
    "trueup.reconcile.status",
    "trueup.reconcile.statuslook",
    "trueup.reconcile.classify",
    "trueup.reconcile.doctor",
    "trueup.reconcile.acks",
    "trueup.reconcile.answers",
    "trueup.reconcile.attribution",
    "trueup.reconcile.confirm",
    "trueup.reconcile.confirmwait",
    "trueup.reconcile.driftbook",
    "trueup.reconcile.driftwatch",
    "trueup.reconcile.healing",
    "trueup.reconcile.loop",
    "trueup.reconcile.planning",
    "trueup.reconcile.probes",
    "trueup.reconcile.requests",
    "trueup.reconcile.view",
    "trueup.agent.cpclient",
    "trueup.agent.cpreport",
    "trueup.agent.cpsync",
    "trueup.server.ingest",
    "trueup.backup",
    "trueup.journal",
    "trueup.subsystems.daemonkit",
    "trueup.subsystems.dhcp",
    "trueup.subsystems.dns",
    "trueup.subsystems.firewall",
    "trueup.subsystems.ha",
    "trueup.subsystems.proxy",
    "trueup.subsystems.wireguard",
    "trueup.system.haproxy",
    "trueup.system.kealeases",
    "trueup.system.nft",
    "trueup.system.requirements",
    "trueup.system.sources",
    "trueup.startup",
    "trueup.server.confirmation",
    "trueup.server.coverage",
    "trueup.server.drift",
    "trueup.server.fleet",
    "trueup.server.records",
    "trueup.server.service",
)


def _sources() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*.py")):
        if "migrations" not in path.relative_to(ROOT).parts:
            yield path


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str:
    """The layer a module belongs to: `trueup.reconcile.status` → `reconcile`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _untyped_signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = node.args
    annotated = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    annotated += [a for a in (args.vararg, args.kwarg) if a is not None]
    annotations = [a.annotation for a in annotated if a.annotation is not None]
    if node.returns is not None:
        annotations.append(node.returns)
    return any(UNTYPED in ast.unparse(a) for a in annotations)


def _typed(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in TYPED_MODULES)


def _untyped_lines() -> int:
    texts = [path.read_text() for path in _sources()]
    aliases = {m for text in texts for m in _ALIAS.findall(text)} - {"JSONObject"}
    uses = re.compile(r"\b(" + "|".join(sorted(aliases)) + r")\b") if aliases else None
    count = 0
    for text in texts:
        for line in text.splitlines():
            aliased = uses is not None and uses.search(line) and not _MENTION.match(line)
            count += UNTYPED in line or bool(aliased)
    return count


def test_dict_str_any_only_goes_down() -> None:
    count = _untyped_lines()
    assert count <= CEILING, (
        f"{count} `{UNTYPED}` in trueup/ (ceiling {CEILING}): give the new record a type "
        "(a dataclass, a TypedDict, a pydantic model, an enum) instead; a JSON object at "
        "the edge whose shape is not trueup's is trueup.model.jsontypes.JSONObject"
    )


def test_the_count_is_real() -> None:
    """The ratchet reads the tree it claims to: the JSONObject alias itself is among what it sees."""
    assert UNTYPED in (ROOT / "model" / "jsontypes.py").read_text()
    assert sum(1 for _ in _sources()) > 100


def test_an_alias_of_the_untyped_record_is_counted_where_it_is_used() -> None:
    text = "Rec: TypeAlias = dict[str, Any]\n"
    assert _ALIAS.findall(text) == ["Rec"]
    assert _MENTION.match('    "Rec",') and _MENTION.match("from x import Rec")
    assert not _MENTION.match("def f(r: Rec) -> Rec:")


def test_typed_modules_offer_no_untyped_function_to_another_package() -> None:
    trees = {_module(path): ast.parse(path.read_text()) for path in _sources()}
    untyped = {
        (module, node.name)
        for module, tree in trees.items()
        if _typed(module)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _untyped_signature(node)
    }
    offenders = sorted(
        f"{source}.{name} (used by {module})"
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
        for source, name in [(node.module, alias.name)]
        if (source, name) in untyped and _package(source) != _package(module)
    )
    assert not offenders, (
        f"functions called from another package take or return `{UNTYPED}`: {offenders}; "
        "give the record a type (or JSONObject for a JSON body whose shape is not trueup's)"
    )


def test_the_signature_check_sees_an_untyped_record() -> None:
    tree = ast.parse("def f(x: dict[str, Any]) -> int: ...\ndef g(x: int) -> Status: ...")
    found = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _untyped_signature(n)]
    assert found == ["f"]


def test_journal_records_read_back_as_their_files_hold_them() -> None:
    """A typed journal record turns back into the very JSON its file held (unknown keys kept)."""
    from trueup.journal.agentlock import AgentHolder
    from trueup.journal.limitations import Limitation
    from trueup.journal.override import ManagementOverride

    override = {
        "interface": "mgmt0",
        "addresses": ["198.51.100.3/24"],
        "gateway": None,
        "set_at": "2026-01-01T00:00:00Z",
        "actor": "console:0",
        "reason": "test",
        "writer_lock": "held",
        "replaced": {
            "source": "revision 2",
            "interface": "mgmt0",
            "addresses": ["198.51.100.2/24"],
            "gateway": "198.51.100.1",
        },
        "newer": 1,
    }
    limitation = {
        "added_at": "2026-01-01T00:00:00Z",
        "added_by": "test",
        "id": "L1",
        "path": "links.lan0.mtu",
        "reason": "NIC firmware",
        "reviewed_by": "alice",
        "subsystem": "links",
        "ticket": None,
        "withdraw_reason": None,
        "withdrawn_at": None,
        "withdrawn_by": None,
    }
    holder = {"pid": 42, "started_at": "2026-01-01T00:00:00Z", "state_dir": "/var/lib/trueup"}
    assert ManagementOverride.from_json(override).to_json() == override
    assert list(Limitation.from_json(limitation).to_json()) == list(limitation)
    assert Limitation.from_json(limitation).to_json() == limitation
    assert AgentHolder.from_json(holder).to_json() == holder
    assert ManagementOverride.from_json(override).facts.addresses == ("198.51.100.3/24",)
