"""Which adversarial examples the per-example metrics average over."""

from __future__ import annotations

import torch

from aisafety.attack.result import AttackResult


def successful_mask(result: AttackResult) -> torch.Tensor:
    """Samples the model got right and the attack turned wrong (DEEPSEC's convention).

    Samples already misclassified when clean are left out: their "adversarial example" may be
    the unperturbed input, which would bias distortion and confidence averages.
    """
    return (result.clean_pred == result.y) & (result.adv_pred != result.y)
