"""The one transaction writer: every change to the system goes through `Engine.transact`.

Who calls this: the CLI without a running agent, the agent's API, the
reconcile loop (heals are transactions of kind `reconcile`), confirm-timeout,
rollback, restore, startup (phase 3) and crash recovery. The management
tier alone is also converged outside a transaction (startup phase 1, the
console's `trueup management set`, the fallback heal when the state
directory refuses transactions), through the same converge
(`trueup.reconcile.engine.converge`, policy `MANAGEMENT_ONLY`; see "One
converge" in docs/architecture.md).

One transaction is a value, `TransactionRun` (`run.py`), and each step a
function over it:

1. `Engine.transact` (`core.py`) starts the subsystems' preparations
   (`checks.prepare`, `Subsystem.prepare`) in parallel, each within its
   deadline; a subsystem's is joined only when its turn comes, so a hanging
   lookup in a later tier never delays an earlier one;
2. it takes the writer lock (reentrant within a thread; another writer is
   refused with `STATE_CONCURRENT_MODIFICATION`), then recovers any
   transaction a crash left open (`recovery.recover_locked`);
3. `checks.check` runs the checks, once for every caller: `If-Match`
   (expected version), the revision's origin and number (a control-plane
   revision is never skipped because a local apply took its number; a local
   apply on a managed device needs an explicit override), the management
   guard; it answers the run (version, digest, scope, the subsystems it may
   change and those it carries);
4. `execute.observe_and_plan` takes the before-images and plans;
   `commit.begin` writes the journal's `begin` with them;
5. `execute.execute` converges each subsystem in tier and dependency order,
   within its deadline (`converge.converge_bounded`); a subsystem whose
   dependency did not converge waits;
6. `execute.verify` observes every subsystem again and converges until
   observed equals desired (the kernel has side effects: removing an address
   flushes the routes through it), so "committed" means the system matches
   the document;
7. `commit.commit` writes the revision, the applied record and the journal's
   `commit` (which carries the audit record, so a crash right after it cannot
   lose the audit line: the next transaction writes it), then the audit line.

An atomic transaction that fails is converged back to its before-images
(`execute.roll_back_images`). Recovery rule (`recovery.py`): an open
transaction is never resumed forward; what it could change is converged to
the last *committed* revision and it is closed as `rolled_back` with
`recovered: true`. `STATE_APPLY_NOT_COMPLETED` is reported from that journal
record until the next committed transaction.
"""

from __future__ import annotations

from trueup.reconcile.engine.core import Engine, NetlinkFactory
from trueup.reconcile.engine.run import TransactionRun

__all__ = ["Engine", "NetlinkFactory", "TransactionRun"]
