"""A rollout's spec, its waves' members and each sent device's gates: pure, no database.

`parse_spec` checks what an operator asks for (every problem at once, each
naming its path) and `assign_waves` puts each target in exactly one wave,
deterministically: named devices and selectors first (a canary), then
percentages of the rest, cumulative (`{percent: 50}` then `{percent: 100}`:
half of the rest, then the other half), the rest ordered by a hash of the
device name so that a wave spreads over sites instead of taking one
alphabetical block.

`evaluate` judges one sent device from its newest report on the control
plane: the target digest applied and verified (the apply's transaction
committed, no failed apply), management ready, no reason code that was not
there when the revision was sent (one whose subsystem is acknowledged
excepted), and, when a confirmation window is set, the agent's confirmation
of that version. A rolled-back confirmation or a failed apply fails the device
at once; anything else waits until the gate timeout.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trueup.server.service.rolloutrecords import GatesJSON, SpecJSON, WaveJSON

__all__ = [
    "APPLY_FAILED_CODES",
    "Gates",
    "Spec",
    "Wave",
    "assign_waves",
    "evaluate",
    "parse_spec",
    "unavailable_limit",
]

APPLY_FAILED_CODES = frozenset({"STATE_RECONCILIATION_FAILED", "STATE_PARTIAL_UPDATE"})
MAX_WAVES = 20
MAX_SECONDS = 7 * 86400
DEFAULT_GATE_TIMEOUT = 900


@dataclass(frozen=True)
class Wave:
    """One wave as asked for: named devices, a selector, or a percentage of the rest."""

    devices: tuple[str, ...] | None = None
    selector: str | None = None
    percent: int | None = None
    approval: bool = False  # wait for an operator's approval before this wave starts

    def as_json(self) -> WaveJSON:
        out: WaveJSON = {}
        if self.devices is not None:
            out["devices"] = list(self.devices)
        if self.selector is not None:
            out["selector"] = self.selector
        if self.percent is not None:
            out["percent"] = self.percent
        if self.approval:
            out["approval"] = True
        return out


@dataclass(frozen=True)
class Spec:
    waves: tuple[Wave, ...]
    max_unavailable: int | str = "25%"  # devices changing at once per wave: N or "N%"
    soak_seconds: float = 0.0
    failure_budget: int = 0  # failed devices a wave may have; one more pauses the rollout
    confirm_within: int | None = None
    gate_timeout: float = DEFAULT_GATE_TIMEOUT

    def as_json(self) -> SpecJSON:
        return {
            "waves": [w.as_json() for w in self.waves],
            "max_unavailable": self.max_unavailable,
            "soak_seconds": self.soak_seconds,
            "failure_budget": self.failure_budget,
            "confirm_within": self.confirm_within,
            "gate_timeout": self.gate_timeout,
        }


def _number(
    problems: list[str], path: str, value: Any, low: float, high: float, integer: bool
) -> Any:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        what = "an integer" if integer else "a number"
        problems.append(f"{path}: {value!r} is not {what} from {low:.10g} to {high:.10g}")
        return None
    return value


def _wave(problems: list[str], path: str, data: Any) -> Wave | None:
    if not isinstance(data, Mapping):
        problems.append(f"{path}: expected an object with devices, selector or percent")
        return None
    unknown = sorted(set(data) - {"devices", "selector", "percent", "approval"})
    for key in unknown:
        problems.append(f"{path}.{key}: unknown field (devices, selector, percent, approval)")
    given = [k for k in ("devices", "selector", "percent") if k in data]
    if len(given) != 1:
        problems.append(f"{path}: give exactly one of devices, selector, percent")
        return None
    approval = data.get("approval", False)
    if not isinstance(approval, bool):
        problems.append(f"{path}.approval: {approval!r} is not true or false")
        approval = False
    kind = given[0]
    value = data[kind]
    if kind == "devices":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            problems.append(f"{path}.devices: expected a non-empty list of device names")
            return None
        return Wave(devices=tuple(value), approval=approval)
    if kind == "selector":
        if not isinstance(value, str):
            problems.append(f"{path}.selector: {value!r} is not a selector string")
            return None
        return Wave(selector=value, approval=approval)
    percent = _number(problems, f"{path}.percent", value, 1, 100, integer=True)
    return None if percent is None else Wave(percent=percent, approval=approval)


def parse_spec(data: Mapping[str, Any]) -> Spec:
    """The rollout spec in `data`; raises ValueError(problems) naming each path."""
    problems: list[str] = []
    raw = data.get("waves")
    waves: list[Wave] = []
    if raw is None:
        waves = [Wave(percent=100)]
    elif not isinstance(raw, list) or not 1 <= len(raw) <= MAX_WAVES:
        problems.append(f"waves: expected a list of 1 to {MAX_WAVES} waves")
    else:
        for i, item in enumerate(raw):
            wave = _wave(problems, f"waves[{i}]", item)
            if wave is not None:
                waves.append(wave)
        percents = [w.percent for w in waves if w.percent is not None]
        if percents != sorted(percents):
            problems.append("waves: percentages are cumulative; each must be >= the one before")
    if data.get("approval") is True:  # every wave after the first waits for an approval
        waves = [
            w if i == 0 else Wave(w.devices, w.selector, w.percent, True)
            for i, w in enumerate(waves)
        ]
    elif "approval" in data and not isinstance(data.get("approval"), bool):
        problems.append(f"approval: {data.get('approval')!r} is not true or false")
    max_unavailable: int | str = data.get("max_unavailable", "25%")
    if isinstance(max_unavailable, str):
        digits = max_unavailable.removesuffix("%")
        if not (max_unavailable.endswith("%") and digits.isdigit() and 1 <= int(digits) <= 100):
            problems.append(f"max_unavailable: {max_unavailable!r} is not N or N% (1-100%)")
    else:
        _number(problems, "max_unavailable", max_unavailable, 1, 1_000_000, integer=True)
    soak = _number(problems, "soak_seconds", data.get("soak_seconds", 0), 0, MAX_SECONDS, False)
    budget = _number(
        problems, "failure_budget", data.get("failure_budget", 0), 0, 1_000_000, integer=True
    )
    confirm = data.get("confirm_within")
    if confirm is not None:
        confirm = _number(problems, "confirm_within", confirm, 1, 86400, integer=True)
    timeout = _number(
        problems,
        "gate_timeout",
        data.get("gate_timeout", DEFAULT_GATE_TIMEOUT),
        1,
        MAX_SECONDS,
        False,
    )
    if problems:
        raise ValueError(problems)
    return Spec(
        waves=tuple(waves),
        max_unavailable=max_unavailable,
        soak_seconds=float(soak),
        failure_budget=int(budget),
        confirm_within=confirm,
        gate_timeout=float(timeout),
    )


def spec_from_json(data: Mapping[str, Any]) -> Spec:
    """A stored spec (written by `Spec.as_json`)."""
    return parse_spec(data)


def _spread(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def assign_waves(
    spec: Spec,
    devices: Sequence[str],
    matching: Callable[[str], Collection[str]] | None = None,
    refused: Mapping[str, str] | None = None,
) -> tuple[list[list[str]], list[str]]:
    """Each device's wave (a list of device names per wave), and the problems.

    `matching(selector)` names the devices a selector selects (None: selectors are not
    available). A device named by two waves goes in the first; a named device that is
    not a target is a problem (saying why when `refused`, device: why, names it); every
    target must end in a wave."""
    problems: list[str] = []
    targets = set(devices)
    taken: set[str] = set()
    waves: list[list[str]] = [[] for _ in spec.waves]
    for i, wave in enumerate(spec.waves):
        if wave.devices is not None:
            for name in wave.devices:
                if name not in targets:
                    why = (refused or {}).get(name)
                    problems.append(
                        f"waves[{i}].devices: {name!r} is not a target of the plan"
                        + (f": the plan refuses it ({why})" if why else "")
                    )
                elif name not in taken:
                    taken.add(name)
                    waves[i].append(name)
        elif wave.selector is not None:
            if matching is None:
                problems.append(
                    f"waves[{i}].selector: selectors need device labels, which this control "
                    "plane does not hold; name the devices instead"
                )
                continue
            try:
                selected = set(matching(wave.selector))
            except ValueError as exc:
                problems.append(f"waves[{i}].selector: {exc}")
                continue
            for name in sorted(selected & targets - taken):
                taken.add(name)
                waves[i].append(name)
            if not waves[i]:  # a mistyped canary would leave the next wave the whole fleet
                problems.append(
                    f"waves[{i}].selector: {wave.selector!r} selects no target of the plan "
                    "that an earlier wave did not take"
                )
    rest = sorted(targets - taken, key=lambda n: (_spread(n), n))
    done = 0
    for i, wave in enumerate(spec.waves):
        if wave.percent is None:
            continue
        upto = min(len(rest), math.ceil(len(rest) * wave.percent / 100))
        waves[i].extend(rest[done:upto])
        done = max(done, upto)
    if done < len(rest):
        problems.append(
            f"waves: {len(rest) - done} target(s) are in no wave (for example "
            f"{rest[done]!r}); end the waves with {{percent: 100}}"
        )
    return [sorted(w) for w in waves], problems


def unavailable_limit(spec: Spec, wave_size: int) -> int:
    """How many of a wave's devices may be changing at once (at least one)."""
    value = spec.max_unavailable
    if isinstance(value, str):
        return max(1, math.ceil(wave_size * int(value.removesuffix("%")) / 100))
    return max(1, int(value))


