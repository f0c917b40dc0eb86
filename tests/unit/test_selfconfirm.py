"""The agent confirms a control-plane revision itself, or lets its window roll it back.

FakeNetlink at the system/ seam, a fake clock, the real reconcile loop and the
agent's own management readiness: no root, no waiting.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from tests.unit.test_loop import Rig
from trueup.agent.cpclient import DesiredRevision, report_from_status
from trueup.agent.cpsync import SyncLoop
from trueup.agent.process import Agent
from trueup.agent.selfconfirm import SelfConfirm
from trueup.cli.output import render_status
from trueup.journal.confirm import read_outcome, read_pending
from trueup.model.document import parse_document
from trueup.reconcile.status import gather
from trueup.system.netlink import NetlinkError

SPARE = "203.0.113.7/24"
SECOND = parse_document(base_document(routes=[], interfaces=[{"name": "lan0"}])).with_version(2)


class Contact:
    """What the control-plane client knows: when a request it answered was last sent."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.problem: str | None = None
        self.asked = 0

    def ask(self) -> None:
        self.asked += 1


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path)
    first = parse_document(base_document(routes=[])).with_version(1)
    assert rig.requests.apply(first, actor="control-plane", origin="control-plane")["ok"]
    return rig


def _agent(rig: Rig) -> Agent:
    """An agent whose management readiness is computed from the rig's fake kernel."""
    agent = Agent(rig.state.root)
    agent.engine = rig.engine
    agent.loop = rig.loop
    agent.listeners = {"unix": {"path": "agent.sock", "state": "serving"}}
    return agent


def _confirmer(rig: Rig, contact: Contact) -> SelfConfirm:
    return SelfConfirm(
        rig.loop,
        management=_agent(rig).management_health,
        contact=lambda: contact.at,
        contact_problem=lambda: contact.problem,
        ask_contact=contact.ask,
    )


def _pulled(rig: Rig, window: float = 30) -> dict[str, Any]:
    """A control-plane revision with a confirmation window, as the wiring applies it."""
    return rig.requests.apply(
        SECOND, actor="control-plane", origin="control-plane", confirm_within=window
    )


def test_management_ready_and_the_control_plane_reached_confirms_it(rig: Rig) -> None:
    contact = Contact()
    confirmer = _confirmer(rig, contact)
    assert _pulled(rig)["pending_confirmation"]["version"] == 2
    contact.at = rig.clock() - 1  # a report sent before the apply proves nothing
    waiting = confirmer.check()
    assert waiting is not None and "the control plane reached after the apply" in waiting
    assert "management ready" not in waiting
    assert contact.asked == 1  # one more round trip asked for at once
    record = rig.loop.status_inputs()["extra"]["confirmation"]
    assert record["state"] == "pending" and record["version"] == 2
    assert record["deadline"] == rig.clock() + 30 and record["reason"] == waiting

    rig.clock.advance(2)
    contact.at = rig.clock()  # a report the control plane answered, after the apply
    assert confirmer.check() is None
    assert read_pending(rig.state) is None
    outcome = read_outcome(rig.state)
    assert outcome is not None and outcome["state"] == "confirmed" and outcome["version"] == 2
    assert "management ready and the control plane reached" in outcome["reason"]
    assert [r["actor"] for r in rig.audit("confirmed")] == ["agent-health"]
    rig.clock.advance(60)
    rig.loop.run_pass()
    assert rig.state.applied().version == 2  # kept: the window no longer applies


