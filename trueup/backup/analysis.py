"""`analyze(path, state, links, mappings) -> Analysis`: may this archive be restored here, and how?

Who uses this: `trueup restore analyze`, and `restore apply`, which re-runs it
and refuses an archive that fails. Analysis reads the archive and the state
directory and changes nothing anywhere.

What is checked, each problem naming its entry (`reader.Problem`):

* the archive: a manifest first, the format version (newer → refused), the
  device (another router's archive → refused), every member safe (regular
  file, no escaping path), declared, whole, of the declared size and sha256;
  problems here concern the whole archive and refuse every mode;
* `config`: the applied record and the revision it names, the revision's
  digests (file and document) against the manifest, the document valid for
  this agent, its interface names present here or mapped (`--map old=new`;
  never guessed), secrets only as references;
* `native/dhcp-leases`: its entries verified, a Kea lease CSV header (a
  zero-byte file is a valid empty source), its generation equal to the
  config component's `dhcp_generation`;
* `native/dns`, `audit`: entries verified; the audit excerpt's hash chain and
  its link to the anchor recorded at backup time.

Eligibility, per mode: `config-only` needs the archive and `config`
eligible — whatever the lease component says; `full` needs those and the
lease and DNS components (when present). Each mode gets a plan: the revision
it would apply, the diff against what is applied now, and for `full` the
leases it would restore.

Why this module is over 400 lines: each component's checks feed the one
`Analysis` they are judged by (eligibility per mode reads every problem);
split per component, the rules tying them together (archive-level problems
refuse every mode, leases never block config-only) would be spread out.
Splitting the audit proof out is the next step if it grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trueup import __version__
from trueup.backup.analysisjson import (
    AnalysisJSON,
    ComponentInfo,
    ConfigRevision,
    DiffSummary,
    RestorePlan,
)
from trueup.backup.format import AUDIT, CONFIG, DNS, LEASES, MANIFEST, Manifest
from trueup.backup.interfaces import interface_refs, map_interfaces
from trueup.backup.reader import ARCHIVE, ArchiveError, Problem, scan_archive
from trueup.backup.secrets import secrets_in_clear
from trueup.journal.atomic import StateFileError
from trueup.journal.state import StateDir
from trueup.model.digests import canonical_json, json_digest, sha256_hex
from trueup.model.jsontypes import JSONObject
from trueup.model.order import natural_sorted
from trueup.model.records import Applied

__all__ = [
    "MODES",
    "Analysis",
    "AnalysisJSON",
    "ComponentInfo",
    "DiffSummary",
    "RestorePlan",
    "analyze",
    "current_device",
    "diff_summary",
]

MODES = ("config-only", "full")
_DIFF_PATHS = 50


@dataclass
class Analysis:
    """What `trueup restore analyze` reports; `to_json()` is the stable JSON output."""

    archive: str
    manifest: Manifest | None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    components: dict[str, ComponentInfo] = field(default_factory=dict)
    plans: dict[str, RestorePlan] = field(default_factory=dict)
    mappings: dict[str, str] = field(default_factory=dict)
    document: JSONObject | None = None  # the revision a restore applies, mappings applied

    def component_problems(self, component: str) -> list[Problem]:
        return [p for p in self.problems if p.component in (None, component)]

    def component_eligible(self, component: str) -> bool:
        info = self.components.get(component, {})
        return bool(info.get("present")) and not self.component_problems(component)

    @property
    def eligible(self) -> dict[str, bool]:
        config = self.component_eligible(CONFIG)
        full = config and self.component_eligible(LEASES)
        if self.components.get(DNS, {}).get("present"):
            full = full and self.component_eligible(DNS)
        return {"config-only": config, "full": full}

    def refusals(self, mode: str) -> list[Problem]:
        """The problems that refuse `mode`."""
        needed = {CONFIG} if mode == "config-only" else {CONFIG, LEASES, DNS}
        out = [p for p in self.problems if p.component is None or p.component in needed]
        if mode == "full" and not self.components.get(LEASES, {}).get("present"):
            asked = self.manifest is not None and LEASES in self.manifest.components
            why = (
                "no Kea ran on the router when it was made"
                if asked
                else "made without --with-leases"
            )
            out.append(
                Problem(
                    LEASES + "/", "component_absent", f"the archive holds no leases ({why})", LEASES
                )
            )
        return out

    def to_json(self) -> AnalysisJSON:
        manifest = self.manifest
        return {
            "archive": self.archive,
            "format_version": manifest.format_version if manifest else None,
            "device": manifest.device if manifest else None,
            "created_at": manifest.created_at if manifest else None,
            "agent_version": manifest.agent_version if manifest else None,
            "revision": manifest.revision if manifest else None,
            "eligible": self.eligible,
            "components": {
                name: {
                    **info,
                    "eligible": self.component_eligible(name),
                    "problems": [p.to_json() for p in self.problems if p.component == name],
                }
                for name, info in self.components.items()
            },
            "problems": [p.to_json() for p in self.problems],
            "refusals": {mode: [p.to_json() for p in self.refusals(mode)] for mode in MODES},
            "warnings": self.warnings,
            "mappings": self.mappings,
            "plans": self.plans,
        }


def current_device(state: StateDir) -> tuple[str | None, JSONObject | None, Applied]:
    """(device name, applied document, applied record) of this router; None when nothing applied.

    The document is the revision file's, unparsed (an archive's is compared with it as JSON).
    """
    applied = state.applied()
    document: JSONObject | None = None
    version = applied.version
    if version:
        try:
            record = state.revision(version, applied.digest)
        except StateFileError:
            record = None
        if record is not None and isinstance(record.get("document"), dict):
            document = record["document"]
    # The state directory's identity first (trueup.journal.identity), then the applied document.
    device = state.identity().get("device")
    if not isinstance(device, str) or not device:
        device = (document or {}).get("metadata", {}).get("device")
    return (device if isinstance(device, str) else None), document, applied


def _leaves(value: Any, path: str, out: dict[str, object]) -> None:
    """Each leaf of a JSON value by its path (`spec.a.b[0]`)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _leaves(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            _leaves(item, f"{path}[{i}]", out)
    else:
        out[path] = value


def diff_summary(current: JSONObject | None, restored: JSONObject) -> DiffSummary:
    """What applying `restored` over `current` changes: per `spec` section, and the first paths."""
    old_spec = (current or {}).get("spec") or {}
    new_spec = restored.get("spec") or {}
    sections: dict[str, str] = {}
    for name in sorted(set(old_spec) | set(new_spec)):
        if name not in old_spec:
            sections[name] = "added"
        elif name not in new_spec:
            sections[name] = "removed"
        elif canonical_json(old_spec[name]) != canonical_json(new_spec[name]):
            sections[name] = "changed"
    old: dict[str, object] = {}
    new: dict[str, object] = {}
    _leaves(old_spec, "spec", old)
    _leaves(new_spec, "spec", new)
    changed = natural_sorted(p for p in set(old) | set(new) if old.get(p, ...) != new.get(p, ...))
    return {
        "sections": sections,
        "paths_changed": len(changed),
        "paths": changed[:_DIFF_PATHS],
        "identical": not changed,
    }


def _json(data: bytes, entry: str, component: str, problems: list[Problem]) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        problems.append(Problem(entry, "entry_invalid", f"not JSON: {exc}", component))
        return None


def _check_config(
    analysis: Analysis,
    kept: dict[str, bytes],
    links: set[str],
    mappings: dict[str, str],
    current: JSONObject | None,
) -> None:
    manifest = analysis.manifest
    assert manifest is not None
    problems = analysis.problems
    info = analysis.components.setdefault(CONFIG, {"present": False})
    entries = manifest.component_entries(CONFIG)
    info["present"] = bool(entries)
    info["revisions"] = sum(1 for e in entries if e.path.startswith("config/revisions/"))
    if not entries:
        problems.append(Problem("config/", "component_absent", "no config entries", CONFIG))
        return
    version = int(manifest.revision.get("version", 0))
    digest = manifest.revision.get("digest")
    rev_path = f"config/revisions/{version:08d}.json"
    for name in ("config/applied.json", rev_path):
        if manifest.entry(name) is None:
            problems.append(Problem(name, "entry_missing", "not declared in the manifest", CONFIG))
    applied_raw, record_raw = kept.get("config/applied.json"), kept.get(rev_path)
    if applied_raw is None or record_raw is None:
        return  # a problem already names why (missing, corrupt, truncated)
    applied = _json(applied_raw, "config/applied.json", CONFIG, problems)
    record = _json(record_raw, rev_path, CONFIG, problems)
    if not isinstance(applied, dict) or not isinstance(record, dict):
        return
    if applied.get("version") != version or applied.get("digest") != digest:
        problems.append(
            Problem(
                "config/applied.json",
                "revision_mismatch",
                f"applied revision {applied.get('version')} ({applied.get('digest')}) is not the "
                f"manifest's {version} ({digest})",
                CONFIG,
            )
        )
    document = record.get("document")
    if not isinstance(document, dict) or record.get("digest") != json_digest(document):
        problems.append(
            Problem(rev_path, "revision_invalid", "document does not match its digest", CONFIG)
        )
        return
    if record.get("applied_digest") != digest:
        problems.append(
            Problem(
                rev_path,
                "revision_mismatch",
                f"applied_digest {record.get('applied_digest')} is not the manifest's {digest}",
                CONFIG,
            )
        )
    _check_document(analysis, rev_path, document, digest)
    device = (document.get("metadata") or {}).get("device")
    if device != manifest.device:
        problems.append(
            Problem(
                rev_path,
                "device_mismatch",
                f"the document is for device {device!r}, the manifest says {manifest.device!r}",
                CONFIG,
            )
        )
    for where, secret in secrets_in_clear(document):
        problems.append(
            Problem(rev_path, "secret_in_clear", f"{where}: {secret}; only references", CONFIG)
        )
    _check_interfaces(analysis, rev_path, document, links, mappings)
    restored = map_interfaces(document, mappings)
    analysis.document = restored
    info["revision"] = {
        "version": version,
        "digest": digest,
        "origin": record.get("origin"),
        "accepted_at": record.get("accepted_at"),
    }


def _check_document(analysis: Analysis, entry: str, document: JSONObject, digest: Any) -> None:
    """The archived document must be valid for this agent, and be the digest it claims."""
    import trueup.subsystems.registry  # noqa: F401  (registers the sections of spec)
    from trueup.model.document import DocumentError, document_digest, parse_document

    try:
        parsed = parse_document(document, entry)
    except DocumentError as exc:
        for problem in exc.problems[:10]:
            analysis.problems.append(Problem(entry, "document_invalid", problem, CONFIG))
        return
    if document_digest(parsed) != digest:
        analysis.problems.append(
            Problem(
                entry, "revision_mismatch", "the document's digest is not the manifest's", CONFIG
            )
        )


def _check_interfaces(
    analysis: Analysis,
    entry: str,
    document: JSONObject,
    links: set[str],
    mappings: dict[str, str],
) -> None:
    used: set[str] = set()
    for where, name in interface_refs(document):
        used.add(name)
        target = mappings.get(name)
        if target is None:
            if name not in links:
                analysis.problems.append(
                    Problem(
                        entry,
                        "interface_missing",
                        f"{where}: interface {name} does not exist on this router; name the one "
                        f"to use with --map {name}=NEW (never guessed)",
                        CONFIG,
                    )
                )
        elif target not in links:
            analysis.problems.append(
                Problem(
                    entry,
                    "interface_map_invalid",
                    f"{where}: --map {name}={target}: {target} does not exist on this router",
                    CONFIG,
                )
            )
    for old in sorted(set(mappings) - used):
        analysis.warnings.append(f"--map {old}={mappings[old]}: the archive does not use {old}")


def _check_leases(analysis: Analysis, kept: dict[str, bytes]) -> None:
    manifest = analysis.manifest
    assert manifest is not None
    entries = manifest.component_entries(LEASES)
    facts = manifest.components.get(LEASES, {})
    info = analysis.components.setdefault(LEASES, {"present": bool(entries)})
    info["present"] = bool(entries)
    if not entries:
        return
    info["generation"] = facts.get("generation")
    info["counts"] = facts.get("counts", {})
    info["source"] = facts.get("source")
    config_gen = manifest.components.get(CONFIG, {}).get("dhcp_generation")
    for entry in entries:
        if entry.generation != config_gen:
            analysis.problems.append(
                Problem(
                    entry.path,
                    "generation_mismatch",
                    f"made under DHCP configuration {entry.generation[:19]}…, but the config "
                    f"component's is {str(config_gen)[:19]}… (leases from another configuration "
                    "generation; a config-only restore is not affected)",
                    LEASES,
                )
            )
        head = kept.get(entry.path)
        if head is not None and head and not head.startswith(b"address,"):
            analysis.problems.append(
                Problem(
                    entry.path, "entry_invalid", "not a Kea lease file (no address column)", LEASES
                )
            )


def _check_audit(analysis: Analysis, kept: dict[str, bytes]) -> None:
    manifest = analysis.manifest
    assert manifest is not None
    entries = manifest.component_entries(AUDIT)
    info = analysis.components.setdefault(AUDIT, {"present": bool(entries)})
    info["present"] = bool(entries)
    lines_raw, proof_raw = kept.get("audit/audit.jsonl"), kept.get("audit/proof.json")
    if lines_raw is None or proof_raw is None:
        return
    proof = _json(proof_raw, "audit/proof.json", AUDIT, analysis.problems)
    if not isinstance(proof, dict):
        return
    prev = proof.get("first_prev")
    seq = None
    count = 0
    anchor = proof.get("anchor") or {}
    anchored = False
    for number, raw in enumerate(lines_raw.splitlines(), 1):
        try:
            record = json.loads(raw)
            body = {k: v for k, v in record.items() if k != "hash"}
            ok = record["prev"] == prev and record["hash"] == sha256_hex(canonical_json(body))
            ok = ok and (seq is None or record["seq"] == seq + 1)
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            analysis.problems.append(
                Problem(
                    "audit/audit.jsonl",
                    "audit_chain_broken",
                    f"line {number} does not chain to the line before it",
                    AUDIT,
                )
            )
            return
        prev, seq, count = record["hash"], record["seq"], count + 1
        anchored = anchored or (anchor.get("seq"), anchor.get("hash")) == (seq, prev)
    if count and not anchored:
        analysis.problems.append(
            Problem(
                "audit/proof.json",
                "audit_chain_broken",
                f"the excerpt (to seq {seq}) does not reach the anchor recorded at backup "
                f"time (seq {anchor.get('seq')})",
                AUDIT,
            )
        )
    info["lines"] = count
    info["head"] = {"seq": seq, "hash": prev}


def _plans(analysis: Analysis, current: JSONObject | None, applied: Applied) -> None:
    manifest = analysis.manifest
    if manifest is None or analysis.document is None:
        return
    found = analysis.components[CONFIG].get("revision")
    revision: ConfigRevision | dict[str, object] = found.copy() if found is not None else {}
    base: RestorePlan = {
        "revision": revision,
        "current": {"version": applied.version, "digest": applied.digest},
        "changes": diff_summary(current, analysis.document),
        "interface_mappings": analysis.mappings,
    }
    analysis.plans["config-only"] = {
        **base,
        "eligible": analysis.eligible["config-only"],
        "leases": "unchanged: the lease files are not touched",
    }
    leases = analysis.components.get(LEASES, {})
    counts = leases.get("counts", {})
    analysis.plans["full"] = {
        **base,
        "eligible": analysis.eligible["full"],
        "leases": {
            "restore": sum(int(v) for v in counts.values()) if leases.get("present") else None,
            "per_family": counts,
            "files": [e.path for e in manifest.component_entries(LEASES)],
        },
        "dns_zones": [e.path for e in manifest.component_entries(DNS)],
    }


def analyze(
    path: Path | str,
    state: StateDir,
    links: Iterable[str],
    mappings: dict[str, str] | None = None,
) -> Analysis:
    """Analyse the archive at `path` for this router (state directory, link names). Read-only."""
    mappings = dict(mappings or {})
    analysis = Analysis(archive=str(path), manifest=None, mappings=mappings)
    for component in (CONFIG, LEASES, DNS, AUDIT):
        analysis.components[component] = {"present": False}
    try:
        scan = scan_archive(
            path,
            keep=lambda name: (
                name.startswith(("config/applied.json", "audit/"))
                or (name.startswith("config/revisions/"))
            ),
        )
    except ArchiveError as exc:
        analysis.problems.append(exc.problem)
        return analysis
    manifest = scan.manifest
    assert manifest is not None
    analysis.manifest = manifest
    analysis.problems.extend(scan.problems)
    wanted = f"config/revisions/{int(manifest.revision.get('version', 0)):08d}.json"
    kept = {
        k: v for k, v in scan.kept.items() if not k.startswith("config/revisions/") or k == wanted
    }
    device, current, applied = current_device(state)
    if device is not None and device != manifest.device:
        analysis.problems.append(
            Problem(
                MANIFEST,
                "device_mismatch",
                f"the archive is from device {manifest.device!r}; state directory {state.root} "
                f"belongs to device {device!r}",
            )
        )
    if manifest.agent_version != __version__:
        analysis.warnings.append(
            f"made by trueup {manifest.agent_version}; this is trueup {__version__}"
        )
    _check_config(analysis, kept, set(links), mappings, current)
    _check_leases(analysis, _lease_heads(path, manifest))
    analysis.components[DNS] = {
        "present": bool(manifest.component_entries(DNS)),
        "zones": [e.path.removeprefix(DNS + "/") for e in manifest.component_entries(DNS)],
    }
    _check_audit(analysis, kept)
    _plans(analysis, current, applied)
    if any(p.entry == ARCHIVE for p in analysis.problems):
        analysis.warnings.append("the archive itself is damaged: get another copy")
    return analysis


def _lease_heads(path: Path | str, manifest: Manifest) -> dict[str, bytes]:
    """The first bytes of each lease file (its header), read again through the verified reader."""
    from trueup.backup.reader import open_component

    heads: dict[str, bytes] = {}
    for entry in manifest.component_entries(LEASES):
        try:
            with open_component(path, entry.path) as stream:
                heads[entry.path] = stream.read(8)
        except ArchiveError:
            continue
    return heads
