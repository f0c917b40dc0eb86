"""Announcing the management address: frames, and when the management subsystem sends them."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.system.announce import arp_frame, na_message
from trueup.system.fake import FakeAnnouncer, FakeNetlink

MAC = bytes.fromhex("020000000042")


def test_gratuitous_arp_names_the_address_as_sender_and_target() -> None:
    frame = arp_frame(MAC, "198.51.100.2")
    assert frame[:6] == b"\xff" * 6 and frame[6:12] == MAC
    assert struct.unpack("!H", frame[12:14])[0] == 0x0806
    htype, ptype, hlen, plen, op = struct.unpack("!HHBBH", frame[14:22])
    assert (htype, ptype, hlen, plen, op) == (1, 0x0800, 6, 4, 1)
    assert frame[22:28] == MAC
    assert frame[28:32] == frame[38:42] == bytes([198, 51, 100, 2])


def test_unsolicited_na_overrides_with_the_link_layer_address() -> None:
    message = na_message(MAC, "2001:db8::2")
    kind, code, _checksum, flags = struct.unpack("!BBHI", message[:8])
    assert (kind, code, flags) == (136, 0, 0x20000000)
    assert message[8:24] == bytes.fromhex("20010db8000000000000000000000002")
    assert message[24:26] == b"\x02\x01" and message[26:32] == MAC


def test_management_addresses_are_announced_when_added_and_when_the_link_comes_up(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    announcer = FakeAnnouncer()
    engine = Engine(state, netlink_factory=lambda: kernel, announcer=announcer)
    assert engine.apply_document(parse_document(base_document(routes=[]))).ok
    assert announcer.announced == [("mgmt0", "198.51.100.2/24")]
    announcer.announced.clear()
    kernel.set_link("mgmt0", state="down")
    assert engine.apply_document(parse_document(base_document(routes=[])), kind="reconcile").ok
    assert announcer.announced == [("mgmt0", "198.51.100.2/24")]
    # lan0's addresses are not management's: never announced by trueup.
    assert all(ifname == "mgmt0" for ifname, _ in announcer.announced)
