"""The DHCP fence under a flood of real clients: no OFFER, no ACK, at any moment Kea runs.

A flooder in the client namespace sends DHCPDISCOVERs (and DHCPREQUESTs that
name the router and an address of the pool: the shortest way to a lease)
without pause, each from a new hardware address, and a packet socket on the
same interface records every DHCP answer that arrives. While the fence is
held, Kea is killed (SIGKILL of its verified pid: the agent's supervisor
starts it again) five times, three revisions reconfigure it (other
lifetimes, Kea's HA hook added, removed again) and the agent is started once
with Kea dead; each Kea process is sent packets from its start on. Not one OFFER or ACK may
arrive and Kea may hold no lease. Once the fence is lifted, a new client
gets a lease.

Run as a script (`python THIS flood IFACE RESULT`), this file is the flooder:
it runs until its stdin closes, keeps its progress (packets sent) in
RESULT.progress and writes RESULT (JSON) at the end.

Every namespace and process started here is removed by name or PID: the
namespaces by the `Router` fixture and `DhcpRouter`, Kea by its verified pid,
the flooder by its PID.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.integration.test_dhcp import HA, DhcpRouter, dhcp_document, wait_until
from tests.routers import REPO, Router, require_root, sh
from trueup.system.kealeases import KeaSocketError, kea_command, leases_from_memfile

SERVER = "203.0.113.1"
CLIENT = "203.0.113.250/24"  # outside the pool: the flooder's own address, to send from
POOL = [f"203.0.113.{host}" for host in range(100, 151)]
KILLS = 5
PER_KEA = 60  # packets sent to each Kea process after it answered, at least
DISCOVERS = 500  # DHCPDISCOVERs in all, at least
WAIT = 120.0  # a generous bound for a loaded 2-core machine

# -- the flooder (runs inside the client namespace) ------------------------------
DISCOVER, OFFER, REQUEST, ACK = 1, 2, 3, 5
MAGIC = b"\x63\x82\x53\x63"


def _packet(kind: int, mac: bytes, xid: int, requested: str | None) -> bytes:
    # op, htype, hlen, hops, xid, secs, flags (broadcast), ciaddr, yiaddr, siaddr, giaddr
    header = struct.pack("!BBBBIHH4s4s4s4s", 1, 1, 6, 0, xid, 0, 0x8000, *([bytes(4)] * 4))
    chaddr = mac + bytes(10)
    options = bytes([53, 1, kind])
    if requested is not None:
        options += bytes([50, 4]) + socket.inet_aton(requested)
        options += bytes([54, 4]) + socket.inet_aton(SERVER)
    options += bytes([55, 3, 1, 3, 6, 255])
    return header + chaddr + bytes(64 + 128) + MAGIC + options


def _answer(frame: bytes) -> dict[str, Any] | None:
    """A DHCP answer (server port 67 to client port 68) in an Ethernet frame, or None."""
    if len(frame) < 14 + 20 + 8 + 240 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != 17:
        return None
    sport, dport = struct.unpack("!HH", ip[ihl : ihl + 4])
    if sport != 67 or dport != 68:
        return None
    dhcp = ip[ihl + 8 :]
    if dhcp[236:240] != MAGIC:
        return None
    kind = None
    options = dhcp[240:]
    i = 0
    while i < len(options) and options[i] != 255:
        if options[i] == 0:
            i += 1
            continue
        if i + 1 >= len(options):
            break
        code, length = options[i], options[i + 1]
        if code == 53 and length >= 1 and i + 2 < len(options):
            kind = options[i + 2]
        i += 2 + length
    return {
        "type": kind,
        "yiaddr": socket.inet_ntoa(dhcp[16:20]),
        "chaddr": dhcp[28:34].hex(":"),
        "at": time.time(),
    }


def flood(interface: str, result: Path) -> None:
    stop = threading.Event()
    answers: list[dict[str, Any]] = []
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    sniffer.bind((interface, 0))

    def sniff() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([sniffer], [], [], 0.2)
            if not ready:
                continue
            frame, address = sniffer.recvfrom(65535)
            if address[2] == socket.PACKET_OUTGOING:
                continue
            answer = _answer(frame)
            if answer is not None:
                answers.append(answer)

    def watch_stdin() -> None:
        sys.stdin.read()  # returns when the test closes it
        stop.set()

    threading.Thread(target=sniff, daemon=True).start()
    threading.Thread(target=watch_stdin, daemon=True).start()
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
    sender.bind(("0.0.0.0", 68))
    sent = {"discover": 0, "request": 0, "errors": 0}
    progress = Path(f"{result}.progress")
    rng = random.Random()
    while not stop.is_set():
        mac = bytes([0x02, 0x00, *rng.randbytes(4)])
        xid = rng.getrandbits(32)
        requesting = (sent["discover"] + sent["request"]) % 4 == 3
        packet = _packet(
            REQUEST if requesting else DISCOVER, mac, xid, rng.choice(POOL) if requesting else None
        )
        try:
            sender.sendto(packet, ("255.255.255.255", 67))
            sent["request" if requesting else "discover"] += 1
        except OSError:
            sent["errors"] += 1
        if sum(sent.values()) % 10 == 0:
            temporary = progress.with_name(progress.name + ".tmp")
            temporary.write_text(json.dumps(sent))
            os.replace(temporary, progress)
        time.sleep(0.005)
    time.sleep(0.5)  # answers to the last packets still arrive
    stop.set()
    result.write_text(json.dumps({"sent": sent, "answers": answers}))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "flood":
        sys.exit(f"usage: {sys.argv[0]} flood IFACE RESULT")
    flood(sys.argv[2], Path(sys.argv[3]))
    sys.exit(0)


# -- the test ------------------------------------------------------------------------
class Flooder:
    """The flooder process in the client namespace (stopped by closing its stdin, or its PID)."""

    def __init__(self, dhcp: DhcpRouter, result: Path) -> None:
        self.result = result
        self.progress = Path(f"{result}.progress")
        self.proc = subprocess.Popen(
            [
                "ip", "netns", "exec", dhcp.clientns,
                sys.executable, str(Path(__file__).resolve()), "flood", "lan0p", str(result),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=open(f"{result}.log", "w"),  # noqa: SIM115
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def sent(self) -> int:
        try:
            counts = json.loads(self.progress.read_text())
        except (OSError, ValueError):
            return 0
        return int(counts["discover"]) + int(counts["request"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_sent(self, more: int, what: str) -> None:
        target = self.sent() + more
        wait_until(lambda: self.sent() >= target or not self.alive(), what, WAIT)
        assert self.alive(), f"the flooder exited: {Path(f'{self.result}.log').read_text()}"

    def finish(self) -> dict[str, Any]:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.close()
        self.proc.wait(timeout=WAIT)
        return dict(json.loads(self.result.read_text()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def fenced_router(tmp_path: Path) -> Iterator[DhcpRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    dhcp = None
    try:
        dhcp = DhcpRouter(router)
        sh("ip", "-n", dhcp.clientns, "addr", "add", CLIENT, "dev", "lan0p")
        yield dhcp
    finally:
        if dhcp is not None:
            dhcp.close()
        router.close()


def answering(dhcp: DhcpRouter, other_than: int | None) -> int | None:
    """The pid of a Kea (not `other_than`) that answers on its control socket."""
    pid = dhcp.kea_pid()
    if pid is None or pid == other_than:
        return None
    try:
        answer = kea_command(dhcp.socket, "status-get", None, timeout=2.0)
    except KeaSocketError:
        return None
    return pid if answer.get("result") == 0 and dhcp.kea_pid() == pid else None


def kea_dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Killed but not yet reaped by its parent (the agent) counts as dead too.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")


def test_a_flood_gets_no_offer_while_fenced_through_kea_kills_and_an_agent_start(
    fenced_router: DhcpRouter, tmp_path: Path
) -> None:
    dhcp = fenced_router
    router = dhcp.router
    config = router.write("doc.yaml", dhcp_document())
    held = router.trueup("dhcp", "fence", "hold", "--reason", "full restore running")
    assert held.returncode == 0, held.stdout + held.stderr

    flooder = Flooder(dhcp, tmp_path / "flood.json")
    try:
        flooder.wait_sent(20, "the flood to start")
        # The agent's first start of Kea meets the flood already running.
        router.start_agent("--config", str(config), wait_started=False)
        pid = wait_until(lambda: answering(dhcp, None), "Kea answering", WAIT)
        flooder.wait_sent(PER_KEA, "packets to the first Kea")
        for kill in range(KILLS):
            os.kill(pid, signal.SIGKILL)
            previous = pid
            pid = wait_until(
                lambda previous=previous: answering(dhcp, previous),
                f"Kea restarted after kill {kill + 1}",
                WAIT,
            )
            flooder.wait_sent(PER_KEA, f"packets to Kea after kill {kill + 1}")
        # Reconfigurations while fenced: other lifetimes, Kea's HA hook added, and removed.
        for name, document in (
            ("lifetimes.yaml", dhcp_document(lifetimes={"valid": 1800})),
            ("ha.yaml", dhcp_document(ha=HA)),
            ("plain.yaml", dhcp_document()),
        ):
            applied = router.trueup("apply", str(router.write(name, document)), timeout=WAIT)
            assert applied.returncode == 0, applied.stdout + applied.stderr
            flooder.wait_sent(PER_KEA, f"packets after applying {name}")
        assert dhcp.kea_pid() == pid  # set over the socket, not by a restart
        # The agent stops (Kea goes on running, fenced), Kea dies, and a new agent starts it.
        router.stop_agents()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: kea_dead(pid), "the old Kea gone", WAIT)
        flooder.wait_sent(PER_KEA, "packets while Kea and the agent are down")
        router.start_agent(wait_started=False)
        previous = pid
        pid = wait_until(lambda: answering(dhcp, previous), "Kea started by the new agent", WAIT)
        flooder.wait_sent(PER_KEA, "packets to the new agent's Kea")
        services = router.api("/v1/health/services")["subsystems"]
        assert services["dhcp"]["health"] == "fenced", services["dhcp"]
        result = flooder.finish()
    finally:
        flooder.kill()

    assert result["sent"]["discover"] >= DISCOVERS, result["sent"]
    assert result["sent"]["errors"] == 0, result["sent"]
    answered = [a for a in result["answers"] if a["type"] in (OFFER, ACK)]
    assert answered == [], f"{len(answered)} answer(s) while fenced: {answered[:5]}"
    assert list(leases_from_memfile(4, dhcp.leases)) == []
    log = (dhcp.run / "kea-dhcp4.log").read_text()
    assert "DHCP4_LEASE_ALLOC" not in log and "DHCP4_LEASE_ADVERT" not in log

    lifted = router.trueup("dhcp", "fence", "lift", "--reason", "restore verified")
    assert lifted.returncode == 0, lifted.stdout + lifted.stderr
    address = dhcp.udhcpc()
    assert address in POOL, f"no lease after the lift ({address})"
    # Lifting is no change of configuration: the router is in sync with its document.
    wait_until(lambda: router.trueup("drift").returncode == 0, "no drift after the lift", WAIT)