@dataclass(frozen=True)
class Gates:
    """One sent device's gates: each True (passed), False (failed) or None (not yet)."""

    verdict: str  # "passed" | "failed" | "waiting"
    reason: str = ""
    checks: dict[str, bool | None] = field(default_factory=dict)

    def as_json(self) -> GatesJSON:
        return {"verdict": self.verdict, "reason": self.reason, "checks": dict(self.checks)}


def _acked(report: Mapping[str, Any], server_acked: Collection[str]) -> set[str]:
    """Subsystems acknowledged on the control plane or by the router's own `trueup ack`."""
    acked = set(server_acked)
    for ack in report.get("acknowledgements") or []:
        if isinstance(ack, Mapping) and ack.get("state", "active") == "active":
            acked.add(str(ack.get("subsystem")))
    return acked


def new_codes(
    report: Mapping[str, Any], baseline: Collection[str], server_acked: Collection[str]
) -> list[str]:
    """Reason codes the report has that were not there at the send, unless every finding
    behind a code is for an acknowledged subsystem."""
    acked = _acked(report, server_acked)
    codes = {str(c) for c in report.get("reason_codes") or []} - set(baseline)
    out = []
    for code in sorted(codes):
        subsystems = {
            str(f.get("subsystem"))
            for f in report.get("findings") or []
            if isinstance(f, Mapping) and f.get("code") == code
        }
        if subsystems and subsystems <= acked:
            continue
        out.append(code)
    return out


