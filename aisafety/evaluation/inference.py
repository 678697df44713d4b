"""Batched, gradient-free predictions: the one way artifacts run a model over a tensor."""

from __future__ import annotations

import torch

from aisafety.prediction.base import Predictor


def batched_logits(predictor: Predictor, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of ``x`` (any leading size) on the CPU, ``batch_size`` inputs per forward pass.

    Batching bounds memory; ``inference_mode`` skips autograd bookkeeping.
    """
    parts = []
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            chunk = x[start : start + batch_size].to(predictor.device)
            parts.append(predictor.logits(chunk).cpu())
    if not parts:
        return torch.empty(0, predictor.num_classes)
    return torch.cat(parts)


def batched_predictions(predictor: Predictor, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Predicted labels of ``x``, see ``batched_logits``."""
    return batched_logits(predictor, x, batch_size).argmax(1)
