"""WireGuard as trueup runs it: the link (kernel or `wireguard-go`) and `wg` through the Runner.

Who uses this: the WireGuard subsystem (`trueup.subsystems.wireguard`).
Every program goes through the `Runner` seam, so unit tests hand the
subsystem `FakeWg` (`trueup.system.fake`) instead of real tools.

```python
wg = WgControl(sources.runner)
dump = wg.show("wg0")                       # WgDump | None (no such interface)
wg.syncconf("wg0", run_dir, conf)           # `wg syncconf`: only what differs changes
wg.pubkey(private_key)                      # on stdin, never argv
```

Where the interface comes from: `ip link add NAME type wireguard` when the
kernel has the module; otherwise Debian's `wireguard-go`, run in the
foreground under the agent's daemon supervisor (`DAEMON_PREFIX + NAME`, run
directory `STATE_DIR/run/wg-NAME`, 0700). `wireguard-go` and `wg` meet at
`/var/run/wireguard/NAME.sock`, a path shared by every network namespace of
the host: interface names must be unique on the host, not only in a
namespace.

Keys: `wg show NAME dump` prints the private key; `parse_dump` keeps only
its digest, and no error message ever carries the dump's text. Keys reach
`wg` in a 0600 configuration file in the 0700 run directory (`syncconf`,
removed right after) or on stdin (`pubkey`), never in argv.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from trueup.system.atomicfile import write_atomic
from trueup.system.daemonspec import DaemonSpec
from trueup.system.requirements import Requirement, binary
from trueup.system.runner import Runner
from trueup.system.safefile import ensure_dir
from trueup.system.secretstore import secret_digest

__all__ = [
    "DAEMON_PREFIX",
    "NO_PRESHARED_KEY",
    "PeerConf",
    "WgControl",
    "WgDump",
    "WgError",
    "WgPeer",
    "daemon_name",
    "daemon_spec",
    "kernel_has_wireguard",
    "parse_dump",
    "render_conf",
    "requirements",
]

DAEMON_PREFIX = "wg-"
_TIMEOUT = 10.0
_NONE = "(none)"
# A WireGuard key as wg(8) writes it: 32 bytes in base64 (44 characters, one '=').
_KEY = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw480]=\Z")
# The all-zero preshared key: WireGuard's "no preshared key" (`wg show` prints "(none)").
NO_PRESHARED_KEY = "A" * 43 + "="


class WgError(RuntimeError):
    """`wg` or `ip` refused; names the command (never a key) and the tool's words."""


@dataclass(frozen=True)
class WgPeer:
    public_key: str
    preshared_digest: str | None
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake: int
    rx_bytes: int
    tx_bytes: int
    keepalive: int


@dataclass(frozen=True)
class WgDump:
    private_digest: str | None
    public_key: str | None
    listen_port: int
    fwmark: str
    peers: dict[str, WgPeer] = field(default_factory=dict)


def daemon_name(ifname: str) -> str:
    return DAEMON_PREFIX + ifname


def kernel_has_wireguard(
    sys_module: Path = Path("/sys/module"), modules: Path = Path("/lib/modules")
) -> bool:
    """Whether `ip link add … type wireguard` can work: the module is loaded, built in,
    or installed for the running kernel (it loads on demand)."""
    if (sys_module / "wireguard").exists():
        return True
    release = os.uname().release
    for listing in ("modules.builtin", "modules.dep"):
        with contextlib.suppress(OSError):
            text = (modules / release / listing).read_text(errors="replace")
            if "/wireguard.ko" in text:
                return True
    return False


def requirements(*, kernel_wireguard: bool) -> list[Requirement]:
    """What WireGuard needs: `wg` always; `wireguard-go` when the kernel has no WireGuard."""
    needs = [binary("wg", "wireguard-tools", ("--version",))]
    if not kernel_wireguard:
        needs.append(
            binary(
                "wireguard-go",
                "wireguard-go",
                ("--version",),
                why="the kernel has no WireGuard module",
            )
        )
    return needs


def daemon_spec(ifname: str) -> DaemonSpec:
    return DaemonSpec(
        daemon_name(ifname),
        ("wireguard-go", "-f", ifname),
        env=(("WG_PROCESS_FOREGROUND", "1"),),
    )


def _key(value: str) -> str | None:
    return None if value in (_NONE, "") else value


