"""Commands whose exit 2 means something (`plan`, `fleet plan`: changes; `drift`: drift).

Click exits 2 on a usage error (an unknown option, a missing value); for these commands a
script would read that as "changes". Their usage errors exit 1 instead, as every other
error of theirs does (terraform's `-detailed-exitcode`: 1 is an error).
"""

from __future__ import annotations

from typing import Any

from typer._click.core import Context  # typer vendors click: its own classes, not click's
from typer._click.exceptions import UsageError
from typer.core import TyperCommand

__all__ = ["DetailedExitCommand"]


class DetailedExitCommand(TyperCommand):
    """A typer command whose usage errors exit 1, not 2."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as exc:
            exc.exit_code = 1
            raise
