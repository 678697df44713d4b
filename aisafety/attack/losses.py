"""Per-sample attack losses on logits: larger means closer to (or further into) misclassification.

Every function maps ``(logits (n, C), y (n,))`` to a loss of shape ``(n,)`` that an untargeted
attack *maximises*:

- ``cross_entropy``: the usual softmax cross-entropy of the true class;
- ``dlr``: the Difference of Logits Ratio of Croce & Hein (ICML 2020, eq. 5),
  ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3)``, with ``z_pi`` the logits sorted in
  decreasing order; invariant to shifting and rescaling the logits;
- ``margin``: ``max_{i != y} z_i - z_y`` (the Carlini & Wagner 2017 f_6 loss without the
  clamp); positive exactly when the sample is misclassified.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def true_and_best_other(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The true-class logit and the largest logit of any other class, each of shape (n,)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), float("-inf"))
    return true, others.amax(1)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def dlr(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Difference of Logits Ratio (Croce & Hein 2020); needs at least 3 classes to be ratio-like.

    With 2 classes the denominator falls back to ``z_pi1 - z_pi2``. The ``1e-12`` keeps the
    ratio finite when the top logits tie.
    """
    true, other = true_and_best_other(logits, y)
    ordered = logits.sort(dim=1, descending=True).values
    third = ordered[:, min(2, logits.shape[1] - 1)]
    return -(true - other) / (ordered[:, 0] - third + 1e-12)


def margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    true, other = true_and_best_other(logits, y)
    return other - true


LOSSES: dict[str, LossFn] = {"ce": cross_entropy, "dlr": dlr, "margin": margin}
