"""Rendering for CLI output: json, yaml and human tables.

Standard library only (yaml is imported when yaml output is asked for): the
typer commands in `trueup.cli.main` and the fast path in `trueup.cli.fast`
print through the same functions, so both render the same bytes. The status
table itself is `trueup.cli.statustable` (standard library only as well).
"""

from __future__ import annotations

import json
import sys

from trueup.cli.statustable import (
    readable,
    render_findings,
    render_last_drift,
    render_status,
    when,
    who,
)

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from typing import Any, TextIO

    from trueup.cli.bodies import (
        ApplyBody,
        DriftReport,
        MessageBody,
        PlanBody,
        PlanStep,
        StatusBody,
    )

__all__ = [
    "REFUSAL_EXIT_CODES",
    "echo",
    "emit",
    "print_acknowledged",
    "print_apply",
    "print_confirmed",
    "print_drift",
    "print_plan",
    "print_status",
    "readable",
    "render_findings",
    "render_status",
]

# trueup.model.reasons.EXIT_CODES by value (a unit test keeps the two equal): the
# process exit code of a refused write.
REFUSAL_EXIT_CODES = {"STATE_CONCURRENT_MODIFICATION": 3, "STATE_VERSION_SKEW": 4}
# trueup.model.reasons.ReasonCode.PARTIAL_UPDATE (the same unit test keeps them equal).
PARTIAL_UPDATE = "STATE_PARTIAL_UPDATE"


def echo(message: str = "", err: bool = False) -> None:
    """What `typer.echo` does with a string: a line, ANSI codes stripped when not a terminal."""
    stream: TextIO | None = sys.stderr if err else sys.stdout
    if stream is None:
        return
    text = message + "\n"
    isatty = getattr(stream, "isatty", None)
    if "\033" in text and not (isatty is not None and isatty()):
        import re  # click's strip_ansi

        text = re.sub(r"\033\[[;?0-9]*[a-zA-Z]", "", text)
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    buffer = getattr(stream, "buffer", None)
    if encoding in ("ascii", "usascii", "ansix3.41968", "646") and buffer is not None:
        stream.flush()
        buffer.write(text.encode("utf-8", "replace"))
        buffer.flush()
        return
    stream.write(text)
    stream.flush()


def emit(value: Any, output: str) -> None:
    if output == "json":
        echo(json.dumps(value, indent=2, sort_keys=False))
    elif output == "yaml":
        import yaml

        echo(yaml.safe_dump(value, sort_keys=False).rstrip())
    else:
        import typer

        raise typer.BadParameter(f"unknown output format {output!r}")


def print_apply(result: ApplyBody, output: str) -> int:
    """`apply`, `rollback` and `reconcile`'s output; the exit code: 0 done, 1 not."""
    if output != "table":
        emit(result, output)
    else:
        _apply_table(result)
    if result["outcome"] == "partial":
        echo(
            f"{PARTIAL_UPDATE}: failed subsystems: {', '.join(result.get('failed', {}))}", err=True
        )
    return 0 if result["ok"] else 1


def _apply_table(result: ApplyBody) -> None:
    for step in result.get("steps", []):
        echo(f"  {step}")
    outcome = result["outcome"]
    txn = f" ({result['txn']})" if result.get("txn") else ""
    if outcome == "rolled_back":
        why = "; ".join(f"{n}: {e}" for n, e in result.get("failed", {}).items())
        tried = result.get("attempted_version")
        echo(
            (f"version {tried} was not applied; " if tried is not None else "not applied; ")
            + f"version {result['version']} remains (rolled back: {why or 'a step failed'})"
            + txn
        )
    else:
        echo(f"version {result['version']}: {outcome}{txn}")
    for name, error in result.get("failed", {}).items():
        echo(f"  failed {name}: {error}", err=True)
    for name, why in result.get("waiting", {}).items():
        echo(f"  waiting {name}: {why}", err=True)
    for name, error in result.get("carried", {}).items():
        echo(
            f"  still failing {name} (unchanged by this write; the agent keeps healing it): "
            f"{error}",
            err=True,
        )
    for error in result.get("rollback_errors", []):
        echo(f"  rollback error: {error}", err=True)
    for cleared in result.get("cleared", []):
        echo(f"  {cleared}")
    pending = result.get("pending_confirmation")
    if pending:
        echo(
            f"pending confirmation: run `trueup confirm` before {pending['deadline']}"
            " or this version is rolled back"
        )


