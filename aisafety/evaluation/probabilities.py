"""Whether the model returns probabilities (a softmax already applied) instead of logits.

Every output is read as logits: the confidence metrics (``acac``, ``actc``, ``nte``, the
defense-cost and hypervolume ones) take their softmax, and the attacks' losses (cross-entropy,
NAttack's and the margin losses) take them as logits. A model ending in a softmax runs without
an error, and its confidences are then those of softmax(p): ``mnist-cnn`` with a softmax
appended stored ``acac`` 0.20 under PGD where the same network gives 0.82, the same robust
accuracy beside it. The run goes on (robust accuracy stays the model's), with a warning naming
the model and the fix.

Detected on the clean outputs: every row lies in [0, 1] and sums to 1 within ``TOLERANCE``
(float32 rounding of a softmax over 1,000 classes stays below 1e-5). Logits do not do that by
chance; log-probabilities (``log_softmax``) are logits up to a per-image shift and pass.
"""

from __future__ import annotations

import warnings

import torch

from aisafety.errors import ProbabilityOutputWarning
from aisafety.evaluation.context import EvaluationContext

TOLERANCE = 1e-4


def are_probabilities(scores: torch.Tensor) -> bool:
    """True when every row of ``scores`` (N, K), N > 0, K > 1, is a probability vector."""
    if scores.dim() != 2 or not len(scores) or scores.shape[1] < 2:
        return False
    scores = scores.detach().double()
    in_range = bool(((scores >= 0) & (scores <= 1)).all())
    return in_range and bool(((scores.sum(1) - 1).abs() <= TOLERANCE).all())


def probabilities_warning(name: str, scores: torch.Tensor) -> str | None:
    """The warning's text when ``scores`` are probabilities, else None."""
    if not are_probabilities(scores):
        return None
    return (
        f"model {name!r} returns probabilities, not logits: each of its {len(scores)} clean "
        "outputs lies in [0, 1] and sums to 1, so a softmax is applied twice where the "
        "platform reads confidences (acac, actc, nte and the other confidence metrics store "
        "softmax of the probabilities) and the attacks' losses see squashed scores; remove "
        "the model's final softmax (return the logits), or return torch.log of the "
        "probabilities (docs/own-model.md)"
    )


def probabilities_message(ctx: EvaluationContext) -> str | None:
    """The warning for ``ctx``'s clean outputs when they are probabilities."""
    return probabilities_warning(ctx.predictor.name, ctx.clean_logits)


def warn_if_probabilities(ctx: EvaluationContext) -> None:
    """Warn when the model's clean outputs are probabilities, not logits."""
    message = probabilities_message(ctx)
    if message:
        warnings.warn(message, ProbabilityOutputWarning, stacklevel=2)
