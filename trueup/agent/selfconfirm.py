"""The agent confirms a control-plane revision itself, once its own health holds after the apply.

Who calls this: the wiring (`trueup.agent.wiring`), when a control plane
manages the device. A revision the control plane delivers with a
confirmation window is applied with `--confirm-within` semantics by the
reconcile loop (`trueup.reconcile.confirmwait`: the pending record, its
deadline, the rollback when it passes). Nobody runs `trueup confirm` on a
thousand routers, so the agent looks at itself every `interval` seconds and
confirms the pending version only when all of these hold:

1. the apply verified: every subsystem committed (a partial apply is never
   confirmed by the agent; it is rolled back at the deadline);
2. management is ready: the management interface up with its addresses and
   the API listener serving (`Agent.management_health`, what
   `/v1/health/management` answers);
3. the control plane was reached again: a request the control plane
   answered (a report, a pull) was sent after the apply;
4. no subsystem found, before the apply, that the revision may cut the API
   off from outside (`Subsystem.management_risks`: a firewall that drops new
   connections to the API port). The agent's own health cannot see that —
   the listener still serves and the control plane is still reached — so
   such a revision waits for an operator's `trueup confirm` and otherwise
   rolls back at its deadline: in a rollout, the canary fails and the
   rollout stops there.

Until then it records what it waits for (the pending confirmation's reason in
status and in the report) and asks for a report, so the round trip is tried
again at once. If the window passes first, the loop's confirm-timeout
rolls back to the previous revision, and the reason says what was missing —
a change that cut the route to the control plane or a firewall that drops
the API brings the router back by itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from trueup.agent.bodies import ManagementHealth

__all__ = ["SelfConfirm"]

log = logging.getLogger("trueup.agent")

ACTOR = "agent-health"
CONFIRMED = "management ready and the control plane reached after a verified apply"


class SelfConfirm:
    def __init__(
        self,
        loop: Any,
        *,
        management: Callable[[], ManagementHealth],
        contact: Callable[[], float | None],
        contact_problem: Callable[[], str | None],
        ask_contact: Callable[[], None],
        interval: float = 0.5,
    ) -> None:
        self.loop = loop  # trueup.reconcile.loop.ReconcileLoop
        self.management = management
        self.contact = contact
        self.contact_problem = contact_problem
        self.ask_contact = ask_contact
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_problem: str | None = None

    def _problem(self, text: str) -> str:
        if text != self._last_problem:
            log.warning("%s", text)
            self._last_problem = text
        return text

    def waiting_for(self, pending: dict[str, Any]) -> list[str]:
        """What the confirmation of `pending` still waits for; [] when its health holds."""
        missing: list[str] = []
        unverifiable = [str(r) for r in pending.get("unverifiable") or []]
        if unverifiable:
            missing.append(
                "an operator's `trueup confirm`: "
                + "; ".join(unverifiable)
                + " (from inside, the agent cannot see whether its API still answers)"
            )
        if not pending.get("verified"):
            missing.append("a verified apply (it did not commit every subsystem)")
        health = self.management()
        if not health.get("ready"):
            why = health.get("reason")
            missing.append("management ready" + (f" ({why})" if why else ""))
        applied_at = float(pending.get("applied_at") or pending.get("deadline") or 0.0)
        reached = self.contact()
        if reached is None or reached < applied_at:
            problem = self.contact_problem()
            missing.append(
                "the control plane reached after the apply"
                + (f" (last error: {problem})" if problem else "")
            )
        return missing

    def check(self) -> str | None:
        """One look. None: nothing to confirm, or confirmed now; else what it waits for."""
        pending = self.loop.confirmation.self_pending()
        if pending is None or pending.get("version") is None:
            return None
        version = int(pending["version"])
        missing = self.waiting_for(pending)
        if not missing:
            try:
                answer = self.loop.confirm(
                    actor=ACTOR,
                    version=version,
                    reason=CONFIRMED,
                )
            except Exception as exc:  # a damaged state file refuses writes: said once
                return self._problem(f"version {version} not confirmed: {exc}")
            if answer.get("ok"):
                log.info("version %d confirmed: its own health holds after the apply", version)
                return None
            return self._problem(str(answer.get("message")))
        text = "; ".join(missing)
        self.loop.note_confirmation_waiting(version, text)
        self.ask_contact()  # one more round trip, now
        return text

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trueup-selfconfirm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # the deadline still holds: the loop rolls back without us
                log.exception("the agent's own confirmation check failed")
