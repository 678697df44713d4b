"""A context variable set for the length of a ``with`` block, then restored.

The hooks that reach a long computation without passing through its arguments (the
verification deadline, the stall watch, the memory budget, the bound passes' precision,
dense passes instead of receptive crops) each hold a ``ContextVar``; one helper sets and
resets them, so none can forget the ``finally`` that restores the outer value (an exception,
``OutOfTime`` included, leaves through it too).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")


@contextmanager
def scoped(var: ContextVar[Any], value: T) -> Iterator[T]:
    """``var`` is ``value`` inside the block and what it was before after it."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
