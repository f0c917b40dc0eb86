"""A state directory's identity: `state.json` says it is one, for which device, made how.

```json
{"schema": 1, "device": "edge-01",
 "created": {"by": "trueup apply --init", "at": "2025-…Z", "trueup": "0.9.0", "host": "r1"}}
```

Only `trueup agent run` and `trueup apply --init` write it (through
`StateDir.ensure`); every other command refuses a directory without it
(`problem`), so a typo in `--state-dir` — an empty folder, the parent of the
agent's directory, a folder of other files — is named instead of read as an
empty device or turned into a second history. `device` is the document's
`metadata.device` when the creating command had one, else null until the
first document is accepted (`StateDir.ensure(device=…)` binds it once, never
changes it): a document for another device is refused (`device_mismatch`).

A directory made by a trueup from before identities holds `state.json`
without `created` (or trueup's files without `state.json`): it is accepted,
and the next `agent run` or `apply --init` adopts it (adds `created` with
`"adopted": true`, audited as `state_dir_adopted`).

Who calls this: `trueup.cli.fast` (the one `stat` on the hot path, the
diagnosis only when it fails), the full CLI's state-directory options,
`trueup.agent.fastboot` before `agent run` takes its lock, and
`trueup.journal.state`. Standard library only: the fast paths import it.
"""

from __future__ import annotations

import json
import os

__all__ = [
    "CREATORS",
    "DEVICE_ENV",
    "STATE_FILE",
    "TRUEUP_FILES",
    "creation_problem",
    "device_mismatch",
    "legacy",
    "problem",
    "read_marker",
]

STATE_FILE = "state.json"
DEVICE_ENV = "TRUEUP_DEVICE"
CREATORS = "`trueup agent run` and `trueup apply --init` create one"
# Files only trueup writes there: a directory holding them is trueup's even without state.json.
TRUEUP_FILES = ("applied.json", "journal.jsonl", "audit.jsonl", "revisions")
_SHOWN = 5


def read_marker(root: str | os.PathLike[str]) -> dict[str, object] | None:
    """`state.json` as a dict; None when it is missing, unreadable or not a JSON object."""
    try:
        with open(os.path.join(root, STATE_FILE), "rb") as stream:
            meta = json.loads(stream.read(64 * 1024))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def legacy(meta: dict[str, object] | None) -> bool:
    """Whether `state.json` was written by a trueup from before identities (no `created`)."""
    return meta is None or not isinstance(meta.get("created"), dict)


def _where() -> str:
    return f"name the agent's with --state-dir or TRUEUP_STATE_DIR ({CREATORS})"


def _children_with_state(root: str, entries: list[str]) -> list[str]:
    return [
        name
        for name in entries
        if os.path.isfile(os.path.join(root, name, STATE_FILE))
        or os.path.isfile(os.path.join(root, name, "applied.json"))
    ]


def _found(root: str) -> str:
    """What `root` holds, in words, when it is not a state directory."""
    try:
        entries = sorted(os.listdir(root))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not entries:
        return "is empty"
    children = _children_with_state(root, entries)
    if children:
        shown = ", ".join(f"{name}/" for name in children[:_SHOWN])
        first = os.path.join(root, children[0])
        return (
            f"looks like a parent of state directories: it holds {shown} "
            f"(did you mean --state-dir {first}?)"
        )
    shown = ", ".join(entries[:_SHOWN])
    more = f" and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else ""
    return f"holds other files, no {STATE_FILE}: {shown}{more}"


def problem(root: str | os.PathLike[str]) -> str | None:
    """The error line when `root` is not a state directory; None when it is one.

    One `lstat` when it is (the hot path); the listing only when it is not.
    """
    path = os.fspath(root)
    try:
        os.lstat(os.path.join(path, STATE_FILE))
        return None
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        return f"trueup: state directory {path} is not a directory; {_where()}; nothing was changed"
    except OSError:
        return None  # unreadable state.json: the damage check names it
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        return f"trueup: state directory {path} {what}; {_where()}"
    if any(os.path.lexists(os.path.join(path, name)) for name in TRUEUP_FILES):
        return None  # trueup's state without state.json: damage reports it, the agent adopts it
    return (
        f"trueup: {path} is not a trueup state directory: it {_found(path)}; {_where()}; "
        "nothing was changed"
    )


def creation_problem(root: str | os.PathLike[str]) -> str | None:
    """Why `agent run` / `apply --init` must not make `root` a state directory; None: they may.

    A missing directory, an empty one, a state directory (or trueup's files
    from before identities) and a folder of other files are fine — an
    installer creates the directory, a test keeps its documents there. A
    file, or the parent of state directories (the demo's `demo-state`
    holding `agent/`), is a typo.
    """
    path = os.fspath(root)
    if os.path.lexists(os.path.join(path, STATE_FILE)):
        return None
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"trueup: state directory {path} is not a directory; nothing was changed"
    try:
        entries = sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"trueup: state directory {path} cannot be read ({exc.strerror or exc})"
    if any(name in TRUEUP_FILES for name in entries):
        return None
    if _children_with_state(path, entries):
        return (
            f"trueup: {path} is not a trueup state directory: it {_found(path)}; "
            "a state directory is not made inside another's parent; nothing was changed"
        )
    return None


def device_mismatch(
    root: str | os.PathLike[str],
    device: str | None,
    *,
    known: str | None = None,
    named_by: str = "the document is for",
) -> str | None:
    """The refusal when the state directory belongs to another device than `device`; else None.

    `known` is the device the caller already found (the applied document's
    `metadata.device`), used when `state.json` names none yet.
    """
    if not device:
        return None
    meta = read_marker(root) or {}
    owner = meta.get("device")
    owner = owner if isinstance(owner, str) and owner else known
    if owner is None or owner == device:
        return None
    return (
        f"trueup: state directory {os.fspath(root)} belongs to device {owner}; "
        f"{named_by} {device}; nothing was changed"
    )
