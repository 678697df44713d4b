"""Loss gradients with respect to the input, shared by every white-box attack."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aisafety.prediction.base import Predictor


def cross_entropy_gradient(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """d(sum of CE losses)/dx and the logits, in one forward and one backward pass.

    Summing (not averaging) keeps each sample's gradient independent of the batch size.
    ``_logits`` skips the input check: the attack checked the clean batch once already.
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = predictor._logits(x)
        loss = F.cross_entropy(logits, y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
    return grad, logits.detach()
