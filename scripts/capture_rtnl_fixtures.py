"""Capture the rtnetlink fixtures in tests/fixtures/rtnl/ from a real kernel; time the codec on them.

`python -m scripts.capture_rtnl_fixtures` (root) creates the network
namespace `trueup-capture-<pid>`, runs itself inside it (`--inside DIR`) and
removes the namespace by name at the end. Inside, a socket subscribed to the
groups `KernelEventSource` uses records every notification while `ip` builds
veth links, IPv4/IPv6 addresses and routes (main table, tables 100 and 1000,
multipath, blackhole); then the dump replies to RTM_GETLINK, RTM_GETADDR and
RTM_GETROUTE (per family) are recorded; then the notifications for a few
changes (routes deleted and added, an address added and removed, a link
down). Files hold the datagrams as received, back to back; `index.json` says
what each holds and where each datagram ends. Only documentation addresses
are used (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32).

`python -m scripts.capture_rtnl_fixtures --measure` (no root) times the
decoding of the fixtures and of 1,000 RTM_NEWADDR messages with
`trueup.system.rtnl` and with pyroute2's parser — the figure written next to
the codec.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import select
import socket
import struct
import subprocess
import sys
import time
import timeit
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "rtnl"

NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE = 18, 22, 26
TYPE_NAMES = {
    2: "NLMSG_ERROR",
    3: "NLMSG_DONE",
    16: "RTM_NEWLINK",
    17: "RTM_DELLINK",
    20: "RTM_NEWADDR",
    21: "RTM_DELADDR",
    24: "RTM_NEWROUTE",
    25: "RTM_DELROUTE",
}

SETUP: list[tuple[str, ...]] = [
    ("link", "set", "lo", "up"),
    ("link", "add", "lan0", "type", "veth", "peer", "name", "lan0p"),
    ("link", "add", "wan0", "type", "veth", "peer", "name", "wan0p"),
    ("link", "set", "lan0", "mtu", "9000"),
    ("link", "set", "lan0p", "up"),
    ("link", "set", "wan0p", "up"),
    ("link", "set", "lan0", "up"),
    ("link", "set", "wan0", "up"),
    ("addr", "add", "203.0.113.1/24", "dev", "lan0"),
    ("addr", "add", "2001:db8:1::1/64", "dev", "lan0"),
    ("addr", "add", "198.51.100.2/24", "dev", "wan0"),
    ("addr", "add", "2001:db8:2::2/64", "dev", "wan0"),
    ("route", "add", "default", "via", "198.51.100.1"),
    ("route", "add", "192.0.2.0/24", "nexthop", "via", "203.0.113.254", "nexthop", "via", "203.0.113.253"),
    ("route", "add", "192.0.2.0/25", "via", "203.0.113.254", "table", "100"),
    ("route", "add", "192.0.2.64/26", "table", "100", "nexthop", "via", "203.0.113.254", "weight", "1", "nexthop", "via", "198.51.100.1", "weight", "3"),
    ("route", "add", "blackhole", "192.0.2.192/26", "table", "100"),
    ("route", "add", "192.0.2.128/25", "via", "203.0.113.253", "table", "1000", "metric", "50"),
    ("-6", "route", "add", "2001:db8:100::/48", "via", "2001:db8:1::fe"),
    ("-6", "route", "add", "2001:db8:200::/48", "via", "2001:db8:2::1", "table", "1000", "metric", "10"),
    ("-6", "route", "add", "2001:db8:300::/48", "nexthop", "via", "2001:db8:1::fe", "dev", "lan0", "nexthop", "via", "2001:db8:2::1", "dev", "wan0"),
]  # fmt: skip

CHANGES: list[tuple[str, ...]] = [
    ("route", "del", "192.0.2.128/25", "table", "1000", "metric", "50"),
    ("route", "del", "192.0.2.0/24"),
    ("-6", "route", "del", "2001:db8:200::/48", "table", "1000", "metric", "10"),
    ("route", "add", "198.51.100.128/25", "via", "203.0.113.250", "table", "100"),
    ("addr", "add", "203.0.113.9/24", "dev", "lan0"),
    ("addr", "del", "203.0.113.9/24", "dev", "lan0"),
    ("-6", "addr", "del", "2001:db8:1::1/64", "dev", "lan0"),
    ("link", "set", "wan0", "down"),
]


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {proc.stderr.strip()}")


def _messages(data: bytes) -> Counter[str]:
    counts: Counter[str] = Counter()
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type = struct.unpack_from("=IH", data, offset)
        counts[TYPE_NAMES.get(msg_type, str(msg_type))] += 1
        offset += max(16, (length + 3) & ~3)
    return counts


# -- inside the namespace ---------------------------------------------------------
class _Listener:
    """A socket on the groups KernelEventSource joins; keeps every datagram."""

    def __init__(self) -> None:
        from trueup.system.events import GROUPS

        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.sock.bind((0, GROUPS))
        self.groups = GROUPS
        self.datagrams: list[bytes] = []

    def drain(self, quiet: float) -> None:
        """Read until nothing arrives for `quiet` seconds."""
        while select.select([self.sock], [], [], quiet)[0]:
            self.datagrams.append(self.sock.recv(1 << 20))

    def take(self) -> list[bytes]:
        out, self.datagrams = self.datagrams, []
        return out


def _dump(msg_type: int, body: bytes) -> list[bytes]:
    """The datagrams of one dump reply, up to and including NLMSG_DONE."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.bind((0, 0))
        header = struct.pack("=IHHII", 16 + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
        sock.send(header + body)
        out = []
        while True:
            data = sock.recv(1 << 20)
            out.append(data)
            if _messages(data)["NLMSG_DONE"] or _messages(data)["NLMSG_ERROR"]:
                return out


def _write(directory: Path, name: str, datagrams: list[bytes], **about: Any) -> dict[str, Any]:
    data = b"".join(datagrams)
    (directory / name).write_bytes(data)
    return {
        **about,
        "datagrams": [len(d) for d in datagrams],
        "messages": dict(sorted(_messages(data).items())),
        "bytes": len(data),
    }


def inside(directory: Path) -> None:
    # DAD off: addresses are usable at once, and their notifications settle.
    for key in ("all", "default"):
        subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{key}.accept_dad=0"], check=True)
    listener = _Listener()
    for command in SETUP:
        _ip(*command)
    time.sleep(1.5)  # carrier changes reach rtnetlink through linkwatch, up to a second later
    listener.drain(quiet=1.0)
    setup = listener.take()

    af_unspec = struct.pack("=BxHiII", 0, 0, 0, 0, 0)
    files: dict[str, Any] = {
        "links.bin": _write(
            directory,
            "links.bin",
            _dump(RTM_GETLINK, af_unspec),
            path="dump",
            request="RTM_GETLINK, NLM_F_DUMP, ifinfomsg all zero (as KernelNetlink.links)",
        ),
        "addresses.bin": _write(
            directory,
            "addresses.bin",
            _dump(RTM_GETADDR, struct.pack("=BBBBI", 0, 0, 0, 0, 0)),
            path="dump",
            request="RTM_GETADDR, NLM_F_DUMP, ifaddrmsg all zero (as KernelNetlink.addresses)",
        ),
    }
    for family, name in ((socket.AF_INET, "routes4.bin"), (socket.AF_INET6, "routes6.bin")):
        files[name] = _write(
            directory,
            name,
            _dump(RTM_GETROUTE, struct.pack("=BBBBBBBBI", family, 0, 0, 0, 0, 0, 0, 0, 0)),
            path="dump",
            request=f"RTM_GETROUTE, NLM_F_DUMP, rtmsg family {family} (as KernelNetlink.routes)",
        )
    files["events-setup.bin"] = _write(
        directory,
        "events-setup.bin",
        setup,
        path="event",
        groups=hex(listener.groups),
        commands=[f"ip {' '.join(c)}" for c in SETUP],
        note="every notification while the state of the dumps was built",
    )
    for command in CHANGES:
        _ip(*command)
        listener.drain(quiet=0.3)
    listener.drain(quiet=1.0)
    files["events-changes.bin"] = _write(
        directory,
        "events-changes.bin",
        listener.take(),
        path="event",
        groups=hex(listener.groups),
        commands=[f"ip {' '.join(c)}" for c in CHANGES],
        note="every notification for these changes, made after the dumps",
    )
    version = subprocess.run(["ip", "-V"], capture_output=True, text=True, check=False)
    index = {
        "about": "rtnetlink messages from a real kernel for tests/unit/test_rtnl_codec.py; "
        "made by `python -m scripts.capture_rtnl_fixtures` (as root)",
        "captured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "iproute2": version.stdout.strip(),
        "byte_order": sys.byteorder,
        "files": files,
    }
    text = json.dumps(index, indent=2)
    # One line per list of datagram sizes: the index stays readable.
    text = re.sub(r"\[\s+([0-9,\s]+?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    (directory / "index.json").write_text(text + "\n")


def capture(directory: Path) -> None:
    if os.geteuid() != 0:
        sys.exit("capture_rtnl_fixtures: creating a network namespace needs root")
    directory.mkdir(parents=True, exist_ok=True)
    name = f"trueup-capture-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        inner = [sys.executable, "-m", "scripts.capture_rtnl_fixtures", "--inside", str(directory)]
        subprocess.run(
            ["ip", "netns", "exec", name, *inner],
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    for entry in sorted(directory.iterdir()):
        print(f"{entry.relative_to(REPO)}: {entry.stat().st_size} bytes")


# -- the measured reason for decoding by hand ---------------------------------------
def _best(statement: Any, number: int) -> float:
    """CPU seconds per call, best of 15 rounds (CPU time: other load on the host counts less)."""
    timer = timeit.Timer(statement, timer=time.process_time)
    return min(timer.repeat(number=number, repeat=15)) / number


def measure(directory: Path) -> None:
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    from trueup.system import rtnl

    names = {
        link.index: link.name
        for _t, _f, _s, _p, chunk in rtnl.split((directory / "links.bin").read_bytes())
        if (link := rtnl.decode_link(chunk)) is not None
    }
    addresses = [
        chunk
        for msg_type, _f, _s, _p, chunk in rtnl.split((directory / "addresses.bin").read_bytes())
        if msg_type == 20
    ]
    thousand = [addresses[i % len(addresses)] for i in range(1000)]

    def codec_addresses() -> None:
        for chunk in thousand:
            rtnl.decode_address(chunk, names)

    def pyroute2_addresses() -> None:
        for chunk in thousand:
            message = ifaddrmsg(chunk)
            message.decode()

    datagrams = []
    for name in ("links.bin", "addresses.bin", "routes4.bin", "routes6.bin"):
        datagrams.append((directory / name).read_bytes())
    messages = [(t, c) for data in datagrams for t, _f, _s, _p, c in rtnl.split(data)]
    ours = [(t, c) for t, c in messages if t in rtnl.MESSAGE_NAMES]

    def codec_fixtures() -> None:
        for msg_type, chunk in ours:
            rtnl.decode(msg_type, chunk, names)

    marshal = MarshalRtnl()

    def pyroute2_fixtures() -> None:
        for data in datagrams:
            for message in marshal.parse(data):  # a generator: nothing is decoded until read
                message.get("event")

    rows = [
        ("1,000 RTM_NEWADDR", "trueup.system.rtnl", _best(codec_addresses, 20)),
        ("1,000 RTM_NEWADDR", "pyroute2 ifaddrmsg().decode()", _best(pyroute2_addresses, 2)),
        (f"fixture dumps ({len(ours)} messages)", "trueup.system.rtnl", _best(codec_fixtures, 200)),
        (f"fixture dumps ({len(ours)} messages)", "pyroute2 MarshalRtnl.parse", _best(pyroute2_fixtures, 5)),
    ]  # fmt: skip
    print(f"Python {platform.python_version()}, {platform.machine()}, CPU time, best of 15")
    for what, how, seconds in rows:
        print(f"{what:32} {how:32} {seconds * 1000:8.2f} ms")
    print(f"ratio on 1,000 addresses: {rows[1][2] / rows[0][2]:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=FIXTURES)
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help="time decoding (no root)")
    args = parser.parse_args()
    if args.inside is not None:
        inside(args.inside)
    elif args.measure:
        measure(args.dir)
    else:
        capture(args.dir)


if __name__ == "__main__":
    main()
