"""Per-sample attack losses on logits: larger means closer to (or further into) misclassification.

Every function maps ``(logits (n, C), y (n,))`` to a loss of shape ``(n,)`` that an untargeted
attack *maximises*; given ``target`` (n,) as well, to the loss a targeted attack maximises
(rising as the target class gains on the others):

- ``cross_entropy``: the usual softmax cross-entropy of the true class;
- ``dlr``: the Difference of Logits Ratio of Croce & Hein (ICML 2020, eq. 5),
  ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3)``, with ``z_pi`` the logits sorted in
  decreasing order; invariant to shifting and rescaling the logits;
- ``margin``: ``max_{i != y} z_i - z_y`` (the Carlini & Wagner 2017 f_6 loss without the
  clamp); positive exactly when the sample is misclassified.

Targeted: ``-CE(logits, t)``; the targeted DLR of Croce & Hein (eq. 6),
``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``; the margin ``z_t - max_{i != t} z_i``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[..., torch.Tensor]  # (logits, y) or (logits, y, target) -> (n,)


def true_and_best_other(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The true-class logit and the largest logit of any other class, each of shape (n,)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), float("-inf"))
    return true, others.amax(1)


def cross_entropy(
    logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None
) -> torch.Tensor:
    if target is not None:
        return -F.cross_entropy(logits, target, reduction="none")
    return F.cross_entropy(logits, y, reduction="none")


def dlr(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """Difference of Logits Ratio (Croce & Hein 2020); needs at least 3 classes to be ratio-like
    (4 for the targeted one, whose denominator averages the third and fourth logits).

    With fewer classes the denominator falls back to the lowest logits there are. The
    ``1e-12`` keeps the ratio finite when the top logits tie.
    """
    ordered = logits.sort(dim=1, descending=True).values
    if target is not None:
        true, aim = logits.gather(1, y[:, None]), logits.gather(1, target[:, None])
        last = logits.shape[1] - 1
        lower = (ordered[:, min(2, last)] + ordered[:, min(3, last)]) / 2
        return -(true - aim).squeeze(1) / (ordered[:, 0] - lower + 1e-12)
    true, other = true_and_best_other(logits, y)
    third = ordered[:, min(2, logits.shape[1] - 1)]
    return -(true - other) / (ordered[:, 0] - third + 1e-12)


def margin(
    logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None
) -> torch.Tensor:
    if target is not None:
        aim, best_other = true_and_best_other(logits, target)
        return aim - best_other
    true, other = true_and_best_other(logits, y)
    return other - true


LOSSES: dict[str, LossFn] = {"ce": cross_entropy, "dlr": dlr, "margin": margin}
