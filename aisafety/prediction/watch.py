"""Which tensors a model holds, and whether one forward pass changed them or its input.

A model that writes into its input (``x.zero_()``) or into its own weights or buffers
(a BatchNorm left in training mode, a hand-written in-place update) gives numbers that
depend on what ran before: every later attack and metric would read the changed state.
PyTorch counts in-place writes per tensor (``_version``), so comparing the counters around
a forward pass costs a few microseconds and names the model at once; writes that bypass
the counters (``.data``) are caught by the run's content fingerprints
(``evaluation/integrity.py``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from aisafety.errors import ModelOutputError, TamperingError

_MAX_DEPTH = 4  # predictors wrap predictors (defenses); deeper nesting is not searched


def model_tensors(predictor: object) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the modules ``predictor`` holds, also through the
    predictors it wraps (``inner`` of a defense), keyed by a readable name."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, module in _modules(predictor, "", 0, set()):
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                found[f"{prefix}{name}"] = tensor
    return found


def _modules(
    obj: object, prefix: str, depth: int, seen: set[int]
) -> Iterator[tuple[str, nn.Module]]:
    if depth > _MAX_DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    for attribute, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if isinstance(value, nn.Module):
            if id(value) not in seen:
                seen.add(id(value))
                yield f"{prefix}{attribute}.", value
        elif hasattr(value, "_logits") and hasattr(value, "num_classes"):  # a wrapped predictor
            yield from _modules(value, f"{prefix}{attribute}.", depth + 1, seen)


def _version(tensor: torch.Tensor) -> int | None:
    return None if tensor.is_inference() else tensor._version


def versions(x: torch.Tensor, tensors: dict[str, torch.Tensor]) -> tuple:
    """The write counters of ``x`` and of the model's tensors, before a forward pass."""
    return _version(x), [_version(t) for t in tensors.values()]


def check_forward(
    name: str, x: torch.Tensor, tensors: dict[str, torch.Tensor], before: tuple
) -> None:
    """Raise ``TamperingError`` naming model ``name`` if its forward pass wrote into its
    input or into one of its weights or buffers."""
    input_before, state_before = before
    if input_before is not None and _version(x) != input_before:
        raise TamperingError(
            f"model {name!r} wrote into its input during a forward pass (an in-place operation "
            "on x); every later number would read the changed images, so nothing of this unit "
            "is stored. Fix the model: work on a copy (x = x.clone()) or use out-of-place ops"
        )
    changed = [
        n for (n, t), v in zip(tensors.items(), state_before, strict=True) if _version(t) != v
    ]
    if changed:
        raise TamperingError(
            f"model {name!r} changed its own weights or buffers during a forward pass "
            f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}); its outputs would "
            "depend on what ran before, so nothing of this unit is stored. Put the model in "
            "eval() mode (BatchNorm in training mode updates its running statistics) and "
            "remove in-place updates of its state"
        )


@contextmanager
def forward_deadline(name: str, seconds: float | None) -> Iterator[None]:
    """A watchdog on one forward pass of model ``name``: after ``seconds`` a SIGALRM raises
    ``ModelOutputError`` in the forward's Python code (a ``while True`` or a ``sleep`` in the
    model), so the run ends naming the model instead of running forever. Only in the main
    thread, where signals are delivered, and never nested; a single C call that never
    returns cannot be interrupted from Python."""
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )
    if not usable:
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise ModelOutputError(
            f"model {name!r} did not return from a forward pass within {seconds:g} s "
            f"(limits.forward_seconds); check the model's code for a loop that never ends, "
            f"or raise 'limits: {{forward_seconds: ...}}' if one batch really takes that long"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
