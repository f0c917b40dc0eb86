"""A fake `wg` (and `ip link add … type wireguard`) for unit tests, at the Runner seam.

It keeps each interface's private key, listen port and peers in memory and
answers `wg show NAME dump`, `wg setconf|syncconf NAME FILE` (reading the
file while the command runs, as `wg` does; `syncconf` keeps a live peer's
preshared key and keepalive when the file omits them, as `wg` does, and the
all-zero preshared key is none), `wg set NAME peer KEY remove`,
`wg set NAME peer KEY persistent-keepalive N`
and `wg pubkey` (a made-up derivation: `pub(KEY)`). An interface exists when
its `wireguard-go` daemon runs in the `FakeDaemons` given (its TUN device is
then added to the `FakeNetlink` given), or after `ip link add` when `kernel`
is set.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from trueup.system.fake import FakeDaemons, FakeNetlink
from trueup.system.netlink import LinkInfo
from trueup.system.runner import Completed

__all__ = ["FakePeer", "FakeWg", "fake_pubkey"]


def fake_pubkey(private: str) -> str:
    """A stand-in for Curve25519: a stable, valid-looking public key for `private`."""
    return base64.b64encode(hashlib.sha256(private.encode()).digest()).decode()


@dataclass
class FakePeer:
    preshared: str | None = None
    endpoint: str | None = None
    allowed_ips: list[str] = field(default_factory=list)
    keepalive: int = 0
    latest_handshake: int = 0
    rx: int = 0
    tx: int = 0


@dataclass
class FakeInterface:
    private: str | None = None
    port: int = 0
    peers: dict[str, FakePeer] = field(default_factory=dict)


class FakeWg:
    def __init__(self, daemons: FakeDaemons, netlink: FakeNetlink, *, kernel: bool = False) -> None:
        self.daemons = daemons
        self.netlink = netlink
        self.kernel = kernel
        self.interfaces: dict[str, FakeInterface] = {}
        self.calls: list[tuple[str, ...]] = []
        self.inputs: list[str] = []
        self.conf_seen: list[str] = []

    def _present(self, name: str) -> bool:
        if self.daemons.running(f"wg-{name}"):
            self.interfaces.setdefault(name, FakeInterface())
            if name not in self.netlink.link_state:
                index = 100 + len(self.netlink.link_state)
                self.netlink.link_state[name] = LinkInfo(name, index, "down", 1420, False)
            return True
        if name in self.interfaces and not self.kernel:
            del self.interfaces[name]  # wireguard-go gone: its TUN device went with it
            self.netlink.link_state.pop(name, None)
            self.netlink.addrs = [a for a in self.netlink.addrs if a.ifname != name]
        return name in self.interfaces

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        del timeout
        key = tuple(argv)
        self.calls.append(key)
        if input is not None:
            self.inputs.append(input)
        ok = Completed(key, 0, "", "")
        if argv[:2] == ["wg", "pubkey"]:
            return Completed(key, 0, fake_pubkey((input or "").strip()) + "\n", "")
        if argv[:3] == ["ip", "link", "add"]:
            if not self.kernel:
                return Completed(key, 2, "", "Error: Unknown device type.\n")
            self.interfaces.setdefault(argv[3], FakeInterface())
            self.netlink.link_state[argv[3]] = LinkInfo(argv[3], 50, "down", 1420, False)
            return ok
        if argv[:3] == ["ip", "link", "del"]:
            self.interfaces.pop(argv[3], None)
            self.netlink.link_state.pop(argv[3], None)
            return ok
        name = argv[2] if len(argv) > 2 else ""
        if argv[0] != "wg" or not self._present(name):
            return Completed(key, 1, "", "Unable to access interface: No such device\n")
        interface = self.interfaces[name]
        if argv[1] == "show":
            return Completed(key, 0, self.dump(name), "")
        if argv[1] in ("setconf", "syncconf"):
            text = Path(argv[3]).read_text()
            self.conf_seen.append(text)
            self._load(interface, text, keep=argv[1] == "syncconf")
            return ok
        if argv[1] == "set" and argv[3] == "peer" and argv[5] == "remove":
            interface.peers.pop(argv[4], None)
            return ok
        if argv[1] == "set" and argv[3] == "peer" and argv[5] == "persistent-keepalive":
            interface.peers.setdefault(argv[4], FakePeer()).keepalive = int(argv[6])
            return ok
        return Completed(key, 1, "", "fake wg: unsupported\n")

    def _load(self, interface: FakeInterface, text: str, *, keep: bool = False) -> None:
        peers: dict[str, FakePeer] = {}
        current: FakePeer | None = None
        for line in text.splitlines():
            if "=" not in line:
                current = None if line.strip() != "[Peer]" else current
                continue
            field_, _, value = (part.strip() for part in line.partition("="))
            if field_ == "PrivateKey":
                interface.private = value
            elif field_ == "ListenPort":
                interface.port = int(value)
            elif field_ == "PublicKey":
                old = interface.peers.get(value)
                current = FakePeer(latest_handshake=old.latest_handshake if old else 0)
                if keep and old is not None:
                    current.preshared, current.keepalive = old.preshared, old.keepalive
                peers[value] = current
            elif current is not None and field_ == "PresharedKey":
                current.preshared = None if value.rstrip("=").strip("A") == "" else value
            elif current is not None and field_ == "Endpoint":
                current.endpoint = value
            elif current is not None and field_ == "AllowedIPs":
                current.allowed_ips = [v.strip() for v in value.split(",")]
            elif current is not None and field_ == "PersistentKeepalive":
                current.keepalive = int(value)
        interface.peers = peers

    def dump(self, name: str) -> str:
        interface = self.interfaces[name]
        private = interface.private or "(none)"
        public = fake_pubkey(interface.private) if interface.private else "(none)"
        lines = [f"{private}\t{public}\t{interface.port}\toff"]
        for key, peer in interface.peers.items():
            allowed = ",".join(peer.allowed_ips) or "(none)"
            lines.append(
                "\t".join(
                    [
                        key,
                        peer.preshared or "(none)",
                        peer.endpoint or "(none)",
                        allowed,
                        str(peer.latest_handshake),
                        str(peer.rx),
                        str(peer.tx),
                        str(peer.keepalive) if peer.keepalive else "off",
                    ]
                )
            )
        return "\n".join(lines) + "\n"
