"""The fast path of `trueup agent run`: management up and answering before the heavy imports.

Who calls this: the console entry (`trueup.cli.entry`) for `trueup agent run
ARGS…`, before typer, pydantic, FastAPI, SQLAlchemy or uvicorn are imported.
`boot()`:

1. parses the agent-run options by hand and takes the per-state-directory
   agent lock (`trueup.journal.agentlock`): a second agent exits here;
2. reads the management facts of the last commit (`management.json`, see
   `trueup.journal.management`; an older state directory: the applied
   revision's `spec.management`, read as plain JSON), with a console override
   laid over them as phase 1 does. Nothing readable: the full path alone,
   exactly as before;
3. over raw netlink (`trueup.system.rawnl`): the management link up, missing
   management addresses added, the default route added when there is none
   with its metric — it never removes or replaces anything;
4. binds the listeners the full agent will serve on — `STATE_DIR/agent.sock`
   (0600) and the management port with `Agent`'s semantics (the named bind
   address, else the dual-stack wildcard) — and answers on them from a small
   HTTP/1.1 responder in a forked child process, which the imports that
   follow cannot hold up: `GET /v1/health/management` (200 ready, 503
   not, from a netlink dump at each request, `"phase": "early"`), anything
   else 503 `agent starting; retry` with `Retry-After: 1`;
5. announces the added addresses (gratuitous ARP / unsolicited NA), after
   the listeners are bound so the first neighbour that answers finds them;
6. imports the agent and runs it (`trueup.agent.launch.run_agent`), handing
   over the bound sockets: `Agent` takes them instead of binding anew, and
   right before uvicorn serves one, the responder stops accepting on it.
   Connections arriving in between wait in the listen backlog and are served
   by uvicorn: none is refused. Phase 1 still runs and converges management
   fully (it finds it done, or finishes what the fast path could not: a
   gateway route that differs, an address the document no longer lists).

Everything here is stdlib (plus the stdlib-only trueup modules named
above; not even `logging`, which costs more than the rest): the point is to
answer before the second the full agent spends importing. The listeners and
the responder are in `trueup.agent.early`.

`TRUEUP_TEST_DELAY_FULL_API=SECONDS` delays that import, for tests only (the
early listener can then be observed on its own).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trueup.agent.bodies import EarlyAnswer
from trueup.agent.early import EarlyResponder, bind_listeners, early_health, same_address, warn
from trueup.journal.agentlock import AgentLock, AgentRunning, take_agent_lock
from trueup.journal.identity import creation_problem, device_mismatch, read_marker
from trueup.journal.management import BootFacts, boot_facts
from trueup.system.announce import SCHEDULE, KernelAnnouncer
from trueup.system.rawnl import IFF_RUNNING, IFF_UP, RawNetlink

__all__ = [
    "AgentOptions",
    "Handover",
    "UsageError",
    "boot",
    "bring_up",
    "parse_agent_run",
    "start_early",
    "take_handover",
]

DEFAULT_STATE_DIR = "/var/lib/trueup"
TEST_DELAY_ENV = "TRUEUP_TEST_DELAY_FULL_API"


# -- options ----------------------------------------------------------------------
class UsageError(ValueError):
    pass


class AgentOptions:
    """The options of `trueup agent run` (the typer command declares the same ones)."""

    def __init__(
        self,
        *,
        state_dir: Path,
        config: Path | None = None,
        control_plane: str | None = None,
        token_file: Path | None = None,
        management_fallback: Path | None = None,
        listen_port: int | None = None,
        plugins: list[str] | None = None,
        log_level: str = "info",
    ) -> None:
        self.state_dir = state_dir
        self.config = config
        self.control_plane = control_plane
        self.token_file = token_file
        self.management_fallback = management_fallback
        self.listen_port = listen_port
        self.plugins = list(plugins or [])
        self.log_level = log_level


_PATHS = {"--config": "config", "--token-file": "token_file", "--state-dir": "state_dir"}
_PATHS["--management-fallback"] = "management_fallback"
_TEXTS = {"--control-plane": "control_plane", "--log-level": "log_level"}
_VALUED = {*_PATHS, *_TEXTS, "--listen-port", "--plugin"}


def parse_agent_run(argv: list[str]) -> AgentOptions:
    """`agent run` options as typer takes them (`--opt VALUE` or `--opt=VALUE`); UsageError."""
    values: dict[str, Any] = {
        "state_dir": Path(os.environ.get("TRUEUP_STATE_DIR") or DEFAULT_STATE_DIR)
    }
    plugins: list[str] = []
    args = iter(argv)
    for arg in args:
        name, has_value, value = arg.partition("=")
        if name not in _VALUED:
            raise UsageError(
                f"no such option: {arg}" if arg.startswith("-") else f"unexpected {arg}"
            )
        if not has_value:
            try:
                value = next(args)
            except StopIteration:
                raise UsageError(f"option {name} requires a value") from None
        if name in _PATHS:
            values[_PATHS[name]] = Path(value)
        elif name in _TEXTS:
            values[_TEXTS[name]] = value
        elif name == "--plugin":
            plugins.append(value)
        else:
            try:
                values["listen_port"] = int(value)
            except ValueError:
                raise UsageError(f"--listen-port: {value!r} is not a number") from None
    return AgentOptions(plugins=plugins, **values)


# -- the kernel -------------------------------------------------------------------
def bring_up(facts: BootFacts) -> tuple[list[str], list[str]]:
    """(steps done, prefixes to announce): the link up, missing addresses, the default route.

    Never raises and never removes: what it cannot do, phase 1 does (and reports).
    A link it brought up is waited for (a little) until the kernel runs it:
    before that its transmit queue drops what is sent, the first announcement
    with it.
    """
    ifname = facts["interface"]
    steps: list[str] = []
    announce: list[str] = []
    try:
        index = socket.if_nametoindex(ifname)
    except OSError:
        return steps, announce  # not there (yet): phase 1 reports it and retries
    try:
        with RawNetlink() as netlink:
            flags = netlink.link_flags(index)
            raised = flags is not None and not flags & IFF_UP
            if raised:
                netlink.set_link_up(index)
                steps.append(
                    f"management: set-link ifname={ifname} state=up (spec.management.state)"
                )
            present = netlink.addresses(index)
            for prefix in facts["addresses"]:
                if any(same_address(prefix, have) for have in present):
                    continue
                try:
                    netlink.add_address(index, prefix)
                except OSError as exc:
                    if exc.errno != errno.EEXIST:
                        warn(f"adding {prefix} on {ifname}: {exc}")
                        continue
                else:
                    steps.append(
                        f"management: add-address ifname={ifname} prefix={prefix} "
                        "(spec.management.addresses)"
                    )
                announce.append(prefix)
            if raised:  # the link came up: its addresses are news to the neighbours
                announce += [p for p in present if p not in announce]
                _wait_running(netlink, index)
            gateway = facts.get("gateway")
            if gateway:
                family = 6 if ":" in gateway else 4
                metric = 1024 if family == 6 else 0
                try:
                    netlink.add_default_route(index, gateway, metric)
                    to = "::/0" if family == 6 else "0.0.0.0/0"
                    steps.append(
                        f"management: add-route to={to} table=254 metric={metric} "
                        f"family={family} via={gateway} dev={ifname} "
                        f"(spec.management.gateway[ipv{family}])"
                    )
                except OSError as exc:
                    if exc.errno != errno.EEXIST:  # one with this metric exists: phase 1's call
                        warn(f"default route via {gateway}: {exc}")
    except OSError as exc:
        warn(f"netlink on {ifname}: {exc}")
    return steps, announce


def _wait_running(netlink: RawNetlink, index: int, timeout: float = 0.1) -> None:
    """Until the link is IFF_RUNNING (the kernel's link watch activated its queue), or `timeout`.

    A link without carrier never gets there: the announcer's repeats cover it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        flags = netlink.link_flags(index)
        if flags is None or flags & IFF_RUNNING:
            return
        time.sleep(0.002)


# -- the handover -------------------------------------------------------------------
class Handover:
    """What the fast path hands to the full agent: bound sockets, and what it changed."""

    def __init__(
        self,
        sockets: dict[str, socket.socket] | None = None,
        responder: EarlyResponder | None = None,
        steps: list[str] | None = None,
        source: str | None = None,
    ) -> None:
        self.sockets = sockets if sockets is not None else {}
        self.responder = responder
        self.steps = steps or []
        self.source = source  # where the facts came from, for the audit line
        # The per-state-directory agent lock, held since the first moment.
        self.agent_lock: AgentLock | None = None

    def release(self, sock: socket.socket) -> None:
        """Called by `Agent` right before uvicorn serves `sock`."""
        if self.responder is not None:
            self.responder.release(sock)


_handover: Handover | None = None


def take_handover() -> Handover:
    """The fast path's handover, once (an empty one when there was no fast path)."""
    global _handover
    handover, _handover = _handover or Handover(), None
    return handover


def start_early(options: AgentOptions) -> Handover | None:
    """Management up and the early listeners answering; None when there are no facts to use."""
    root = options.state_dir
    found = boot_facts(root)
    if found is None:
        return None
    facts, source = found
    steps, announce = bring_up(facts)
    sockets, listeners = bind_listeners(root, facts, options.listen_port)

    def answer(method: str, path: str) -> tuple[int, EarlyAnswer]:
        if path == "/v1/health/management" and method in ("GET", "HEAD"):
            body = early_health(facts, listeners)
            return (200 if body["ready"] else 503), body
        return 503, {"message": "agent starting; retry"}

    responder = None
    if sockets:
        responder = EarlyResponder(answer, list(sockets.values()))
        responder.start()  # forks: before any thread of this process exists
    # The first announcement from this thread, before the imports start: on a
    # thread it would wait for the interpreter lock they hold. The repeats
    # (a first packet can be lost) follow on the announcer's thread.
    repeats = KernelAnnouncer(SCHEDULE[1:])
    for prefix in announce:
        with contextlib.suppress(OSError):  # a link still coming up: the repeats will do
            KernelAnnouncer.send_once(facts["interface"], prefix.split("/")[0])
        repeats.announce(facts["interface"], prefix)
    return Handover(sockets, responder, steps, source)


def agent_run_problem(options: AgentOptions) -> str | None:
    """Why `agent run` must not start on its state directory; None: it may.

    Before anything is touched: a parent of state directories or a file
    (`trueup.journal.identity.creation_problem`), or `--config` naming another
    device than the state directory's. The document's device is read without
    YAML (`config_device`); when that cannot tell, phase 0 refuses the
    document after parsing it (`trueup.startup.orchestrator`).
    """
    refused = creation_problem(options.state_dir)
    if refused is not None or options.config is None:
        return refused
    meta = read_marker(options.state_dir) or {}
    known = None if meta.get("device") else applied_device(options.state_dir)
    if not meta.get("device") and known is None:
        return None  # a new state directory: the document names its device
    return device_mismatch(options.state_dir, config_device(options.config), known=known)


def applied_device(root: Path) -> str | None:
    """`metadata.device` of the applied revision, read as plain JSON; None when unknown."""
    import json

    try:
        with open(root / "applied.json", "rb") as stream:
            version = int(json.loads(stream.read(1 << 20)).get("version") or 0)
        if not version:
            return None
        with open(root / "revisions" / f"{version:08d}.json", "rb") as stream:
            record = json.loads(stream.read(16 << 20))
        device = record["document"]["metadata"]["device"]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return device if isinstance(device, str) else None


def config_device(path: Path) -> str | None:
    """`metadata.device` of a document, read as JSON or block YAML by hand; None: cannot tell."""
    try:
        with open(path, "rb") as stream:
            text = stream.read(1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text.lstrip().startswith("{"):
        import json

        try:
            device = json.loads(text).get("metadata", {}).get("device")
        except (ValueError, AttributeError):
            return None
        return device if isinstance(device, str) else None
    in_metadata = False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            in_metadata = line.rstrip() == "metadata:"
            continue
        key, sep, value = line.strip().partition(":")
        if in_metadata and sep and key == "device":
            value = value.split(" #", 1)[0].strip().strip("'\"")
            return value or None
    return None


def boot(argv: list[str]) -> int:
    """`trueup agent run ARGV`: the fast path, then the full agent; the exit code."""
    global _handover
    try:
        options = parse_agent_run(argv)
    except UsageError as exc:
        print(f"trueup agent run: {exc} (see `trueup agent run --help`)", file=sys.stderr)
        return 2
    refused = agent_run_problem(options)
    if refused is not None:
        print(f"trueup agent run: {refused.removeprefix('trueup: ')}", file=sys.stderr)
        return 1
    try:
        # Before the socket, the port or any state file is touched: a second
        # agent leaves the first one's listeners alone.
        agent_lock = take_agent_lock(options.state_dir)
    except AgentRunning as exc:
        print(f"trueup agent run: {exc}", file=sys.stderr)
        return 1
    try:
        _handover = start_early(options)
    except Exception as exc:  # the fast path is an optimisation: never a reason not to start
        warn(f"failed ({exc!r}); starting the full agent")
    if _handover is None:
        _handover = Handover()
    _handover.agent_lock = agent_lock
    delay = os.environ.get(TEST_DELAY_ENV)
    if delay:
        time.sleep(float(delay))
    from trueup.agent.launch import run_agent

    return run_agent(options, take_handover())