def parse_dump(text: str) -> WgDump:
    """`wg show NAME dump`: the interface line, then one line per peer (tab-separated).

    The private and preshared keys are replaced by their digests at once.
    """
    lines = [line.split("\t") for line in text.splitlines() if line.strip()]
    if not lines or len(lines[0]) < 4:
        raise WgError("wg show dump: no interface line")
    private, public, port, fwmark = lines[0][:4]
    peers: dict[str, WgPeer] = {}
    for index, cols in enumerate(lines[1:], start=2):
        if len(cols) < 8:
            raise WgError(f"wg show dump: line {index} has {len(cols)} fields, expected 8")
        psk = _key(cols[1])
        allowed = () if cols[3] in (_NONE, "") else tuple(sorted(cols[3].split(",")))
        peers[cols[0]] = WgPeer(
            public_key=cols[0],
            preshared_digest=secret_digest(psk) if psk else None,
            endpoint=_key(cols[2]),
            allowed_ips=allowed,
            latest_handshake=int(cols[4] or 0),
            rx_bytes=int(cols[5] or 0),
            tx_bytes=int(cols[6] or 0),
            keepalive=0 if cols[7] in ("off", "") else int(cols[7]),
        )
    private_key = _key(private)
    return WgDump(
        private_digest=secret_digest(private_key) if private_key else None,
        public_key=_key(public),
        listen_port=int(port or 0),
        fwmark=fwmark,
        peers=peers,
    )


@dataclass(frozen=True)
class PeerConf:
    public_key: str
    preshared_key: str | None
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    keepalive: int


def render_conf(private_key: str, listen_port: int | None, peers: list[PeerConf]) -> str:
    """The `wg syncconf` file (wg(8) format).

    `wg syncconf` keeps a live peer's preshared key and keepalive when the
    file omits them (only AllowedIPs is replaced as a whole, an omitted line
    leaving none), so every peer states both: no preshared key is the
    all-zero key and no keepalive is `PersistentKeepalive = 0`. A value
    removed from the document is removed from the interface, and a failed
    apply rolled back to a revision without a preshared key leaves none.

    Every key is checked to be a WireGuard key first: a stored secret holding
    anything else (a newline and a second section, say) never reaches the file,
    and the error never repeats the value."""
    keys = [
        ("the private key", private_key),
        *((f"peer {p.public_key}", p.public_key) for p in peers),
    ]
    keys += [
        (f"the preshared key of peer {p.public_key[:8]}…", p.preshared_key)
        for p in peers
        if p.preshared_key
    ]
    for what, key in keys:
        if not _KEY.match(key):
            raise WgError(f"{what[:60]}: not a WireGuard key (44 base64 characters)")
    lines = ["[Interface]", f"PrivateKey = {private_key}"]
    if listen_port:
        lines.append(f"ListenPort = {listen_port}")
    for peer in peers:
        lines += ["", "[Peer]", f"PublicKey = {peer.public_key}"]
        lines.append(f"PresharedKey = {peer.preshared_key or NO_PRESHARED_KEY}")
        if peer.endpoint:
            lines.append(f"Endpoint = {peer.endpoint}")
        if peer.allowed_ips:
            lines.append(f"AllowedIPs = {', '.join(peer.allowed_ips)}")
        lines.append(f"PersistentKeepalive = {peer.keepalive}")
    return "\n".join(lines) + "\n"


class WgControl:
    """`wg` and `ip` for one piece of work."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def show(self, ifname: str) -> WgDump | None:
        """The interface as `wg` sees it; None when there is no such WireGuard interface."""
        done = self.runner.run(["wg", "show", ifname, "dump"], timeout=_TIMEOUT)
        if not done.ok:
            return None
        return parse_dump(done.stdout)

    def syncconf(self, ifname: str, run_dir: Path, conf: str) -> None:
        """Replace the interface's key, port and peers with `conf` (which holds keys)."""
        ensure_dir(run_dir)
        os.chmod(run_dir, 0o700)
        path = run_dir / f"{ifname}.conf"
        write_atomic(path, conf.encode(), 0o600, durable=False)
        try:
            done = self.runner.run(["wg", "syncconf", ifname, str(path)], timeout=_TIMEOUT)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if not done.ok:
            raise WgError(f"wg syncconf {ifname}: {_words(done.stderr)}")

    def pubkey(self, private_key: str) -> str:
        done = self.runner.run(["wg", "pubkey"], input=private_key + "\n", timeout=_TIMEOUT)
        if not done.ok or not done.stdout.strip():
            raise WgError(f"wg pubkey: {_words(done.stderr) or 'not a WireGuard private key'}")
        return done.stdout.strip()

    def add_kernel_link(self, ifname: str) -> bool:
        """`ip link add NAME type wireguard`; False when the kernel has no WireGuard."""
        done = self.runner.run(["ip", "link", "add", ifname, "type", "wireguard"])
        return done.ok or "File exists" in done.stderr

    def delete_link(self, ifname: str) -> None:
        done = self.runner.run(["ip", "link", "del", ifname])
        if not done.ok and "Cannot find device" not in done.stderr:
            raise WgError(f"ip link del {ifname}: {_words(done.stderr)}")


def _words(stderr: str) -> str:
    # wg's own messages name files and interfaces, never key material.
    return " ".join(stderr.split())[:300]
