"""What a module returned when it is not one (N, num_classes) logits tensor, and the fix.

Training code often returns more than logits: ``(logits, features)`` for an auxiliary loss,
``{"logits": ..., "aux": ...}`` or a Hugging Face output. The platform needs the logits alone,
so the message names what came back and the element to return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

FIX = "a classifier returns one (N, num_classes) logits tensor"


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)}"
    return type(value).__name__


def _logits_like(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] >= 2


def output_problem(model: str, out: object) -> str | None:
    """None when ``out`` (for one image) is logits; else a message naming it and the fix."""
    if _logits_like(out):
        return None
    if isinstance(out, torch.Tensor):
        return f"model {model!r} returns {_describe(out)} for one image; {FIX}"
    if isinstance(out, Mapping):
        parts = {f"{key!r}": value for key, value in out.items()}
    elif isinstance(out, Sequence) and not isinstance(out, str):
        parts = {str(index): value for index, value in enumerate(out)}
    else:
        return f"model {model!r} returns a {type(out).__name__} for one image; {FIX}"
    listed = ", ".join(f"{key}: {_describe(value)}" for key, value in parts.items())
    candidates = [key for key, value in parts.items() if _logits_like(value)]
    hint = (
        f"wrap the module so that its forward returns net(x)[{candidates[0]}]"
        if candidates
        else "wrap the module so that its forward returns the logits alone"
    )
    return (
        f"model {model!r} returns a {type(out).__name__} ({listed}) for one image; {FIX}: "
        f"{hint} (docs/own-model.md)"
    )