def print_confirmed(body: MessageBody) -> int:
    """`trueup confirm`'s output: the agent's line; exit 1 when nothing was confirmed."""
    echo(body.get("message", json.dumps(body)))
    return 0 if body.get("ok", True) else 1


def print_acknowledged(body: MessageBody) -> int:
    """`trueup ack`'s output: the agent's line (stderr and exit 1 when it did not)."""
    if not body.get("ok", True):
        echo(f"trueup: {body.get('message', json.dumps(body))}", err=True)
        return 1
    echo(body.get("message", json.dumps(body)))
    return 0


def print_plan(body: PlanBody, output: str, source: str = "the document") -> int:
    """`trueup plan`'s output; the exit code: 1 a subsystem refuses the document, 2 changes, 0 none."""
    steps = [s for p in body["plans"] for s in p["steps"]]
    failed: dict[str, str] = body.get("failed") or {}
    if output != "table":
        emit(body, output)
        return 1 if failed else 2 if steps else 0
    where = body.get("observed_by", {})
    if where.get("agent_pid"):
        echo(
            f"observed by the agent (pid {where['agent_pid']}, state {where['state_dir']}, "
            f"applied version {where.get('applied_version')})"
        )
    else:
        echo(
            f"observed by this process (no agent answers on {where.get('state_dir')}/agent.sock): "
            f"network namespace {where.get('netns')}; run plan where the agent runs"
        )
    for p in body["plans"]:
        if p.get("error"):
            echo(f"  ! {p['subsystem']}: {p['error']}", err=True)
        elif p["steps"]:
            for step in p["steps"]:
                echo(f"  {_step_line(step)}")
        else:
            for reason in p["noop"]:
                echo(f"  = {p['subsystem']}: {reason}")
    changes = body.get("management_changes", [])
    for change in changes:
        echo(f"  ! management: {change}", err=True)
    if changes:
        echo(
            "  ! this changes management access: apply with --confirm-within SECONDS "
            "(rolled back unless `trueup confirm` arrives in time)",
            err=True,
        )
    if body.get("managed_by"):
        echo(
            f"  ! managed by the control plane at {body['managed_by']}: applying locally "
            'needs --override "REASON"',
            err=True,
        )
    if failed:
        echo(
            f"{source}: refused by {', '.join(failed)}: applying it would fail and change "
            "nothing; fix the path named above",
            err=True,
        )
        return 1
    echo(f"{len(steps)} change(s)" if steps else "no changes")
    return 2 if steps else 0


def _step_line(step: PlanStep) -> str:
    """`~ links: set-mtu lan0: 1500 → 1400` for a value that changes, `+ …` for what is added,
    `- …` for what goes."""
    old, new = step.get("old"), step.get("new")
    if (
        "old" not in step
        or old == new
        or isinstance(old, (dict, list))
        or isinstance(new, (dict, list))
    ):
        # A step on one element of a list or a record: its description says which.
        return f"+ {step['describe']}"
    args = step.get("args") or {}
    subject = next(
        (str(args[k]) for k in ("ifname", "name", "interface") if args.get(k)), step["path"]
    )
    head = f"{step['subsystem']}: {step['action']} {subject}"
    if old is None or old == "absent":
        return f"+ {head}: {readable(new, 120)}"
    if new is None or new == "absent":
        return f"- {head}: {readable(old, 120)}"
    return f"~ {head}: {readable(old, 120)} → {readable(new, 120)}"


def print_status(status: StatusBody, output: str) -> None:
    if output == "table":
        echo(render_status(status))
    else:
        emit(status, output)


def print_drift(report: DriftReport, output: str) -> int:
    """`trueup drift`'s output; the exit code: 0 in sync, 2 drift."""
    if output == "table":
        if report["in_sync"]:
            echo(f"in sync with version {report['applied_version']}")
        else:
            for d in report["differences"]:
                echo(
                    f"  {d['subsystem']}: {d['path']}: desired {readable(d['desired'])} "
                    f"observed {readable(d['observed'])}"
                )
            for name, record in (report.get("drift") or {}).items():
                echo(
                    f"  {name}: drifting since {when(record.get('since'), report.get('observed_at'))}"
                    f", detected by {record.get('detected_by') or '-'}"
                )
                for event in (record.get("attribution") or [])[:5]:
                    echo(f"      changed by: {who(event)}")
            echo("\n".join(render_findings(report["reason_codes"])))
        echo(
            "\n".join(render_last_drift(report.get("last_drift") or {}, report.get("observed_at")))
        )
    else:
        emit(report, output)
    return 0 if report["in_sync"] else 2
