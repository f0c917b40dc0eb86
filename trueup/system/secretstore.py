"""The agent's secret store: one file per secret under `STATE_DIR/secrets`.

Who uses this: subsystems that take keys by reference (`spec.wireguard`:
`private_key: {secret_ref: wg0-key}` or `"secret:wg0-key"`), the agent's
control-plane sync (it fills the store from the control plane when a
revision references secrets) and `trueup secret set|list` (stand-alone
routers).

```
STATE_DIR/secrets/         0700
STATE_DIR/secrets/NAME     0600, the secret's value (written atomically)
```

A secret's value is never logged, never put in status, facts, the journal or
the audit log: callers pass it to programs on stdin or through a 0600 file in
a 0700 directory, and report a digest (`secret_digest`) or a derived public
value instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trueup.system.atomicfile import path_error, write_atomic
from trueup.system.safefile import UnsafeFile, ensure_dir, open_file, unsafe_entry

__all__ = [
    "MAX_BYTES",
    "SECRETS_DIR",
    "SecretError",
    "check_name",
    "list_secrets",
    "read_secret",
    "secret_digest",
    "secret_path",
    "secret_references",
    "write_secret",
]

SECRETS_DIR = "secrets"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MAX_BYTES = 64 * 1024


class SecretError(ValueError):
    """A secret name or value the store refuses; the message never holds the value."""


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise SecretError(
            f"secret name {name!r}: expected 1-128 of A-Z a-z 0-9 . _ - (not starting with . _ -)"
        )
    return name


def secret_path(state_dir: Path, name: str) -> Path:
    return state_dir / SECRETS_DIR / check_name(name)


def read_secret(state_dir: Path, name: str) -> str | None:
    """The secret's value (surrounding whitespace removed), or None when it is not stored."""
    path = secret_path(state_dir, name)
    problem = unsafe_entry(path.parent, directory=True)
    if problem is not None:
        raise SecretError(f"secret {name!r}: {path.parent}: {problem}; refused")
    try:
        # A symlink planted in the store (say to /etc/shadow) is refused, not
        # read; a planted FIFO does not hang the agent (trueup.system.safefile).
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        raise SecretError(f"secret {name!r}: {exc}") from exc
    except OSError as exc:
        raise SecretError(f"secret {name!r}: {path} is not a readable regular file") from exc
    try:
        info = os.fstat(fd)
        if info.st_size > MAX_BYTES + 1:
            raise SecretError(f"secret {name!r}: {path} is over {MAX_BYTES} bytes")
        data = os.read(fd, MAX_BYTES + 2)
    except OSError as exc:
        raise path_error(path, exc) from exc
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def write_secret(state_dir: Path, name: str, value: str) -> Path:
    """Store `value` as secret `name` (0600 in a 0700 directory, atomically)."""
    path = secret_path(state_dir, name)
    data = value.strip().encode()
    if not data:
        raise SecretError(f"secret {name!r}: the value is empty")
    if len(data) > MAX_BYTES:
        raise SecretError(f"secret {name!r}: the value is over {MAX_BYTES} bytes")
    directory = ensure_dir(path.parent)
    os.chmod(directory, 0o700)
    write_atomic(path, data + b"\n", 0o600)
    return path


def list_secrets(state_dir: Path) -> list[str]:
    """The names of the stored secrets (never their values)."""
    directory = state_dir / SECRETS_DIR
    try:
        return sorted(
            p.name
            for p in directory.iterdir()
            if _NAME.match(p.name) and p.is_file() and not p.is_symlink()
        )
    except FileNotFoundError:
        return []


def secret_digest(value: str) -> str:
    """A short digest that identifies a value without revealing it."""
    return "sha256:" + hashlib.sha256(value.strip().encode()).hexdigest()[:16]


def secret_references(document: Any) -> set[str]:
    """Every secret a raw document refers to: `{secret_ref: NAME}` values and `"secret:NAME"`."""
    return set(_references(document))


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("secret_ref")
        if isinstance(ref, str) and len(node) == 1:
            yield ref
            return
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)
    elif isinstance(node, str) and node.startswith("secret:"):
        yield node.removeprefix("secret:")
