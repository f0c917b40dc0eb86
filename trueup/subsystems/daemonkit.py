"""The kit a daemon-backed subsystem is built from (DHCP/Kea, DNS/Knot, HA/keepalived, proxies/HAProxy, routing/FRR).

A daemon-backed subsystem is its section, its renderer (the daemon's
configuration from the section) and its observations (what the daemon
answers); what they all need besides is here, once:

* **the run directory's files**, through `sources.files` (`read_text`,
  `read_json`, `write_file`, `remove_file`; `files.make_private_dir` for a
  directory of its own): 0600 files in the daemon's 0700 run directory (`sources.daemons.run_dir(NAME)`), never opened through a
  link, so the fakes see every read and write;
* **the run record** (`RunRecord`): the subsystem's own typed record in the
  run directory — what trueup last wrote (DNS's static and lease records,
  the proxies' section and digests, HA's released addresses, which Kea
  digests are trueup's) — read whole and updated in one atomic write;
* **the daemon's own check** (`check`): the rendered configuration written to
  a candidate file and judged by the daemon's `-t`-style check
  (`keepalived --config-test`, `haproxy -c`) through `sources.runner`; a
  refused configuration changes nothing;
* **ensure running, or reload** (`ensure_or_reload`): through
  `sources.daemons`, start the daemon (adopting a verified running instance),
  or, when it runs, reload it with its signal;
* **a step's failures** (`step_failures`): the daemon's refusal
  (`DaemonError`), a file's (`OSError`) and the daemon's own control errors
  become a `StepError` naming the step;
* **a daemon that does not run** (`failed_daemon`): the health laid over the
  facts when a daemon the document asks for is not running — failed, in its
  own words (`daemon_failure`).

Who uses this: `trueup.subsystems.{dhcp,dns,ha,proxy,routing}`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Generic, TypeVar, cast

from trueup.model.health import SubsystemHealth
from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import Sources, Step, StepError, daemon_failure
from trueup.system.daemonspec import DaemonError, DaemonSpec
from trueup.system.runner import Completed
from trueup.system.safefile import UnsafeFile
from trueup.system.sources import Files

__all__ = [
    "RunRecord",
    "check",
    "ensure_or_reload",
    "failed_daemon",
    "read_json",
    "read_text",
    "remove_file",
    "step_failures",
    "write_file",
]

R = TypeVar("R", bound=Mapping[str, object])


def read_text(files: Files, path: Path) -> str | None:
    """A run-directory file's text, or None when it is missing or not a file of ours
    (the next write names what is there)."""
    try:
        return files.read_private(path).decode("utf-8", errors="replace")
    except (FileNotFoundError, UnsafeFile):
        return None


def read_json(files: Files, path: Path) -> JSONObject:
    """A run-directory JSON object (a daemon's configuration as it wants it); {} when
    missing, unreadable or not an object."""
    try:
        data = json.loads(files.read_private(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_file(files: Files, path: Path, text: str, *, durable: bool = True) -> None:
    """Replace a run-directory file: 0600, atomically (`durable=False`: no fsync, a cache)."""
    files.write_private(path, text.encode(), durable=durable)


def remove_file(files: Files, path: Path) -> None:
    files.remove_private(path)


class RunRecord(Generic[R]):
    """The subsystem's own record in its daemon's run directory (a JSON object, typed `R`).

    Read whole (`read`: empty when missing or damaged — the next write replaces
    it), updated in one atomic 0600 write (`update`). `sort_keys` keeps the
    file's key order stable; a record whose order matters (oldest entries
    dropped first) keeps it as written.
    """

    def __init__(self, path: Path, *, sort_keys: bool = True, durable: bool = True) -> None:
        self.path = path
        self.sort_keys = sort_keys
        self.durable = durable

    def read(self, files: Files) -> R:
        return cast(R, read_json(files, self.path))

    def write(self, files: Files, record: R) -> None:
        text = json.dumps(record, sort_keys=self.sort_keys)
        write_file(files, self.path, text, durable=self.durable)

    def update(self, files: Files, change: Callable[[R], None]) -> R:
        record = self.read(files)
        change(record)
        self.write(files, record)
        return record


def check(
    sources: Sources,
    candidate: Path,
    text: str,
    argv: list[str],
    *,
    timeout: float = 30.0,
    keep: bool = False,
) -> Completed:
    """The daemon's own check of `text`, written to `candidate` (which `argv` names): its
    result (`returncode` 0: accepted; its own words in its output). The candidate is
    removed unless it was accepted and `keep` is set (the caller renames it into place)."""
    write_file(sources.files, candidate, text)
    done: Completed | None = None
    try:
        done = sources.runner.run(argv, timeout=timeout)
        return done
    finally:
        if not (keep and done is not None and done.returncode == 0):
            remove_file(sources.files, candidate)


def ensure_or_reload(
    sources: Sources,
    spec: DaemonSpec,
    reload: int,
    *,
    before_reload: Callable[[], None] | None = None,
    gone: str = "",
) -> bool:
    """Start the daemon (or adopt its verified running instance) through `sources.daemons`;
    when it already ran, reload it with the signal `reload` (`before_reload` first: what
    the reload is compared with). True when it was started, False when reloaded.

    Raises `DaemonError` when it cannot be started, or (`gone`, or a message naming
    it) when it stopped running before the reload.
    """
    if not sources.daemons.running(spec.name):
        sources.daemons.ensure(spec)
        return True
    sources.daemons.ensure(spec)  # supervised by this agent (adopted after a restart)
    if before_reload is not None:
        before_reload()
    if not sources.daemons.signal(spec.name, reload):
        raise DaemonError(gone or f"{spec.name} is not running; cannot reload it")
    return False


@contextmanager
def step_failures(step: Step, *errors: type[Exception]) -> Iterator[None]:
    """Around a step's work: a `DaemonError`, an `OSError` or one of `errors` (the daemon's
    control errors: `KnotError`, …) becomes a `StepError` naming `step`."""
    caught: tuple[type[Exception], ...] = (DaemonError, OSError, *errors)
    try:
        yield
    except caught as exc:
        raise StepError(step, str(exc)) from exc


def failed_daemon(sources: Sources, name: str) -> tuple[SubsystemHealth, str] | None:
    """`condition()` for daemon `name`, which the document asks for: failed, in its own words,
    while it does not run (`daemon_failure`); None while it runs or when nothing says."""
    failure = daemon_failure(sources, name)
    return (SubsystemHealth.FAILED, failure) if failure is not None else None
