"""What a module returned when it is not one (N, num_classes) logits tensor, and the fix.

Training code often returns more than logits: ``(logits, features)`` for an auxiliary loss,
``{"logits": ..., "aux": ...}`` or a Hugging Face output. The platform needs the logits alone,
so the message names what came back and the element to return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from aisafety.errors import ConfigError

TORCHSCRIPT_HEAD = "The following operation failed in the TorchScript interpreter"
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


def classes_of(model: str, out: object) -> int:
    """The number of classes a probe's outputs ``out`` show (its first image is checked, so
    a probe fed a fixed batch of several images reads the same as one fed one image)."""
    first = out[:1] if isinstance(out, torch.Tensor) and out.dim() else out
    problem = output_problem(model, first)
    if problem:
        raise ConfigError(problem)
    return int(out.shape[1])  # type: ignore[union-attr]  # logits: output_problem checked


def raised_text(exc: Exception) -> str:
    """``exc``'s type and first line; for TorchScript, its cause (the last line, typed)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [""]
    if lines[0].startswith(TORCHSCRIPT_HEAD):  # a TorchScript traceback follows, cause last
        return lines[-1][:300]  # "RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    first = lines[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def model_raised(name: str, exc: Exception, where: str, fix: str) -> ConfigError:
    """The error for a user's forward that raised: the model, the exception's type and
    first line, and ``fix``, instead of a traceback through the user's code."""
    fix = cuda_fix(exc) or fix
    return ConfigError(f"model {name!r} does not run {where} ({raised_text(exc)}); {fix}")


def cuda_fix(exc: Exception) -> str | None:
    """The fix for a forward that asks for CUDA on a machine without it (``x.cuda()``,
    ``device='cuda'`` in the model's code), which the shape advice would mislead about."""
    if torch.cuda.is_available() or "CUDA" not in str(exc):
        return None
    return (
        "the model's code moves tensors to CUDA and no CUDA GPU is visible here: use the "
        "input's device (x.device) instead of .cuda() or 'cuda' in its forward"
    )
