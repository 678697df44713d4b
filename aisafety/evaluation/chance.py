"""Whether the model's clean accuracy is above chance on the plan's images.

A model fed inputs it was not trained on (no mean/std, 0..1 pixels for a 0..255 network,
nhwc for nchw, another label order) still runs and gives numbers, and every robustness
figure is then one of a model that does not see its images. The run goes on (an untrained
model can be the subject), with a warning naming the model, its accuracy, the chance level
and the plan fields to check.

Chance is the larger of 1/num_classes and the largest class share of the labels (a model
that always answers the commonest label reaches it). The warning is given when a one-sided
binomial test cannot tell the correct count from chance at ``ALPHA``, and only on at least
``MIN_IMAGES`` images: on fewer, a working model can miss the test by bad luck.
"""

from __future__ import annotations

import warnings

import torch
from scipy.special import bdtrc

from aisafety.errors import AtChanceWarning
from aisafety.evaluation.context import EvaluationContext
from aisafety.prediction.base import Predictor

ALPHA = 0.01  # a working model at chance by luck: one plan in a hundred at most
MIN_IMAGES = 30  # fewer: too few for an accuracy to say much either way


def chance_level(labels: torch.Tensor, num_classes: int) -> float:
    """The accuracy of the best constant answer, and at least 1/num_classes."""
    if not len(labels):
        return 1.0 / num_classes
    share = float(torch.bincount(labels.long()).max()) / len(labels)
    return max(1.0 / num_classes, share)


def above_chance_p(correct: int, total: int, chance: float) -> float:
    """One-sided binomial p-value: P(at least ``correct`` of ``total`` right at ``chance``)."""
    if correct <= 0:
        return 1.0
    return float(bdtrc(correct - 1, total, chance))


def chance_warning(
    name: str, correct: int, total: int, chance: float, settings: str = Predictor.input_settings
) -> str | None:
    """The warning's text when ``correct`` of ``total`` is not above ``chance``, else None;
    ``settings`` names where the model's input settings are given, to check."""
    if total < MIN_IMAGES or chance >= 1:  # one label only: no accuracy is above chance
        return None
    p = above_chance_p(correct, total, chance)
    if p <= ALPHA:
        return None
    return (
        f"model {name!r} has clean accuracy {correct / total:.3f} ({correct}/{total}) on the "
        f"plan's images, not above chance ({chance:.3f}; one-sided binomial p = {p:.2g}), so "
        "every number of this run is that of a model that does not see its inputs; unless "
        f"the model is meant to be untrained, check {settings} and the dataset's label "
        "order (docs/own-model.md)"
    )


def at_chance_message(ctx: EvaluationContext) -> str | None:
    """The warning for ``ctx``'s clean pass when its accuracy is not above chance."""
    total, correct = len(ctx.y), int(ctx.clean_correct.sum())
    chance = chance_level(ctx.y, ctx.predictor.num_classes)
    predictor = ctx.predictor
    return chance_warning(predictor.name, correct, total, chance, predictor.input_settings)


def warn_if_at_chance(ctx: EvaluationContext) -> None:
    """Warn when the clean accuracy on the plan's images is not above chance."""
    message = at_chance_message(ctx)
    if message:
        warnings.warn(message, AtChanceWarning, stacklevel=2)
