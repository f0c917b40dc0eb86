"""The command seam: every external program trueup runs goes through a Runner."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Completed", "Runner", "SubprocessRunner"]


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Runner(Protocol):
    def run(
        self, argv: list[str], *, input: str | None = None, timeout: float = 30.0
    ) -> Completed: ...


class SubprocessRunner:
    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        try:
            proc = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return Completed(tuple(argv), 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return Completed(tuple(argv), 124, "", f"{argv[0]}: timed out after {timeout:g}s")
        return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