def test_the_window_passing_without_the_control_plane_rolls_back_with_the_reason(
    rig: Rig,
) -> None:
    contact = Contact()
    contact.problem = "report: ConnectTimeout"
    confirmer = _confirmer(rig, contact)
    assert _pulled(rig)["ok"]
    assert not rig.has_address()
    for _ in range(3):
        rig.clock.advance(5)
        waiting = confirmer.check()
        assert waiting is not None and "last error: report: ConnectTimeout" in waiting
    rig.clock.advance(16)
    rig.loop.run_pass()  # the loop's confirm-timeout, the one rollback path
    assert rig.state.applied().version == 3
    assert rig.state.applied().origin == "confirm-timeout"
    assert rig.has_address()
    outcome = read_outcome(rig.state)
    assert outcome is not None and outcome["state"] == "rolled-back"
    assert outcome["version"] == 2 and outcome["rollback_to"] == 1
    assert outcome["rolled_back_to_version"] == 3
    assert "still waiting for: the control plane reached after the apply" in outcome["reason"]
    assert confirmer.check() is None  # nothing left to confirm
    # The report carries it; a restarted agent still knows it.
    status = {"versions": {"applied": 3}, **rig.loop.status_inputs()["extra"]}
    report = report_from_status(status)
    assert report["confirmation"]["state"] == "rolled-back"
    assert report["confirmation"]["deadline"] == outcome["deadline"]
    assert rig.new_loop().confirmation.record() == outcome
    # With the agent stopped, the CLI's status says it too.
    text = render_status(gather(rig.engine))
    assert "last confirmation: version 2 rolled-back: the confirmation window passed" in text


def test_management_not_ready_is_waited_for_even_with_the_control_plane_reached(
    rig: Rig,
) -> None:
    contact = Contact()
    confirmer = _confirmer(rig, contact)
    assert _pulled(rig)["ok"]
    contact.at = rig.clock() + 1
    rig.net.del_address("mgmt0", "198.51.100.2/24")
    waiting = confirmer.check()
    assert waiting == "management ready (missing 198.51.100.2/24)"
    assert read_pending(rig.state) is not None
    rig.net.add_address("mgmt0", "198.51.100.2/24")
    assert confirmer.check() is None
    assert read_outcome(rig.state)["state"] == "confirmed"  # type: ignore[index]


def test_an_operators_confirm_within_is_left_to_the_operator(rig: Rig) -> None:
    contact = Contact()
    contact.at = rig.clock() + 100
    confirmer = _confirmer(rig, contact)
    local = parse_document(base_document(routes=[], interfaces=[{"name": "lan0"}]))
    assert rig.requests.apply(local, actor="ops", confirm_within=30, override="test")["ok"]
    assert confirmer.check() is None
    assert read_pending(rig.state) is not None
    record = rig.loop.confirmation.record()
    assert record is not None and record["reason"] == "`trueup confirm`"


class FakeClient:
    url = "http://cp.test"

    def __init__(self, revisions: list[DesiredRevision]) -> None:
        self.revisions = revisions

    def wait_for_revision(self, after: int, wait: float) -> DesiredRevision | None:
        return self.revisions.pop(0) if self.revisions else None

    def report(self, payload: dict[str, Any]) -> None:
        pass


def test_the_sync_loop_hands_over_the_window_only_when_the_revision_has_one() -> None:
    calls: list[tuple[int, float | None]] = []

    def apply(document: dict[str, Any], version: int, **kwargs: Any) -> None:
        calls.append((version, kwargs.get("confirm_within")))
        if version == 2:
            sync.stop(timeout=0)

    client = FakeClient([DesiredRevision(1, {}), DesiredRevision(2, {}, 15.0)])
    sync = SyncLoop(client, apply, dict, long_poll_seconds=0)  # type: ignore[arg-type]
    sync._pull()
    assert calls == [(1, None), (2, 15.0)]
    assert sync.last_contact_at is not None and sync.connected


@pytest.mark.parametrize("value", [None, 0, -5, True, "15", 86401])
def test_a_window_that_is_not_a_positive_number_of_seconds_is_no_window(value: Any) -> None:
    from trueup.agent.cpclient import _window

    assert _window(value) is None
    assert _window(15) == 15.0


def test_a_partial_apply_is_never_confirmed_by_the_agent(rig: Rig) -> None:
    contact = Contact()
    contact.at = rig.clock() + 100
    confirmer = _confirmer(rig, contact)
    assert _pulled(rig)["ok"]
    pending = rig.loop.confirmation.self_pending()
    assert pending is not None and pending["verified"] is True  # this apply committed all
    pending["verified"] = False  # as a partial apply records it
    waiting = confirmer.check()
    assert waiting is not None and waiting.startswith("a verified apply")
    rig.clock.advance(31)
    rig.loop.run_pass()
    assert read_outcome(rig.state)["state"] == "rolled-back"  # type: ignore[index]