def _confirmation(
    report: Mapping[str, Any], stored: Mapping[str, Any] | None, version: int
) -> tuple[str | None, str]:
    """The agent's confirmation state for `version` (pending, confirmed, rolled-back): the
    control plane's stored record, else the report's own."""
    record = stored if stored is not None else report.get("confirmation")
    if not isinstance(record, Mapping) or record.get("version") != version:
        return None, ""
    state = record.get("state")
    return (str(state) if isinstance(state, str) else None), str(record.get("reason") or "")


def evaluate(
    *,
    digest: str,
    sent_version: int,
    sent_at: float,
    now: float,
    report: Mapping[str, Any] | None,
    report_at: float | None,
    baseline: Collection[str],
    server_acked: Collection[str],
    confirm_within: int | None,
    gate_timeout: float,
    confirmation: Mapping[str, Any] | None = None,
) -> Gates:
    """The gates of one sent device from its newest report (see the module docstring)."""
    timed_out = now - sent_at > gate_timeout
    if report is None or report_at is None or report_at < sent_at:
        checks: dict[str, bool | None] = {"reported": False}
        if timed_out:
            return Gates(
                "failed", f"gate timeout: no report since the send ({gate_timeout:g}s)", checks
            )
        return Gates("waiting", "no report since the send", checks)
    state, why = _confirmation(report, confirmation, sent_version)
    if state == "rolled-back":
        return Gates(
            "failed",
            f"the agent rolled version {sent_version} back by itself" + (f": {why}" if why else ""),
            {"confirmed": False},
        )
    codes = {str(c) for c in report.get("reason_codes") or []}
    failed = sorted((codes & APPLY_FAILED_CODES) - set(baseline))
    journal = report.get("journal") or {}
    last = journal.get("last") if isinstance(journal, Mapping) else None
    last_failed = (
        isinstance(last, Mapping)
        and last.get("version") == sent_version
        and (last.get("state") == "rolled_back" or last.get("outcome") == "partial")
    )
    if failed or last_failed:
        detail = ", ".join(failed)
        if not failed and isinstance(last, Mapping):
            detail = f"its transaction ended {last.get('state')} ({last.get('outcome')})"
        return Gates("failed", f"the apply failed: {detail}", {"applied": False})
    applied = report.get("applied_digest") == digest
    committed = not (isinstance(last, Mapping) and last.get("state") == "open")
    checks = {
        "reported": True,
        "applied": applied,
        "verified": applied and committed,
        "management": report.get("management_ready") is True,
    }
    fresh = new_codes(report, baseline, server_acked)
    checks["no_new_reason_codes"] = not fresh
    if confirm_within is not None:
        checks["confirmed"] = state == "confirmed"
    if all(v is True for v in checks.values()):
        return Gates("passed", "", checks)
    waiting = [name for name, v in checks.items() if v is not True]
    reason = "waiting for " + ", ".join(waiting)
    if fresh:
        reason += f" (new reason codes: {', '.join(fresh)})"
    if timed_out:
        return Gates("failed", f"gate timeout ({gate_timeout:g}s): {reason}", checks)
    return Gates("waiting", reason, checks)
