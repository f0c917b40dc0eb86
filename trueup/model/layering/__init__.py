"""Layered desired state: labels, selectors, profiles with typed variables, rendering.

A device's desired document is rendered from the profiles whose selector
matches its labels (lowest priority first), its variables and its own layer.
Everything here is pure: the same inputs give the same document and digest in
every process. The server stores the inputs and the rendered revisions; the
agent only ever sees a rendered, validated document.
"""

from trueup.model.layering.selectors import (
    Requirement,
    Selector,
    SelectorError,
    label_key_problem,
    label_problems,
    label_value_problem,
    parse_selector,
)
from trueup.model.layering.types import (
    DeviceInputs,
    PathChange,
    Provenance,
    Rendered,
    RenderError,
    RenderProblem,
)

__all__ = [
    "DeviceInputs",
    "PathChange",
    "Provenance",
    "RenderError",
    "RenderProblem",
    "Rendered",
    "Requirement",
    "Selector",
    "SelectorError",
    "label_key_problem",
    "label_problems",
    "label_value_problem",
    "parse_selector",
]
