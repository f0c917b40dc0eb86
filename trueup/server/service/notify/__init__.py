"""Notifications: routing rules, signed webhooks, retries, the delivery log, escalation.

    events.py      conditions, event kinds and severities, a rule's match (pure)
    routing.py     Routing: targets (sealed secrets and header) and rules, audited
    policy.py      where a webhook may go: the target policy, checked at configuration and delivery
    allowlist.py   Allowlists: a tenant's internal receivers, set by an admin, audited
    audited.py     the target's and allowlist's audited fields (one list)
    failures.py    the delivery log's error classes
    engine.py      Engine: device state -> events; the scan; escalation
    emit.py        an event stored once, with a delivery per matching target
    deliveries.py  Deliveries: claim, record attempts, back-off, the dead-letter list
    worker.py      Notifier: the background thread that observes, scans and sends

docs/notifications.md is the operator's description.
"""

from trueup.server.service.notify.allowlist import Allowlists
from trueup.server.service.notify.deliveries import Deliveries
from trueup.server.service.notify.engine import Engine
from trueup.server.service.notify.routing import Routing
from trueup.server.service.notify.worker import Notifier, sign, verify

__all__ = ["Allowlists", "Deliveries", "Engine", "Notifier", "Routing", "sign", "verify"]
