"""What happened stays visible: healed drift in text `status`/`drift`, trueup's writes named.

The reconcile loop over `FakeNetlink` (the `Rig` of `test_loop`), the event
path over real rtnetlink messages (`tests/fixtures/rtnl`), and the status
and drift renderers.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_loop import LAN, Rig
from tests.unit.test_rtnl_codec import NAMES, _datagrams
from trueup.cli.output import print_drift, render_status
from trueup.reconcile.status import build_status, drift_report
from trueup.system import ownwrites, rtnl
from trueup.system.events import NetlinkEvent, event_from_message
from trueup.system.fake import FakeNetlink


class NotifyingNetlink(FakeNetlink):
    """FakeNetlink that announces its address writes the way the kernel does: from our port.

    Each write is announced as the event source would (`event_from_message`
    marks a notification from one of this process's sockets as our own and
    asks `trueup.system.ownwrites` which write sent it); the writer it saw is
    kept in `writers`.
    """

    PORT = 77_777

    def __init__(self, rig: Rig) -> None:
        super().__init__({"mgmt0": 1500, "lan0": 1500})
        self.rig = rig
        self.writers: list[str | None] = []

    def add_address(self, ifname: str, prefix: str) -> None:
        super().add_address(ifname, prefix)
        now = time.time()
        writer = ownwrites.writer_at(now)
        self.writers.append(writer)
        self.rig.events.emit(
            NetlinkEvent(
                "address",
                "RTM_NEWADDR",
                self.rig.clock(),
                ifname=ifname,
                address=prefix,
                sender_port=self.PORT,
                own=True,
                writer=writer,
            )
        )


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path)
    net = NotifyingNetlink(rig)
    rig.net = net
    rig.engine.netlink_factory = lambda: net
    assert rig.apply()["ok"]
    return rig


def _status(rig: Rig) -> dict[str, Any]:
    return build_status(rig.engine, loop=rig.loop.view()).to_json()


def _heal_txn(rig: Rig) -> str:
    healed = [r for r in rig.audit("reconcile") if r["details"]["outcome"] == "healed"]
    return str(healed[-1]["details"]["txn"])


def test_a_healed_drift_stays_in_text_status_and_drift_with_who_and_which_heal(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.delete_address()
    assert rig.loop.run_pass().healed["addresses"]
    rig.loop.run_pass()  # in sync again: the record ends as the last drift
    txn = _heal_txn(rig)

    status = _status(rig)
    last = status["subsystems"]["addresses"]["last_drift"]
    assert last["healed_by"]["writer"] == f"trueup heal {txn}" and last["healed_by"]["txn"] == txn
    text = render_status(status)
    line = next(x for x in text.splitlines() if x.startswith("  addresses: healed "))
    assert f"by trueup heal {txn}" in line and "drifted since " in line, text
    assert re.search(r"healed \d\d:\d\d:\d\dZ \(\d+ s ago\)", line), line
    assert "path:       spec.interfaces[lan0].addresses" in text
    assert f"changed by: RTM_DELADDR lan0 {LAN} from ip (netlink port 4242)" in text

    report = drift_report(status)
    assert report["in_sync"] and report["last_drift"]["addresses"]["healed_by"]["txn"] == txn
    assert print_drift(report, "table") == 0
    out = capsys.readouterr().out
    assert out.startswith("in sync with version 1")
    assert "addresses: healed " in out and f"by trueup heal {txn}" in out
    assert "from ip (netlink port 4242)" in out
    assert json.loads(json.dumps(report))["last_drift"]  # -o json carries it too


def test_a_heals_own_notifications_name_the_heal_never_unknown(rig: Rig) -> None:
    rig.delete_address()
    assert rig.loop.run_pass().healed["addresses"]
    txn = _heal_txn(rig)
    net = rig.net
    assert isinstance(net, NotifyingNetlink)
    # The engine named its transaction while it wrote.
    assert net.writers[-1] == f"trueup heal {txn}"

    # The address goes again: the new record shows the heal's own write before it as trueup's.
    rig.delete_address(sender_port=4243)
    rig.loop.run_pass()
    records = [
        r
        for r in rig.audit("reconcile")
        if r["details"]["outcome"] == "healed" and r["details"]["txn"] != txn
    ]
    attribution = records[-1]["details"]["attribution"]
    own = [a for a in attribution if a.get("own")]
    assert own and own[0]["sender"] == f"trueup heal {txn}", attribution
    text = render_status(_status(rig))
    assert "unknown" not in text


def test_apply_names_its_own_writes_as_the_apply() -> None:
    with ownwrites.writing("trueup apply 20261130T100000Z-abc123"):
        assert ownwrites.writer_at(time.time()) == "trueup apply 20261130T100000Z-abc123"
    # Read a little after the write: still the apply's.
    assert ownwrites.writer_at(time.time()) == "trueup apply 20261130T100000Z-abc123"
    assert ownwrites.writer_at(time.time() + ownwrites.GRACE + 1) is None


def test_a_kernel_notification_from_our_own_socket_is_named_by_the_write_under_way() -> None:
    """The event path itself, over a real RTM_NEWADDR: our port → the transaction's name."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        rtnl.note_own_port(sock)
        port = int(sock.getsockname()[0])
    finally:
        sock.close()
    message = next(
        (t, chunk)
        for datagram in _datagrams("events-changes.bin")
        for t, _f, _s, _p, chunk in rtnl.split(datagram)
        if rtnl.MESSAGE_NAMES.get(t) == "RTM_NEWADDR"
    )
    with ownwrites.writing("trueup rollback 20261130T100000Z-def456"):
        event = event_from_message(*message, port, time.time(), NAMES)
    assert event is not None and event.own
    shown = event.to_json()
    assert shown["sender"] == "trueup rollback 20261130T100000Z-def456" and shown["own"]
    # Outside any named write (a fast boot's management), still trueup's, never "unknown".
    later = event_from_message(*message, port, time.time() + ownwrites.GRACE + 1, NAMES)
    assert later is not None and later.to_json()["sender"] == ownwrites.OUTSIDE


def test_an_acknowledgement_shows_subsystem_until_by_and_why(rig: Rig) -> None:
    answer = rig.loop.acknowledge("addresses", 3600, "lab test of lan0", actor="cli:0")
    assert answer["ok"]
    text = render_status(_status(rig))
    line = next(x for x in text.splitlines() if x.startswith("  addresses: healing paused"))
    assert f"until {answer['until']} (in " in line
    assert "by cli:0: lab test of lan0" in line and "trueup ack addresses --clear" in line
