"""What `nft monitor` lines prove about table `inet trueup`, without listing it.

Who calls this: `FirewallSubsystem.proven_change`, for the reconcile loop's
event path (drift recorded as soon as the monitor reports it, the pass
confirming and healing after).

`nft monitor` prints each object a transaction changed, then one line that
closes it: `# new generation N by process PID (COMM)`. The proof works per
transaction, against a *mark*: the ruleset generation at which the table was
listed exactly (nothing committed during the listing) and found equal to the
document. A change since then is proven only when every line naming trueup's
table in the transactions numbered above the mark is an `add rule`, or every
one is a `delete rule`:

* trueup never edits its table in place: each of its loads (and each
  removal) deletes the whole table in the same transaction, so a transaction
  holding only rule additions or only rule deletions is someone else's —
  whatever process or timing it came with;
* rules only added (or only deleted) change the number of rules in the
  table, so the table cannot equal what it was at the mark, which was the
  document. A replaced rule shows as a deletion and an addition (same
  handle), so it is never proven: it may put back the same rule.

Anything else — a table deleted and re-created (trueup's own loads, someone
reloading a file), sets, elements, chains, a transaction whose closing line
has not arrived, lines whose generation is unknown — proves nothing, and the
pass decides by listing the table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trueup.subsystems.firewall.canonical import FAMILY, TABLE

__all__ = ["Proof", "prove"]

_GENERATION = re.compile(r"^# new generation (\d+)\b")
_TRUEUP = re.compile(rf"^(\w+) (\w+) {FAMILY} {TABLE}(?: (\S+))?(?:\s|$)")


@dataclass(frozen=True)
class Proof:
    chains: tuple[str, ...] = ()  # the chains whose rules certainly changed (empty: no proof)
    seqs: tuple[int, ...] = ()  # the numbered lines that prove it
    pending: bool = False  # lines naming trueup's table whose transaction is not closed yet


def prove(mark_generation: int, lines: Sequence[tuple[int, str]]) -> Proof:
    """The proof `lines` (numbered monitor lines, in order) give above `mark_generation`."""
    kinds: set[str] = set()
    chains: list[str] = []
    seqs: list[int] = []
    open_lines: list[tuple[int, str, str, str | None]] = []
    for seq, line in lines:
        closing = _GENERATION.match(line)
        if closing is None:
            match = _TRUEUP.match(line)
            if match is not None:
                open_lines.append((seq, match.group(1), match.group(2), match.group(3)))
            continue
        if int(closing.group(1)) > mark_generation:
            for line_seq, verb, kind, chain in open_lines:
                kinds.add(f"{verb} {kind}")
                if chain is not None and chain not in chains:
                    chains.append(chain)
                seqs.append(line_seq)
        open_lines = []
    if open_lines:
        return Proof(pending=True)
    if kinds in ({"add rule"}, {"delete rule"}) and chains:
        return Proof(tuple(chains), tuple(seqs))
    return Proof()
