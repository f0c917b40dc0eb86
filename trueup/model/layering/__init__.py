"""Layered desired state: labels, selectors, profiles with typed variables, rendering.

A device's desired document is rendered from the profiles whose selector
matches its labels (lowest priority first), its variables and its own layer.
Everything here is pure: the same inputs give the same document and digest in
every process. The server stores the inputs and the rendered revisions; the
agent only ever sees a rendered, validated document.
"""

from trueup.model.layering.diff import diff_documents
from trueup.model.layering.merge import DELETE, LIST_KEYS, REPLACE, merge_layers
from trueup.model.layering.profiles import Profile, ProfileError, load_profile_text, parse_profile
from trueup.model.layering.render import Renderer, render_device
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
from trueup.model.layering.variables import VARIABLE_TYPES, Variable, variables_digest

__all__ = [
    "DELETE",
    "LIST_KEYS",
    "REPLACE",
    "VARIABLE_TYPES",
    "DeviceInputs",
    "PathChange",
    "Profile",
    "ProfileError",
    "Provenance",
    "RenderError",
    "RenderProblem",
    "Rendered",
    "Renderer",
    "Requirement",
    "Selector",
    "SelectorError",
    "Variable",
    "diff_documents",
    "label_key_problem",
    "label_problems",
    "label_value_problem",
    "load_profile_text",
    "merge_layers",
    "parse_profile",
    "parse_selector",
    "render_device",
    "variables_digest",
]