def test_a_windowed_revision_whose_apply_fails_is_reported_rolled_back(rig: Rig) -> None:
    rig.net.fail_on["add address"] = NetlinkError("add address", "busy", errno.EBUSY)
    failing = base_document(routes=[], interfaces=[{"name": "lan0", "addresses": [SPARE]}])
    result = rig.requests.apply(
        parse_document(failing).with_version(2),
        actor="control-plane",
        origin="control-plane",
        confirm_within=30,
    )
    assert not result["ok"]
    assert read_pending(rig.state) is None and rig.state.applied().version == 1
    outcome = read_outcome(rig.state)
    assert outcome is not None and outcome["state"] == "rolled-back" and outcome["version"] == 2
    assert outcome["reason"].startswith("the apply failed and its transaction rolled back")
    assert "busy" in outcome["reason"]


def test_a_pending_confirmation_shows_the_same_until_what_it_waits_for_changes(rig: Rig) -> None:
    assert _pulled(rig)["ok"]
    rig.loop.run_pass()
    first = rig.loop.view().operator_digest()
    rig.clock.advance(3)
    rig.loop.run_pass()
    assert rig.loop.view().operator_digest() == first  # no report asked for by the clock alone
    rig.loop.note_confirmation_waiting(2, "management ready (missing 198.51.100.2/24)")
    assert rig.loop.view().operator_digest() != first


def test_a_firewall_that_drops_the_api_is_never_confirmed_by_the_agent_itself(
    tmp_path: Path,
) -> None:
    # Management stays ready (the listener serves) and the control plane stays reached:
    # only a client elsewhere would see the API cut off. The agent leaves it to an
    # operator, so unconfirmed it rolls back at its deadline.
    from tests.unit.test_firewall import CANONICAL, SAFE, _firewall
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.firewall import FirewallSubsystem
    from trueup.subsystems.registry import default_subsystems
    from trueup.system.fake import FakeNftables

    rig = Rig(tmp_path)
    nft = FakeNftables()
    nft.canonical.update(CANONICAL)
    subsystems = [
        FirewallSubsystem(nft) if s.name == "firewall" else s for s in default_subsystems()
    ]
    rig.engine = Engine(rig.state, subsystems, netlink_factory=lambda: rig.net, nft=nft)
    rig.loop = rig.new_loop()
    first = parse_document(base_document(routes=[], firewall=SAFE)).with_version(1)
    assert rig.requests.apply(first, actor="control-plane", origin="control-plane")["ok"]
    dropping = _firewall("tcp dport 7443 drop", *SAFE["chains"][0]["rules"], policy="accept")
    second = parse_document(base_document(routes=[], firewall=dropping)).with_version(2)
    pulled = rig.requests.apply(
        second, actor="control-plane", origin="control-plane", confirm_within=30
    )
    assert pulled["ok"] and pulled["pending_confirmation"]["version"] == 2

    contact = Contact()
    contact.at = rig.clock() + 1  # the control plane answers after the apply
    confirmer = _confirmer(rig, contact)
    rig.clock.advance(2)
    waiting = confirmer.check()
    assert waiting is not None and waiting.startswith("an operator's `trueup confirm`: ")
    assert "spec.firewall.chains[input].rules[0] drops new connections" in waiting
    assert "management ready" not in waiting and "control plane reached" not in waiting
    assert read_pending(rig.state) is not None  # not confirmed
    rig.clock.advance(30)
    rig.loop.run_pass()
    assert rig.state.applied().origin == "confirm-timeout"
    outcome = read_outcome(rig.state)
    assert outcome is not None and outcome["state"] == "rolled-back"
    assert "an operator's `trueup confirm`" in outcome["reason"]

    # A firewall that keeps the API reachable is confirmed by the agent as before.
    ssh = _firewall(*SAFE["chains"][0]["rules"], "tcp dport 22 accept")
    kept = parse_document(base_document(routes=[], firewall=ssh)).with_version(9)
    assert rig.requests.apply(
        kept, actor="control-plane", origin="control-plane", confirm_within=30
    )["ok"]
    contact.at = rig.clock() + 1
    rig.clock.advance(2)
    assert confirmer.check() is None
    confirmed = read_outcome(rig.state)
    assert confirmed is not None and confirmed["state"] == "confirmed"
