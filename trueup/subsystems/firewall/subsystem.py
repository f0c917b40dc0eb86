"""The firewall subsystem: table `inet trueup`, loaded in one nft transaction, watched by `nft monitor`.

* **desired** — the document's section, canonicalised by nft itself: the
  section becomes a script (`canonical.script`) that is loaded into an empty
  scratch network namespace and listed. The result is cached by the
  section's digest, so the loop's passes and a no-op plan cost nothing, and
  per rule (by skeleton, chain and text), so a new document loads only the
  rules not seen before.
  A rule nft refuses is reported at its document path
  (`spec.firewall.chains[input].rules[3]`) by `prepare`, before anything
  changes.
* **observe** — `nft -j list table inet trueup`, reused while the kernel's
  ruleset generation is unchanged (any nftables commit bumps it).
* **plan** — one step: replace the table (`load-ruleset`), or delete it when
  the document no longer has `spec.firewall` (`remove-table`).
* **execute** — one nft transaction: add, delete and re-add the table with
  everything in it, so a refusal changes nothing. A document's own script is
  loaded (its facts are that script's canonical form); facts alone (a
  before-image) load as an `nft -j -f` batch. Other tables are never named.
* **watches** — `nft monitor`: a rule added behind trueup's back wakes the
  loop at once (the periodic resync is the fallback), and a transaction that
  only adds or only deletes rules proves drift before any listing
  (`proven_change`, `monitor.prove`).
* **management_risks** — `risks.management_findings` on the desired facts:
  the engine's guard refuses a ruleset that would cut the management API off
  unless `--confirm-within` was given.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.model.order import natural_sorted
from trueup.subsystems.base import (
    Difference,
    EventVerdict,
    Facts,
    Plan,
    Requirement,
    Scope,
    Sources,
    Step,
    StepError,
    Subsystem,
)
from trueup.subsystems.firewall.canonical import (
    FAMILY,
    TABLE,
    TABLE_PATH,
    batch,
    facts_from_objects,
    script,
)
from trueup.subsystems.firewall.monitor import prove
from trueup.subsystems.firewall.risks import management_findings
from trueup.subsystems.firewall.ruletext import rule_text
from trueup.subsystems.firewall.section import SECTION, FirewallSection, rule_path
from trueup.system.events import NetlinkEvent
from trueup.system.nft import REQUIREMENTS as NFT_REQUIREMENTS
from trueup.system.nft import HostNftables, Nftables, NftError
from trueup.system.watches import command

__all__ = ["FirewallError", "FirewallSubsystem"]

_KEY = f"{FAMILY} {TABLE}"
_CACHE = 4  # canonical forms kept (the applied section, the one being planned, …)
_RULE_CACHE = 100_000  # canonical rules kept (about 20 MB at most); then started afresh


class FirewallError(ValueError):
    """A section nft refuses; the message names the document path of each refused line."""


def _digest(section: FirewallSection) -> str:
    # model_dump's order is the model's: deterministic without sorting (which costs ~10x).
    text = json.dumps(section.model_dump(mode="json"), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class FirewallSubsystem(Subsystem):
    name = "firewall"
    tier = Tier.NETWORK
    section = SECTION
    observed_only_matters = True  # a rule or chain someone added to trueup's table is drift
    may_block = True
    watches = (command("nft", "monitor"),)

    def __init__(self, nft: Nftables | None = None) -> None:
        # Canonicalises documents; observation and loading go through `Sources.nft`.
        self.nft: Nftables = nft if nft is not None else HostNftables()
        self._lock = threading.Lock()
        # section digest → (nft's canonical facts, the script they came from)
        self._canonical: OrderedDict[str, tuple[Facts, str]] = OrderedDict()
        self._skeletons: OrderedDict[str, Facts] = OrderedDict()  # skeleton digest → facts
        self._rules: dict[tuple[str, str, str], Any] = {}  # (skeleton, chain, rule) → fact
        self._observed: tuple[tuple[int, int], Facts] | None = None
        self._targets: OrderedDict[str, tuple[Facts, str | None]] = OrderedDict()
        self._plans = itertools.count(1)

    # -- declarations -------------------------------------------------------
    @classmethod
    def scope_keys(cls, document: DeviceState) -> frozenset[str]:
        return frozenset({_KEY}) if _section(document) is not None else frozenset()

    def requirements(self, document: DeviceState) -> list[Requirement]:
        del document
        return list(NFT_REQUIREMENTS)

    def configured(self, document: DeviceState) -> bool:
        return _section(document) is not None

    def prepare(self, document: DeviceState) -> None:
        section = _section(document)
        if section is not None:
            self.canonical(section)

    # -- facts --------------------------------------------------------------
    def canonical(self, section: FirewallSection) -> Facts:
        """nft's canonical facts for `section`; raises FirewallError naming refused paths.

        Cached by the section's digest; below that, each rule's canonical form is
        cached by its chain, its text and the table's skeleton (sets and chains,
        which a rule can refer to), so a new document canonicalises in the
        scratch namespace only the skeleton and the rules not seen before.
        """
        key = _digest(section)
        with self._lock:
            if key in self._canonical:
                self._canonical.move_to_end(key)
                return dict(self._canonical[key][0])
        text, _paths = script(section)
        skeleton = _skeleton_digest(section)
        with self._lock:
            base = self._skeletons.get(skeleton)
            known = {
                (chain.name, rule): self._rules[(skeleton, chain.name, rule)]
                for chain in section.chains
                for rule in chain.rules
                if (skeleton, chain.name, rule) in self._rules
            }
        missing = {
            chain.name: list(dict.fromkeys(r for r in chain.rules if (chain.name, r) not in known))
            for chain in section.chains
        }
        if base is None or any(missing.values()):
            base = self._canonicalise(section, missing, skeleton, known)
        facts = dict(base)
        for chain in section.chains:
            for index, rule in enumerate(chain.rules):
                facts[rule_path(chain.name, index)] = known[(chain.name, rule)]
        with self._lock:
            self._canonical[key] = (facts, text)
            while len(self._canonical) > _CACHE:
                self._canonical.popitem(last=False)
        return dict(facts)

    def _canonicalise(
        self,
        section: FirewallSection,
        missing: dict[str, list[str]],
        skeleton: str,
        known: dict[tuple[str, str], Any],
    ) -> Facts:
        """Load the skeleton and the `missing` rules in the scratch namespace; fill `known`.

        Returns the skeleton's facts (table, sets, chains). A refusal names the
        document path of the first rule with the refused text.
        """
        partial = section.model_copy(
            update={
                "chains": [c.model_copy(update={"rules": missing[c.name]}) for c in section.chains]
            }
        )
        text, paths = script(partial)
        where: dict[str, str] = {}  # a rule's path in the partial script → in the document
        for chain in section.chains:
            first: dict[str, int] = {}
            for index, rule in enumerate(chain.rules):
                first.setdefault(rule, index)
            for j, rule in enumerate(missing[chain.name]):
                where[rule_path(chain.name, j)] = rule_path(chain.name, first[rule])
        try:
            listed = facts_from_objects(self.nft.scratch_list(text, FAMILY, TABLE))
        except NftError as exc:
            named = {line: where.get(path, path) for line, path in paths.items()}
            raise FirewallError(_explain(exc, text, named)) from exc
        base = {k: v for k, v in listed.items() if ".rules[" not in k}
        with self._lock:
            if len(self._rules) > _RULE_CACHE:
                self._rules.clear()
            for chain in section.chains:
                for j, rule in enumerate(missing[chain.name]):
                    fact = listed.get(rule_path(chain.name, j))
                    known[(chain.name, rule)] = fact
                    self._rules[(skeleton, chain.name, rule)] = fact
            self._skeletons[skeleton] = base
            while len(self._skeletons) > _CACHE:
                self._skeletons.popitem(last=False)
        return base

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = _section(document)
        if section is None:
            return {TABLE_PATH: None} if _KEY in scope.keys_for(self.name) else {}
        try:
            return self.canonical(section)
        except (FirewallError, OSError) as exc:
            # Reported as this subsystem's difference and failure, never raised into a pass.
            return {TABLE_PATH: {"unloadable": str(exc)}}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        if _KEY not in scope.keys_for(self.name):
            return {}
        generation = sources.nft.generation()
        with self._lock:
            if generation is not None and self._observed and self._observed[0] == generation:
                return dict(self._observed[1])
        facts = facts_from_objects(sources.nft.list_table(FAMILY, TABLE))
        if generation is not None and sources.nft.generation() == generation:
            # Nothing was committed while listing: the facts are the table at exactly
            # this generation (what the cache and the event path's mark rely on).
            with self._lock:
                self._observed = (generation, facts)
        return dict(facts)

    def observation_mark(self, observed: Facts) -> object | None:
        """The generation `observed` is exactly the table at, when it is the cached listing."""
        with self._lock:
            if self._observed is not None and self._observed[1] == observed:
                return self._observed[0]
        return None

    def proven_change(
        self, mark: object, events: Sequence[tuple[int, NetlinkEvent]]
    ) -> EventVerdict:
        """Rules someone added to (or deleted from) the table since `mark`: `monitor.prove`."""
        if not (isinstance(mark, tuple) and len(mark) == 2):
            return EventVerdict()
        lines = [
            (seq, str(event.detail.get("line", "")))
            for seq, event in events
            if event.kind == "command" and event.message == "nft"
        ]
        proof = prove(int(mark[1]), lines)
        return EventVerdict(
            tuple(f"spec.firewall.chains[{chain}].rules" for chain in proof.chains),
            proof.seqs,
            proof.pending,
        )

    def diff(self, desired: Facts, observed: Facts) -> list[Difference]:
        """Strict: order, every field and every extra object count (rules are not sets).

        Facts are compared as nft's JSON; a rule's difference shows both sides as
        nft rule text (`tcp dport 22 accept` against `tcp dport 22 drop`)."""
        keys = natural_sorted(set(desired) | set(observed))
        out = []
        for key in keys:
            want, have = desired.get(key), observed.get(key)
            if want == have:
                continue
            if ".rules[" in key:
                want, have = rule_text(want), rule_text(have)
            out.append(Difference(self.name, key, want, have))
        return out

    # -- plan and steps -----------------------------------------------------
    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        if not desired or not _differs(desired, observed):
            return Plan(self.name, [], ["table inet trueup matches the document"])
        key = f"{next(self._plans):x}"  # names the target; the facts stay in memory
        with self._lock:
            # The script whose canonical form these facts are, when a document's: it is
            # loaded as is (nft parses its own syntax faster than its JSON, and building
            # the JSON batch of thousands of rules costs Python more than nft the load).
            script = next(
                (text for facts, text in self._canonical.values() if facts == desired), None
            )
            self._targets[key] = (dict(desired), script)
            while len(self._targets) > _CACHE:
                self._targets.popitem(last=False)
        if desired.get(TABLE_PATH) is None:
            return Plan(
                self.name,
                [Step(self.name, "remove-table", TABLE_PATH, {"table": _KEY, "target": key})],
            )
        rules = sum(1 for path in desired if ".rules[" in path)
        chains = sum(
            1
            for path in desired
            if path.startswith("spec.firewall.chains[") and ".rules[" not in path
        )
        step = Step(
            self.name,
            "load-ruleset",
            TABLE_PATH,
            {"table": _KEY, "chains": chains, "rules": rules, "target": key},
        )
        return Plan(self.name, [step])

    def execute(self, sources: Sources, step: Step) -> None:
        if step.action not in ("load-ruleset", "remove-table"):
            raise ValueError(f"unknown firewall step {step.action}")
        with self._lock:
            planned = self._targets.get(str(step.args["target"]))
        if planned is None:
            raise StepError(step, "the planned ruleset is no longer known; plan again")
        target, script = planned
        wanted = target.get(TABLE_PATH)
        if isinstance(wanted, dict) and "unloadable" in wanted:
            raise StepError(step, str(wanted["unloadable"]))
        before = sources.nft.generation()
        try:
            if script is not None and wanted is not None:
                # One transaction, like the batch: the table is added (so the delete
                # cannot fail), deleted and built again from the document's script.
                sources.nft.run(f"add table {_KEY}\ndelete table {_KEY}\n{script}")
            else:  # a before-image or a removal: facts only, loaded back as JSON
                sources.nft.run(batch(target), json_input=True)
        except NftError as exc:
            raise StepError(step, f"nft refused the ruleset, nothing changed: {exc}") from exc
        after = sources.nft.generation()
        if before is not None and after == (before[0], before[1] + 1):
            # Exactly one commit happened in between — ours: the table is what we loaded.
            facts = {TABLE_PATH: None} if wanted is None else target
            with self._lock:
                self._observed = (after, dict(facts))

    # -- guard and status ---------------------------------------------------
    def management_risks(self, document: DeviceState, api_port: int | None) -> list[str]:
        section = _section(document)
        if section is None:
            return []
        try:
            facts = self.canonical(section)
        except (FirewallError, OSError):
            return []  # refused at preparation, with the rule's path
        port = api_port or document.spec.management.api.port
        return management_findings(facts, document.spec.management.interface, port)

    def report(self, sources: Sources, scope: Scope) -> FirewallReport:
        """The tables trueup does not own: listed, never touched."""
        try:
            tables = sources.nft.tables()
        except (NftError, OSError) as exc:
            return {"table": _KEY, "unmanaged_tables": None, "error": str(exc)}
        unmanaged = sorted(
            f"{family} {name}" for family, name in tables if (family, name) != (FAMILY, TABLE)
        )
        return {"table": _KEY, "unmanaged_tables": unmanaged}


class FirewallReport(TypedDict):
    """What status shows beside the facts: trueup's table and the others, never touched."""

    table: str
    unmanaged_tables: list[str] | None  # None: nft did not list them
    error: NotRequired[str]  # why nft could not list them


def _skeleton_digest(section: FirewallSection) -> str:
    """The digest of what a rule's canonical form can depend on: sets and chain definitions."""
    data = section.model_dump(mode="json", exclude={"chains": {"__all__": {"rules"}}})
    text = json.dumps(data, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _differs(desired: Facts, observed: Facts) -> bool:
    """Whether `diff` would find anything, stopping at the first difference (no Differences)."""
    if desired == observed:
        return False
    return any(desired.get(k) != observed.get(k) for k in itertools.chain(desired, observed))


def _section(document: DeviceState) -> FirewallSection | None:
    return document.spec.section("firewall", FirewallSection)


def _explain(exc: NftError, text: str, paths: dict[int, str]) -> str:
    """nft's refusal with each script line it names mapped back to its document path."""
    lines = text.splitlines()
    named = []
    for number, message in sorted(exc.lines.items()):
        path = paths.get(number, f"line {number}")
        source = lines[number - 1] if 0 < number <= len(lines) else ""
        rule = source.split(f"{FAMILY} {TABLE} ", 1)[-1]
        named.append(f"{path}: {message} (in `{rule}`)")
    if not named:
        return f"spec.firewall: nft refused the ruleset: {exc}"
    return "; ".join(named)
