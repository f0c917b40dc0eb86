"""The JSON shapes of steps and differences (`trueup.subsystems.base`): the journal, `plan`
and status show them; `base` re-exports every name here."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["DifferenceJSON", "PlannedStep", "PlannedValues", "StepJSON"]


class StepJSON(TypedDict):
    """A step as the journal and `plan` show it."""

    subsystem: str
    action: str
    path: str
    args: dict[str, Any]


class PlannedValues(TypedDict):
    """What a step's path holds now and what the document asks (`plan`'s old → new)."""

    old: Any
    new: Any


class _DescribedStep(StepJSON):
    describe: str


class PlannedStep(_DescribedStep, total=False):
    """A step in `plan`'s answer: its JSON, its description and, where the path is a fact,
    its old → new values (`PlannedValues`)."""

    old: Any
    new: Any


class _DifferenceRequired(TypedDict):
    subsystem: str
    path: str
    desired: Any
    observed: Any


class DifferenceJSON(_DifferenceRequired, total=False):
    """A difference as status and the drift report show it (`missing`/`extra`: of a list)."""

    missing: list[Any]
    extra: list[Any]
