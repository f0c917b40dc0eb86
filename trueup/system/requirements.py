"""What a subsystem needs on the machine before it can run, and whether the machine has it.

Who uses this: each subsystem's `requirements(document)` (declared beside its
daemon's argv in this layer: `kea.requirements`, `keepalived.REQUIREMENTS`, …)
and `trueup preflight`, which checks every requirement of the document the
new agent will run:

```python
need = binary("keepalived", "keepalived", probe=("-v",))
result = check(need, SubprocessRunner())
result.ok, result.message   # False, "keepalived not found on PATH"
result.remedy               # "install the Debian package keepalived"
```

A binary is found on PATH *and executed* in a harmless mode (`-v`,
`--version`) with a short timeout: a binary that is present but cannot run
(a broken library, a wrapper that exits 1) fails as surely as a missing one.
A library (a Kea hook) must be a regular, readable ELF shared object, since
that is what the daemon will `dlopen`. A file must be a readable regular
file, a directory a directory. Checks only read; nothing changes.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from trueup.system.runner import Runner

__all__ = [
    "PROBE_TIMEOUT",
    "Requirement",
    "RequirementJSON",
    "RequirementResult",
    "RequirementResultJSON",
    "binary",
    "check",
    "directory",
    "library",
    "regular_file",
]

# Long enough for a cold start on a loaded machine, short enough that a binary that
# hangs (waiting on a socket, a terminal) does not hold preflight up.
PROBE_TIMEOUT = 10.0
Kind = Literal["binary", "library", "file", "directory"]
_ELF_MAGIC = b"\x7fELF"
_ET_DYN = 3  # e_type of a shared object (and of a position-independent executable)


class RequirementJSON(TypedDict):
    """A requirement as `trueup preflight -o json` and startup show it."""

    kind: Kind
    name: str
    package: str
    why: str


class RequirementResultJSON(RequirementJSON):
    """A requirement and whether the machine meets it."""

    ok: bool
    path: str | None
    remedy: str


@dataclass(frozen=True)
class Requirement:
    """One thing a subsystem needs: `name` is a program (looked up on PATH) or an absolute path."""

    kind: Kind
    name: str
    package: str  # the Debian package that provides it
    probe: tuple[str, ...] = ()  # binaries: the harmless arguments it is run with
    why: str = ""  # what in the document needs it, when not the subsystem as a whole

    def to_json(self) -> RequirementJSON:
        return {"kind": self.kind, "name": self.name, "package": self.package, "why": self.why}


def binary(
    name: str, package: str, probe: tuple[str, ...] = ("--version",), why: str = ""
) -> Requirement:
    return Requirement("binary", name, package, probe, why)


def library(path: str | Path, package: str, why: str = "") -> Requirement:
    return Requirement("library", str(path), package, why=why)


def regular_file(path: str | Path, package: str, why: str = "") -> Requirement:
    return Requirement("file", str(path), package, why=why)


def directory(path: str | Path, package: str, why: str = "") -> Requirement:
    return Requirement("directory", str(path), package, why=why)


@dataclass(frozen=True)
class RequirementResult:
    requirement: Requirement
    ok: bool
    message: str  # names the binary or file and, when not ok, what is wrong with it
    path: str | None = None  # where it was found
    remedy: str = ""  # when not ok: what to install

    def to_json(self) -> RequirementResultJSON:
        requirement = self.requirement
        return {
            "kind": requirement.kind,
            "name": requirement.name,
            "package": requirement.package,
            "why": requirement.why,
            "ok": self.ok,
            "path": self.path,
            "remedy": self.remedy,
        }


def _unmet(
    requirement: Requirement, problem: str, remedy: str, path: str | None = None
) -> RequirementResult:
    return RequirementResult(requirement, False, problem, path, remedy)


def _install(requirement: Requirement) -> str:
    if not requirement.package:
        return "install the package that provides it"
    return f"install the Debian package {requirement.package}"


def _reinstall(requirement: Requirement) -> str:
    if not requirement.package:
        return "reinstall the package that provides it"
    return f"reinstall the Debian package {requirement.package}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _check_binary(
    requirement: Requirement, runner: Runner, which: Callable[[str], str | None], timeout: float
) -> RequirementResult:
    found = which(requirement.name)
    if found is None:
        return _unmet(requirement, f"{requirement.name} not found on PATH", _install(requirement))
    if not requirement.probe:  # declared without a harmless mode: presence is all we know
        return RequirementResult(requirement, True, f"{requirement.name} at {found}", found)
    argv = [found, *requirement.probe]
    done = runner.run(argv, timeout=timeout)
    if done.ok:
        first = done.stdout.strip().splitlines()[0] if done.stdout.strip() else done.stderr
        version = _last_line(first)
        detail = f" ({version})" if version else ""
        return RequirementResult(
            requirement, True, f"{requirement.name} at {found} runs{detail}", found
        )
    said = _last_line(done.stderr) or _last_line(done.stdout)
    if done.returncode == 124:
        what = f"`{' '.join(argv)}` did not finish within {timeout:g} s"
    else:
        what = f"`{' '.join(argv)}` exited {done.returncode}" + (f": {said}" if said else "")
    return _unmet(
        requirement, f"{found} is present but cannot run: {what}", _reinstall(requirement), found
    )


def _check_path(requirement: Requirement) -> RequirementResult:
    path = Path(requirement.name)
    try:
        info = path.stat()
    except FileNotFoundError:
        return _unmet(requirement, f"{path} missing", _install(requirement))
    except OSError as exc:
        return _unmet(
            requirement, f"{path} cannot be read ({exc.strerror})", _reinstall(requirement)
        )
    if requirement.kind == "directory":
        if not stat.S_ISDIR(info.st_mode):
            return _unmet(requirement, f"{path} is not a directory", _reinstall(requirement))
        return RequirementResult(requirement, True, f"{path} present", str(path))
    if not stat.S_ISREG(info.st_mode):
        return _unmet(requirement, f"{path} is not a regular file", _reinstall(requirement))
    if not os.access(path, os.R_OK):
        return _unmet(requirement, f"{path} is not readable", _reinstall(requirement))
    if requirement.kind == "library":
        try:
            with path.open("rb") as handle:
                header = handle.read(18)
        except OSError as exc:
            return _unmet(
                requirement, f"{path} cannot be read ({exc.strerror})", _reinstall(requirement)
            )
        if len(header) < 18 or not header.startswith(_ELF_MAGIC):
            return _unmet(
                requirement, f"{path} is not an ELF shared object", _reinstall(requirement)
            )
        # e_type sits at offset 16, in the byte order EI_DATA (offset 5) names.
        order: Literal["little", "big"] = "big" if header[5] == 2 else "little"
        if int.from_bytes(header[16:18], order) != _ET_DYN:
            return _unmet(
                requirement,
                f"{path} is an ELF file but not a shared object",
                _reinstall(requirement),
            )
    return RequirementResult(requirement, True, f"{path} present", str(path))


def check(
    requirement: Requirement,
    runner: Runner,
    *,
    which: Callable[[str], str | None] = shutil.which,
    timeout: float = PROBE_TIMEOUT,
) -> RequirementResult:
    """Whether the machine meets `requirement`; reads and runs a harmless probe only."""
    if requirement.kind == "binary":
        return _check_binary(requirement, runner, which, timeout)
    return _check_path(requirement)
