"""Announcing an address to the neighbours: gratuitous ARP (IPv4), unsolicited NA (IPv6).

Why: a neighbour that asked for the management address while it was absent
waits for its own ARP retry timer (about a second on Linux) before it tries
again, and one that cached another MAC — after a hardware swap, or an address
moved between interfaces or routers — keeps sending to the wrong place until
its entry ages out (minutes). Announcing the address the moment it is added
(and when its link comes up) updates every neighbour that already has an
entry, so the operator's laptop, the monitoring system and the gateway reach
the router at once. This is what keepalived does when it takes a virtual
address (`garp_master_repeat`); trueup does it for the management address
too.

Each announcement is repeated a few times, spaced, on a background thread:
the first packet can be lost, and an IPv6 address can only be used as a
source once duplicate address detection has finished.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import threading
import time
from typing import Protocol

__all__ = ["Announcer", "KernelAnnouncer", "NoAnnouncer", "arp_frame", "na_message"]


_ETH_P_ARP = 0x0806
_SIOCGIFHWADDR = 0x8927
_BROADCAST = b"\xff" * 6
_ALL_NODES = "ff02::1"
# Sent at these delays (seconds) after the address appears.
SCHEDULE = (0.0, 0.2, 1.0, 2.5)


class Announcer(Protocol):
    def announce(self, ifname: str, prefix: str) -> None:
        """Tell the neighbours on `ifname` that `prefix`'s address is here (never raises)."""
        ...


def _mac(ifname: str) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        info = fcntl.ioctl(sock.fileno(), _SIOCGIFHWADDR, struct.pack("256s", ifname.encode()))
    return info[18:24]


def arp_frame(mac: bytes, address: str) -> bytes:
    """A gratuitous ARP request: sender and target are the address, to everyone."""
    ip = ipaddress.IPv4Address(address).packed
    ethernet = _BROADCAST + mac + struct.pack("!H", _ETH_P_ARP)
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + ip + b"\x00" * 6 + ip
    return ethernet + arp


def na_message(mac: bytes, address: str) -> bytes:
    """An unsolicited neighbour advertisement (override set) with the target link-layer option.

    The kernel fills in the ICMPv6 checksum on a raw ICMPv6 socket.
    """
    target = ipaddress.IPv6Address(address).packed
    header = struct.pack("!BBHI", 136, 0, 0, 0x20000000)  # type NA, override flag
    option = struct.pack("!BB", 2, 1) + mac  # target link-layer address, 8 bytes
    return header + target + option


class NoAnnouncer:
    """For a netlink that is not the kernel's (a fake): there are no neighbours to tell."""

    def announce(self, ifname: str, prefix: str) -> None:
        del ifname, prefix


class KernelAnnouncer:
    """Sends the announcements from the network namespace this process runs in."""

    def __init__(self, schedule: tuple[float, ...] = SCHEDULE) -> None:
        self.schedule = schedule

    def announce(self, ifname: str, prefix: str) -> None:
        address = prefix.split("/")[0]
        thread = threading.Thread(
            target=self._send_all, args=(ifname, address), name="trueup-announce", daemon=True
        )
        thread.start()

    def _send_all(self, ifname: str, address: str) -> None:
        started = time.monotonic()
        for delay in self.schedule:
            wait = started + delay - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                self.send_once(ifname, address)
            except OSError as exc:
                # A link that is down, an IPv6 address still in duplicate address
                # detection: the next one in the schedule will do.
                # Imported here: the startup fast path imports this module before
                # anything else, and `logging` would cost it more than it does.
                import logging

                logging.getLogger("trueup.announce").debug(
                    "announcing %s on %s: %s", address, ifname, exc
                )

    @staticmethod
    def send_once(ifname: str, address: str) -> None:
        mac = _mac(ifname)
        if ipaddress.ip_address(address).version == 4:
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ARP)) as raw:
                raw.bind((ifname, _ETH_P_ARP))
                raw.send(arp_frame(mac, address))
            return
        index = socket.if_nametoindex(ifname)
        with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as icmp:
            icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
            icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
            icmp.bind((address, 0, 0, index))
            icmp.sendto(na_message(mac, address), (_ALL_NODES, 0, 0, index))
