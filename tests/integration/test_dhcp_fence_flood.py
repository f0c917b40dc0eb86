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
gets a lease. The same for DHCPv6: SOLICITs get no ADVERTISE while fenced,
and one right after the lift. And a fence class removed through Kea's
socket by someone else is set again by the agent.

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
import shutil
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
from trueup.subsystems.dhcp.keaconfig import has_fence, with_fence
from trueup.system.kea import kea_paths
from trueup.system.kealeases import KeaSocketError, kea_command, leases_from_memfile
from trueup.system.pidrecord import verified_pid

SERVER = "203.0.113.1"
CLIENT = "203.0.113.250/24"  # outside the pool: the flooder's own address, to send from
CLIENT6 = "fe80::250"  # the flooder's link-local address (no duplicate detection to wait for)
POOL = [f"203.0.113.{host}" for host in range(100, 151)]
KILLS = 5
PER_KEA = 60  # packets sent to each Kea process after it answered, at least
DISCOVERS = 500  # DHCPDISCOVERs in all, at least
WAIT = 120.0  # a generous bound for a loaded 2-core machine, for each event waited for
# Each test waits for a few dozen events (Kea restarts with the supervisor's back-off,
# agent starts, applies): the whole test gets a bound to match.
pytestmark = pytest.mark.timeout(900)

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


SOLICIT, ADVERTISE, REPLY = 1, 2, 7
ANSWERS = {4: (OFFER, ACK), 6: (ADVERTISE, REPLY)}


def _solicit(mac: bytes, xid: int) -> bytes:
    def option(code: int, data: bytes) -> bytes:
        return struct.pack("!HH", code, len(data)) + data

    return (
        bytes([SOLICIT])
        + xid.to_bytes(3, "big")
        + option(1, b"\x00\x03\x00\x01" + mac)  # client id: DUID-LL
        + option(8, bytes(2))  # elapsed time
        + option(3, mac[2:] + bytes(8))  # IA_NA: IAID, T1, T2
        + option(6, struct.pack("!H", 23))  # ORO: DNS servers
    )


def _answer6(data: bytes) -> dict[str, Any] | None:
    if len(data) < 4:
        return None
    return {"type": data[0], "xid": data[1:4].hex(), "at": time.time()}


