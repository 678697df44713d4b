"""Configuration objects for plugins: validated at construction, errors that name the field."""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from aisafety.errors import ConfigError


class PluginConfig(BaseModel):
    """Base of every attack, defense and metric ``Config``: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def describe_errors(exc: ValidationError) -> list[str]:
    """One 'field: problem (got value)' line per pydantic error (long values shortened)."""
    return [
        f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']} (got {_short(e.get('input'))})"
        for e in exc.errors()
    ]


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
        fields = ", ".join(f"{k}={v.default!r}" for k, v in cls.model_fields.items())
        raise ConfigError(f"{owner}: {problems}. Valid settings: {fields or '(none)'}") from None
