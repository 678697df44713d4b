"""``scoped``: the one set/yield/reset of the ``ContextVar`` hooks (deadline, stall watch,
memory budget, pass precision, dense passes)."""

from __future__ import annotations

from contextvars import ContextVar

import pytest

from aisafety.scoped import scoped

VAR: ContextVar[int] = ContextVar("test_scoped", default=0)


def test_the_value_holds_inside_and_the_outer_one_comes_back():
    with scoped(VAR, 1) as inner:
        assert inner == 1 and VAR.get() == 1
        with scoped(VAR, 2):
            assert VAR.get() == 2
        assert VAR.get() == 1
    assert VAR.get() == 0


def test_an_exception_restores_the_outer_value():
    with pytest.raises(KeyError), scoped(VAR, 3):
        raise KeyError
    assert VAR.get() == 0
