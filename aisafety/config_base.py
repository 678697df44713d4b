"""Configuration objects for plugins: validated at construction, errors that name the field."""

from __future__ import annotations

import math
import reprlib
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from aisafety.errors import ConfigError


class PluginConfig(BaseModel):
    """Base of every attack, defense and metric ``Config``: unknown keys are errors, and so
    are values pydantic would coerce silently: ``steps: '3'`` (a string), ``steps: true``
    (a bool taken for 1) and ``step_size: .nan`` (NaN compares false with every bound)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_silent_coercion(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        for name, value in given.items():
            field = cls.model_fields.get(name)
            if field is not None:
                _check_number(name, value, _scalar_types(field.annotation))
        return given


def _scalar_types(annotation: Any) -> set[Any]:
    """The scalar types of a field's annotation (``int | None`` -> {int, None})."""
    args = get_args(annotation)
    if get_origin(annotation) is Annotated:
        return _scalar_types(args[0])
    if args and get_origin(annotation) in (Union, UnionType):
        return set().union(*(_scalar_types(a) for a in args))
    return {annotation}


def _check_number(name: str, value: Any, types: set[Any]) -> None:
    numeric = {t for t in types if t in (int, float, "int", "float")}
    if not numeric or str in types or "str" in types:
        return
    kind = "an integer" if numeric <= {int, "int"} else "a number"
    if isinstance(value, bool) and bool not in types and "bool" not in types:
        raise ValueError(f"{name} must be {kind}, not {str(value).lower()}")
    if isinstance(value, str):
        raise ValueError(f"{name} must be {kind}, not the string {value!r} ({number_fix(value)})")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be {kind}, not NaN")


def number_fix(text: str) -> str:
    """What to write instead of a number given as text. YAML has no arithmetic: it reads
    ``eps: 8/255`` as the string '8/255', quoted or not, so a fraction is answered with its
    value, and "unquote it" only where that gives a number."""
    numerator, slash, denominator = text.partition("/")
    try:
        value = float(numerator) / float(denominator) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        return "write a number"
    return f"YAML does not divide: write its value, {value!r}" if slash else "write it unquoted"


def describe_errors(exc: ValidationError) -> list[str]:
    """One 'field: problem (got value)' line per pydantic error (long values shortened)."""
    return [_describe(e) for e in exc.errors()]


def _describe(error: Any) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a check of the whole config names its field itself
        return message
    return f"{'.'.join(map(str, error['loc']))}: {message} (got {_short(error.get('input'))})"


def _short(value: object, limit: int = 120) -> str:
    short = reprlib.Repr()  # bounded: an alias-expanded value can be gigabytes long
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_config(owner: str, cls: type[PluginConfig], given: dict[str, Any]) -> PluginConfig:
    """Validate ``given`` against ``cls``; a bad value becomes a ConfigError naming ``owner``."""
    try:
        return cls(**given)
    except ValidationError as exc:
        problems = "; ".join(describe_errors(exc))
        fields = ", ".join(
            f"{k}={v.get_default(call_default_factory=True)!r}" for k, v in cls.model_fields.items()
        )  # a default_factory's value, not PydanticUndefined
        raise ConfigError(f"{owner}: {problems}. Valid settings: {fields or '(none)'}") from None
