"""Every problem of a document at once: path-carrying errors and cross-field checks.

Who uses this: the document (`trueup.model.document`) and every section model
a subsystem registers. Pydantic runs a model's `after` validators only when
each of its fields validated, and stops at the first that raises: a reversed
pool would hide a reservation outside its subnet. Models here declare their
cross-field checks with `@check` instead, and `Checked` runs them itself:

* on a model whose fields all validated, every check runs (one failing check
  does not hide the next);
* on a model where some fields failed, every check runs on a partial model
  holding the fields that did validate: a check that reads a failed field
  (AttributeError) is left out, the others report beside the field errors.

```python
class Subnet(Checked):
    pools: list[Pool] = []
    reservations: list[Reservation] = []

    @check
    def _reservations_inside(self) -> list[tuple[str, str]]:
        return [(f"reservations[{i}].ip-address", "… is not inside …"), …]
```

A check returns (path below the model, message) pairs, or raises `PathError`
(or a ValueError, reported at the model's own path).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from trueup.model.limits import input_excerpt

__all__ = ["Checked", "PathError", "check", "describe"]

_F = TypeVar("_F", bound=Callable[..., Any])
_CHECK_MARK = "__trueup_check__"


class PathError(ValueError):
    """Raised inside validators to report problems at paths below the model being validated."""

    def __init__(self, path: str, message: str) -> None:
        self.problems = [(path, message)]
        super().__init__(f"{path}: {message}")

    @classmethod
    def many(cls, problems: list[tuple[str, str]]) -> PathError:
        error = cls(*problems[0])
        error.problems = problems
        return error


def check(method: _F) -> _F:
    """Mark a method of a `Checked` model as one of its cross-field checks."""
    setattr(method, _CHECK_MARK, True)
    return method


@functools.cache
def _checks(cls: type[BaseModel]) -> tuple[Callable[[Any], Any], ...]:
    seen: dict[str, Callable[[Any], Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if callable(value) and getattr(value, _CHECK_MARK, False):
                seen[name] = value
    return tuple(seen.values())


@functools.cache
def _adapter(cls: type[BaseModel], name: str) -> TypeAdapter[Any]:
    field = cls.model_fields[name]
    annotation: Any = field.annotation
    if field.metadata:
        annotation = Annotated[(annotation, *field.metadata)]
    return TypeAdapter(annotation)


def _run_checks(model: BaseModel, partial: bool = False) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for method in _checks(type(model)):
        try:
            found = method(model)
        except PathError as exc:
            problems.extend(exc.problems)
            continue
        except AttributeError:
            if not partial:
                raise
            continue  # the check needs a field that failed
        except ValueError as exc:
            problems.append(("", str(exc)))
            continue
        if isinstance(found, list):
            problems.extend(found)
    return problems


def _partial(cls: type[BaseModel], data: Any, error: ValidationError) -> BaseModel | None:
    """`cls` holding the fields of `data` that validated, without those that failed;
    None when nothing can be said (not a mapping, or the model as a whole failed)."""
    if not isinstance(data, dict):
        return None
    by_key: dict[str, str] = {}
    for name, field in cls.model_fields.items():
        by_key[name] = name
        if field.alias:
            by_key[field.alias] = name
    failed: set[str] = set()
    for item in error.errors(include_url=False):
        if not item["loc"]:
            return None  # a before-validator of the model itself: its fields were not read
        owner = by_key.get(str(item["loc"][0]))
        if owner is not None:
            failed.add(owner)
    values: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if name in failed:
            continue
        key = field.alias if field.alias and field.alias in data else name
        if key not in data:
            continue
        try:
            values[name] = _adapter(cls, name).validate_python(data[key])
        except ValidationError:
            return None
    model = cls.model_construct(**values)
    for name in failed:
        model.__dict__.pop(name, None)
    return model


def _format_loc(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            name = input_excerpt(str(part), 80)  # a key is user input: a huge one is cut
            path += f".{name}" if path else name
    return path


def describe(
    error: ValidationError, rewrite: Callable[[dict[str, Any]], str | None] | None = None
) -> list[tuple[str, str]]:
    """Pydantic's errors as (path, message): `spec.interfaces[1].addresses[0]`, with the
    problems a `PathError` carries below its model's path. `rewrite` may replace the
    message of an error (its pydantic error dict)."""
    out: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and "[" in p))
        ctx = item.get("ctx") or {}
        inner = ctx.get("error")
        base = _format_loc(loc)
        if isinstance(inner, PathError):
            for sub, message in inner.problems:
                joined = (
                    base
                    if not sub
                    else sub
                    if not base
                    else (f"{base}{sub}" if sub.startswith("[") else f"{base}.{sub}")
                )
                out.append((joined, message))
            continue
        message = str(inner) if isinstance(inner, ValueError) else item["msg"]
        custom = rewrite(dict(item)) if rewrite is not None else None
        if custom is not None:
            message = custom
        elif item["type"] == "extra_forbidden":
            message = "unknown field (not part of trueup/v1)"
        elif item["type"] == "missing":
            message = "required field is missing"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        out.append((base, message))
    return out


class Checked(BaseModel):
    """A model whose `@check` methods run even when some of its fields failed."""

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            model = handler(data)
        except ValidationError as exc:
            if not _checks(cls):
                raise
            partial = _partial(cls, data, exc)
            extra = _run_checks(partial, partial=True) if partial is not None else []
            if not extra:
                raise
            raise PathError.many([*describe(exc), *extra]) from None
        if isinstance(model, BaseModel):
            problems = _run_checks(model)
            if problems:
                raise PathError.many(problems)
        return model
