"""``keeping(log)`` (aisafety/warning_log.py) keeps every ``AISafetyWarning`` raised inside
it, whatever the warning filters say, and leaves the terminal to them; logs nest."""

from __future__ import annotations

import warnings

import pytest

from aisafety.errors import AISafetyWarning, GradientMaskingWarning
from aisafety.warning_log import KeptWarning, WarningLog, keeping


def test_the_filters_decide_what_is_printed_not_what_is_kept():
    log = WarningLog()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", "hidden")
        with keeping(log):
            for _ in range(3):
                warnings.warn("repeated", AISafetyWarning, stacklevel=1)  # shown once: "default"
            warnings.warn("hidden", GradientMaskingWarning, stacklevel=1)
            warnings.warn("not ours", UserWarning, stacklevel=1)
    assert [str(w.message) for w in shown] == ["repeated", "not ours"]
    assert log.entries == [
        KeptWarning(None, AISafetyWarning, "repeated"),
        KeptWarning(None, GradientMaskingWarning, "hidden"),
    ]
    with warnings.catch_warnings(), pytest.raises(AISafetyWarning, match="raised"):
        warnings.simplefilter("error", AISafetyWarning)
        with keeping(log):
            warnings.warn("raised", AISafetyWarning, stacklevel=1)
    assert log.entries[-1].message == "raised"


def test_a_nested_log_takes_what_is_raised_inside_it():
    run, unit = WarningLog(), WarningLog("k")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kept all the same
        with keeping(run):
            warnings.warn("the run's", AISafetyWarning, stacklevel=1)
            with keeping(unit):
                warnings.warn("the unit's", AISafetyWarning, stacklevel=1)
    assert [w.message for w in run.entries] == ["the run's"]
    assert unit.entries == [KeptWarning("k", AISafetyWarning, "the unit's")]
    assert run.take() == run.entries and run.take() == []  # each written once
