"""The checks of the model every run makes, as one sequence both executors run.

A local run (``runner.py``) and a Ray worker's prepare task (``distributed/tasks.py``) call
these two functions and nothing else, so a check added to a list here runs on both paths.
Each check warns (an ``AISafetyWarning``, kept with the run by ``warning_log.py``); none
stops the run. Order: ``BEFORE_WORK`` reads only the model and the data (a wrong class count
is named before any forward pass); ``WITH_FORWARD_PASSES`` run the model again after the
clean pass (its integrity is checked after them, by the local runner); ``ON_CLEAN_OUTPUTS``
only read the clean outputs (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Callable

from aisafety.evaluation.chance import warn_if_at_chance
from aisafety.evaluation.class_count import warn_if_class_count_differs
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.probabilities import warn_if_probabilities
from aisafety.evaluation.repeatable import warn_if_not_repeatable

Check = Callable[[EvaluationContext], None]


def warn_if_classes_differ(ctx: EvaluationContext) -> None:
    """A CIFAR-100 model on CIFAR-10: warned before any work (``class_count.py``)."""
    warn_if_class_count_differs(ctx.data, ctx.predictor)


BEFORE_WORK: tuple[Check, ...] = (warn_if_classes_differ,)
WITH_FORWARD_PASSES: tuple[Check, ...] = (warn_if_not_repeatable,)  # a second pass of a batch
ON_CLEAN_OUTPUTS: tuple[Check, ...] = (
    warn_if_at_chance,  # wrong mean/std, scale or layout
    warn_if_probabilities,  # a final softmax: confidences of softmax(p)
)


def warn_before_work(ctx: EvaluationContext) -> None:
    """The checks that need no forward pass, before any."""
    for check in BEFORE_WORK:
        check(ctx)


def warn_after_clean_pass(
    ctx: EvaluationContext, forward_passes_checked: Callable[[], None] = lambda: None
) -> None:
    """The clean pass, then the checks of the model and its clean outputs;
    ``forward_passes_checked`` runs between the checks that make forward passes and those
    that read the outputs (the local runner's integrity check of the model's passes)."""
    ctx.clean_logits  # noqa: B018 - computed first: every check below reads it
    for check in WITH_FORWARD_PASSES:
        check(ctx)
    forward_passes_checked()
    for check in ON_CLEAN_OUTPUTS:
        check(ctx)
