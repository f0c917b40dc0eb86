"""The `trueup` console entry: a fast path for what must be fast, else the full typer CLI.

- `trueup agent run …`: `trueup.agent.fastboot.boot` brings management up and
  answers before the agent's heavy imports (when that module is installed).
- `trueup status|drift|plan|confirm|ack …` against a running agent, and
  `trueup --help`: `trueup.cli.fast`, standard library only.
- Everything else, and whatever the fast path declines: `trueup.cli.main`.

Nothing heavy is imported at module level: `python -X importtime -m trueup.cli
status` shows what a call costs.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:2] == ["agent", "run"] and "--help" not in args:
        try:
            from trueup.agent.fastboot import boot
        except ModuleNotFoundError as exc:
            if exc.name != "trueup.agent.fastboot":
                raise
        else:
            raise SystemExit(boot(args[2:]))
    try:
        if args == ["--help"]:
            from trueup.cli.helptext import print_help as run_help

            code = run_help()
        else:
            from trueup.cli.fast import run

            code = run(args)
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # as typer exits on Ctrl-C
    except BrokenPipeError:
        # `trueup status | head -1`: quietly, as typer does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    if code is not None:
        raise SystemExit(code)
    from trueup.cli.main import main as full

    if argv is not None:
        sys.argv[1:] = argv
    full()


if __name__ == "__main__":
    main()
