"""Load a state dict saved by someone else's training code into the module that rebuilds it.

Training code wraps models: ``nn.DataParallel`` and DistributedDataParallel save keys as
``module.conv1.weight``, a PyTorch Lightning module holding the net as ``self.model`` saves
``model.conv1.weight`` (inside a checkpoint dict under ``state_dict``), ``torch.compile`` adds
``_orig_mod.``; a training script's checkpoint holds the weights beside other things
(``{"net": ..., "acc": ..., "epoch": ...}``). We take the one dict of tensors, strip such a
prefix only where it makes more keys match the module, and then load strictly: a key
missing, left over or of another shape is an error naming each.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping

import torch
from torch import nn

from aisafety.errors import ConfigError

PREFIXES = ("module.", "model.", "_orig_mod.", "net.")
# Keys under which training loops store the weights in a larger checkpoint dict.
NESTED_KEYS = ("state_dict", "model_state_dict")
SHOWN = 8  # missing or left-over keys listed; the rest are counted
SHOWN_SHAPES = 3  # differing shapes listed (after the likely cause); the rest are counted


def read_state_dict(data: bytes, model: str, path: object) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, read with ``weights_only=True`` (no code runs)."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        pickled = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if pickled:
            raise ConfigError(
                f"model {model!r}: {path} holds pickled Python objects ({pickled[1]}: a whole "
                "module saved by torch.save(model), or classes of your own), not loaded here: "
                "unpickling runs code. Where you trust the file, save its weights once: "
                "torch.save(torch.load(path, weights_only=False).state_dict(), 'weights.pt'), "
                "and give that file (docs/own-model.md)"
            ) from None
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"model {model!r}: {path} is not a loadable PyTorch checkpoint "
            f"({first_line}); save one with torch.save(model.state_dict(), path)"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(
            f"model {model!r}: {path} holds a {type(state).__name__}, not a state "
            "dict; save one with torch.save(model.state_dict(), path)"
        )
    return _nested_tensors(state, model, path)


def _nested_tensors(state: dict, model: str, path: object) -> dict:
    """The one dict of tensors inside a checkpoint of other things (``{'net': ..., 'acc': ...}``).

    Training scripts save ``{"net": net.state_dict(), "acc": acc, "epoch": epoch}`` or
    ``{"model": ..., "optimizer": ...}``; the optimizer's state is no dict of tensors, so the
    weights are the only candidate. Two candidates (a model and its EMA copy) are not guessed,
    also where one is under a training loop's usual key (timm saves ``state_dict`` and
    ``state_dict_ema``): that key took precedence, and the EMA copy went unmentioned.
    """
    if all(isinstance(value, torch.Tensor) for value in state.values()):
        return state
    candidates = [
        key
        for key, value in state.items()
        if isinstance(value, Mapping)
        and value
        and (key in NESTED_KEYS or all(isinstance(t, torch.Tensor) for t in value.values()))
    ]
    if len(candidates) == 1:
        return dict(state[candidates[0]])
    if len(candidates) > 1:
        names = ", ".join(repr(key) for key in candidates)
        raise ConfigError(
            f"model {model!r}: {path} holds several state dicts ({names}); save the one to "
            f"evaluate on its own, e.g. torch.save(torch.load(path)[{candidates[0]!r}], "
            "'weights.pt'), and give that file"
        )
    return state


def strip_prefixes(state: Mapping[str, torch.Tensor], expected: set[str]) -> dict[str, object]:
    """``state`` with wrapper prefixes removed while that makes more keys match ``expected``."""
    current = dict(state)
    while True:
        matched = len(expected & current.keys())
        best, best_matched = None, matched
        for prefix in PREFIXES:
            renamed = {_strip(k, prefix): v for k, v in current.items()}
            if len(renamed) == len(current) and len(expected & renamed.keys()) > best_matched:
                best, best_matched = renamed, len(expected & renamed.keys())
        if best is None:
            return current
        current = best


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix) :] if key.startswith(prefix) else key


def shape_mismatch(shapes: list[tuple[str, tuple, tuple]], own_keys: list[str]) -> str:
    """The first few differing shapes, a count of the rest and the likely cause: a narrower
    ResNet-18 listed all of its 100 layers in one 7 KB line, which hid the one fact that
    matters (the width, or the number of classes, differs)."""
    listed = [f"{key}: file {file}, model {model}" for key, file, model in shapes[:SHOWN_SHAPES]]
    more = len(shapes) - SHOWN_SHAPES
    rest = f" (and {more} more)" if more > 0 else ""
    return f"{likely_cause(shapes, own_keys)}; shape mismatch: {'; '.join(listed)}{rest}"


def likely_cause(shapes: list[tuple[str, tuple, tuple]], own_keys: list[str]) -> str:
    """What the first differing tensor says: its output size (the width, or the classes
    where it is the model's last layer) or its input size."""
    key, file, model = shapes[0]
    if len(file) != len(model):
        return f"layer types differ: the file's {key} has shape {file}, the model's {model}"
    dim = next(i for i, (a, b) in enumerate(zip(file, model, strict=True)) if a != b)
    layer = key.rsplit(".", 1)[0]
    if dim == 0 and layer == own_keys[-1].rsplit(".", 1)[0]:
        return (
            f"classes differ: the file's {key} has {file[0]} outputs, the model's "
            f"{model[0]} (num_classes)"
        )
    if dim == 0:
        return f"width differs: the file's {key} has {file[0]} channels, the model's {model[0]}"
    if dim == 1:
        return f"input size differs: the file's {key} takes {file[1]}, the model's {model[1]}"
    return f"kernel size differs: the file's {key} has shape {file}, the model's {model}"


def load_into(module: nn.Module, state: Mapping[str, object], model: str, path: object) -> None:
    """Load ``state`` strictly into ``module``; every mismatch is named in one error."""
    own = module.state_dict()
    state = strip_prefixes(state, set(own))
    problems = []
    shapes = [
        (key, tuple(value.shape), tuple(own[key].shape))
        for key, value in state.items()
        if key in own and isinstance(value, torch.Tensor) and value.shape != own[key].shape
    ]
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    if shapes:
        problems.append(shape_mismatch(shapes, list(own)))
    for label, items in (
        ("missing from the file", missing),
        ("in the file but not in the model", unexpected),
    ):
        if items:
            more = f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else ""
            problems.append(f"{label}: {'; '.join(items[:SHOWN])}{more}")
    if problems:
        raise ConfigError(
            f"model {model!r}: the state dict {path} does not fit the module "
            f"({type(module).__name__}): " + " | ".join(problems) + ". Build the module with "
            "the settings it was trained with (kwargs), or save its state_dict() again"
        )
    try:
        module.load_state_dict(state)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"model {model!r}: {path} cannot be loaded: {exc}") from None
