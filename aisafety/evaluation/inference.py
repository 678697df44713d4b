"""Batched, gradient-free predictions: the one way artifacts run a model over a tensor."""

from __future__ import annotations

import torch

from aisafety.memory_budget import fitting
from aisafety.prediction.base import Predictor
from aisafety.prediction.footprint import image_bytes


def batched_logits(predictor: Predictor, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of ``x`` (any leading size) on the CPU, ``batch_size`` inputs per forward pass.

    Batching bounds memory: fewer inputs per pass where ``batch_size`` would not fit the
    memory budget (``memory_budget.py``); ``inference_mode`` skips autograd bookkeeping.
    """
    parts = []
    batch_size = fitting(
        f"a forward pass of model {predictor.name!r} (one image of shape "
        f"{tuple(predictor.input_shape)})",
        image_bytes(predictor, grad=False),
        batch_size,
        "raise 'limits: {memory_gib: ...}' in the plan if the machine has the memory",
        predictor.device,
    )
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
