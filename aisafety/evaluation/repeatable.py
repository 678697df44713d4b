"""Whether the model gives the same outputs for the same inputs twice.

Every stored number assumes it does: robust accuracy compares an attack's outputs with the
clean ones, and ``--resume`` joins units computed at different times. A model with dropout
left in training mode, or one that draws noise in its forward pass, gives other logits on
every call, so its numbers mix the attack's effect with the model's own noise. The run goes
on (such a model can be the point of the evaluation), with a warning naming the model and
the largest difference seen on the first batch run twice.

Differences within ``TOLERANCE`` x (1 + the largest |logit|) are not reported: a GPU may sum
in another order from one call to the next (atomic adds), which moves the last bits only. An
input defense that is random by design (one with a ``seed``) is not reported either: its
randomness is declared, and docs/defenses.md says how to attack it (``eot_samples``).
"""

from __future__ import annotations

import warnings

import torch

from aisafety.defense.obfuscation import input_defenses
from aisafety.errors import NotRepeatableWarning
from aisafety.evaluation.context import EvaluationContext

TOLERANCE = 1e-5  # relative to the logits' scale: float summation order, not randomness


def repeat_difference(ctx: EvaluationContext) -> float:
    """The largest |difference| between the clean logits of the first batch and the same
    batch's logits computed again."""
    first = slice(0, min(ctx.batch_size, len(ctx.data)))
    with torch.inference_mode():
        again = ctx.predictor.logits(ctx.x[first].to(ctx.predictor.device)).cpu()
    before = ctx.clean_logits[first]
    return float((again.double() - before.double()).abs().max()) if len(before) else 0.0


def not_repeatable_message(ctx: EvaluationContext) -> str | None:
    """The warning when the model's outputs for one batch differ between two forward
    passes, else None (also what a Ray worker hands to the driver, distributed/tasks.py)."""
    if any(hasattr(d.config, "seed") for d in input_defenses(ctx.predictor)):
        return None
    difference = repeat_difference(ctx)
    scale = float(ctx.clean_logits.abs().max()) if ctx.clean_logits.numel() else 0.0
    if difference <= TOLERANCE * (1 + scale):  # False for NaN: a NaN difference differs
        return None
    return (
        f"model {ctx.predictor.name!r} is not deterministic: two forward passes of the "
        f"same batch differ by up to {difference:.3g} in the logits (largest |logit| "
        f"{scale:.3g}), so its numbers mix the attacks' effect with the model's own "
        "randomness; put the model in eval mode (dropout) or seed its noise, or read "
        "the results as those of a random model (docs/reliability.md)"
    )


def warn_if_not_repeatable(ctx: EvaluationContext) -> None:
    """Warn when the model's outputs for one batch differ between two forward passes."""
    if (message := not_repeatable_message(ctx)) is not None:
        warnings.warn(message, NotRepeatableWarning, stacklevel=2)