def flood(family: int, interface: str, result: Path) -> None:
    """Send DISCOVERs and REQUESTs (4) or SOLICITs (6) until stdin closes; record every answer."""
    stop = threading.Event()
    answers: list[dict[str, Any]] = []
    if family == 4:
        sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        sniffer.bind((interface, 0))
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sender.bind(("0.0.0.0", 68))
    else:
        index = socket.if_nametoindex(interface)
        sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sender.bind((CLIENT6, 546, 0, index))
        sniffer = sender  # answers come to the client's link-local address, port 546

    def sniff() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([sniffer], [], [], 0.2)
            if not ready:
                continue
            data, address = sniffer.recvfrom(65535)
            if family == 4:
                if address[2] == socket.PACKET_OUTGOING:
                    continue
                answer = _answer(data)
            else:
                answer = _answer6(data)
            if answer is not None:
                answers.append(answer)

    def watch_stdin() -> None:
        sys.stdin.read()  # returns when the test closes it
        stop.set()

    threading.Thread(target=sniff, daemon=True).start()
    threading.Thread(target=watch_stdin, daemon=True).start()
    sent = {"discover": 0, "request": 0, "solicit": 0, "errors": 0}
    progress = Path(f"{result}.progress")
    rng = random.Random()
    while not stop.is_set():
        mac = bytes([0x02, 0x00, *rng.randbytes(4)])
        xid = rng.getrandbits(32)
        requesting = family == 4 and (sent["discover"] + sent["request"]) % 4 == 3
        try:
            if family == 6:
                sender.sendto(_solicit(mac, xid & 0xFFFFFF), ("ff02::1:2", 547, 0, index))
                sent["solicit"] += 1
            elif requesting:
                packet = _packet(REQUEST, mac, xid, rng.choice(POOL))
                sender.sendto(packet, ("255.255.255.255", 67))
                sent["request"] += 1
            else:
                sender.sendto(_packet(DISCOVER, mac, xid, None), ("255.255.255.255", 67))
                sent["discover"] += 1
        except OSError:
            sent["errors"] += 1
        if sum(sent.values()) % 10 == 0:
            answered = sum(1 for a in answers if a["type"] in ANSWERS[family])
            temporary = progress.with_name(progress.name + ".tmp")
            temporary.write_text(json.dumps({**sent, "answered": answered}))
            os.replace(temporary, progress)
        time.sleep(0.005)
    time.sleep(0.5)  # answers to the last packets still arrive
    stop.set()
    result.write_text(json.dumps({"sent": sent, "answers": answers}))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "flood":
        sys.exit(f"usage: {sys.argv[0]} flood 4|6 IFACE RESULT")
    flood(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    sys.exit(0)


# -- the test ------------------------------------------------------------------------
class Flooder:
    """The flooder process in the client namespace (stopped by closing its stdin, or its PID)."""

    def __init__(self, dhcp: DhcpRouter, result: Path, family: int = 4) -> None:
        self.result = result
        self.progress = Path(f"{result}.progress")
        self.proc = subprocess.Popen(
            [
                "ip", "netns", "exec", dhcp.clientns,
                sys.executable, str(Path(__file__).resolve()),
                "flood", str(family), "lan0p", str(result),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=open(f"{result}.log", "w"),  # noqa: SIM115
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def counts(self) -> dict[str, int]:
        try:
            return dict(json.loads(self.progress.read_text()))
        except (OSError, ValueError):
            return {}

    def sent(self) -> int:
        counts = self.counts()
        return sum(counts.get(kind, 0) for kind in ("discover", "request", "solicit"))

    def answered(self) -> int:
        return self.counts().get("answered", 0)

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
        sh("ip", "-n", dhcp.clientns, "addr", "add", f"{CLIENT6}/64", "dev", "lan0p", "nodad")
        yield dhcp
    finally:
        if dhcp is not None:
            dhcp.close()
            # DhcpRouter removes DHCPv4's socket directory; a long run directory puts
            # DHCPv6's under /run/trueup too.
            run6 = router.state_dir / "run" / "kea-dhcp6"
            socket_dir = kea_paths(run6, 6).socket.parent
            if socket_dir != run6:
                shutil.rmtree(socket_dir, ignore_errors=True)
        router.close()


def kea_pid(dhcp: DhcpRouter, family: int) -> int | None:
    run = dhcp.router.state_dir / "run" / f"kea-dhcp{family}"
    try:
        return verified_pid(json.loads((run / f"kea-dhcp{family}.pid").read_text()))
    except (OSError, ValueError):
        return None


def answering(dhcp: DhcpRouter, other_than: int | None, family: int = 4) -> int | None:
    """The pid of a Kea (not `other_than`) that answers on its control socket."""
    pid = kea_pid(dhcp, family)
    if pid is None or pid == other_than:
        return None
    run = dhcp.router.state_dir / "run" / f"kea-dhcp{family}"
    try:
        answer = kea_command(kea_paths(run, family).socket, "status-get", None, timeout=2.0)
    except KeaSocketError:
        return None
    return pid if answer.get("result") == 0 and kea_pid(dhcp, family) == pid else None


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


SUBNET6 = {
    "id": 2,
    "subnet": "2001:db8:1::/64",
    "interface": "lan0",
    "pools": ["2001:db8:1::100-2001:db8:1::1ff"],
}


def test_a_solicit_flood_gets_no_advertise_while_fenced_through_kea_kills_and_an_agent_start(
    fenced_router: DhcpRouter, tmp_path: Path
) -> None:
    dhcp = fenced_router
    router = dhcp.router
    document = dhcp_document(subnets=[SUBNET6])
    document["spec"]["interfaces"][0]["addresses"] = ["2001:db8:1::1/64"]
    config = router.write("doc.yaml", document)
    held = router.trueup("dhcp", "fence", "hold", "--reason", "full restore running")
    assert held.returncode == 0, held.stdout + held.stderr

    flooder = Flooder(dhcp, tmp_path / "flood6.json", family=6)
    try:
        flooder.wait_sent(20, "the flood to start")
        router.start_agent("--config", str(config), wait_started=False)
        pid = wait_until(lambda: answering(dhcp, None, 6), "Kea answering", WAIT)
        # Kea keeps its server DUID in its run directory, the same across its restarts.
        serverid = router.state_dir / "run" / "kea-dhcp6" / "kea-dhcp6-serverid"
        duid = serverid.read_text()
        flooder.wait_sent(PER_KEA, "packets to the first Kea")
        for kill in range(KILLS):
            os.kill(pid, signal.SIGKILL)
            previous = pid
            pid = wait_until(
                lambda previous=previous: answering(dhcp, previous, 6),
                f"Kea restarted after kill {kill + 1}",
                WAIT,
            )
            flooder.wait_sent(PER_KEA, f"packets to Kea after kill {kill + 1}")
        router.stop_agents()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: kea_dead(pid), "the old Kea gone", WAIT)
        flooder.wait_sent(PER_KEA, "packets while Kea and the agent are down")
        router.start_agent(wait_started=False)
        previous = pid
        pid = wait_until(lambda: answering(dhcp, previous, 6), "Kea by the new agent", WAIT)
        flooder.wait_sent(PER_KEA, "packets to the new agent's Kea")
        assert flooder.answered() == 0, flooder.counts()
        lift_started = time.time()
        lifted = router.trueup("dhcp", "fence", "lift", "--reason", "restore verified")
        assert lifted.returncode == 0, lifted.stdout + lifted.stderr
        # The flood goes on: the next SOLICITs are answered (each is a new client).
        wait_until(lambda: flooder.answered() > 0, "an ADVERTISE after the lift", WAIT)
        result = flooder.finish()
    finally:
        flooder.kill()

    assert serverid.read_text() == duid
    assert result["sent"]["solicit"] >= DISCOVERS, result["sent"]
    assert result["sent"]["errors"] == 0, result["sent"]
    answers = [a for a in result["answers"] if a["type"] in ANSWERS[6]]
    while_fenced = [a for a in answers if a["at"] < lift_started]
    assert while_fenced == [], f"{len(while_fenced)} answer(s) while fenced: {while_fenced[:5]}"
    assert any(a["type"] == ADVERTISE for a in answers)


def test_a_fence_class_removed_through_kea_s_socket_is_set_again(
    fenced_router: DhcpRouter,
) -> None:
    dhcp = fenced_router
    router = dhcp.router
    config = router.write("doc.yaml", dhcp_document())
    held = router.trueup("dhcp", "fence", "hold", "--reason", "full restore running")
    assert held.returncode == 0, held.stdout + held.stderr
    router.start_agent("--config", str(config))
    wait_until(lambda: answering(dhcp, None), "Kea answering", WAIT)
    running = kea_command(dhcp.socket, "config-get", None, timeout=10.0)["arguments"]
    assert has_fence(running)
    # Someone sets Kea's configuration without the fence class, through its socket.
    answer = kea_command(dhcp.socket, "config-set", with_fence(running, False), timeout=10.0)
    assert answer["result"] == 0, answer
    assert not has_fence(kea_command(dhcp.socket, "config-get", None, timeout=10.0)["arguments"])

    def fenced_again() -> bool:
        got = kea_command(dhcp.socket, "config-get", None, timeout=10.0)
        return bool(has_fence(got.get("arguments")))

    wait_until(fenced_again, "the fence class set again", WAIT)
    wait_until(lambda: router.trueup("drift").returncode == 0, "no drift", WAIT)
    assert dhcp.udhcpc() is None
    assert list(leases_from_memfile(4, dhcp.leases)) == []
