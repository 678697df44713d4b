"""Does a network normalise its own input? Then a ``mean``/``std`` given for it normalises twice.

The predictor puts ``(x - mean) / std`` in front of the network; a network that already
does so itself is then fed its inputs normalised twice, and every number of the run is
silently of inputs it was never trained on (the ERAN sigmoid net: certified accuracy 0.8 ->
0.5; a CIFAR net: clean accuracy 0.77 -> 0.46, above chance, so no other check fires).

What is recognised, on the module or down its first submodules (what a ``Sequential`` runs
first, and the first attribute of most hand-written nets):

- a submodule of a normalising class: the platform's own ``Normalize`` (a predictor's
  ``network``), torchvision's ``transforms.Normalize``, RobustBench's ``ImageNormalizer``;
- tensors ``mu`` and ``sigma`` on the module (RobustBench's CIFAR nets,
  ``(x - self.mu) / self.sigma`` first in ``forward``), or ``mean`` and ``std`` (its
  DeepMind nets);

in a ``torch.nn`` module or a TorchScript one (its submodules keep their class name as
``original_name``). A normalisation counts only with a nonzero mean: ``mean 0`` with a
``std`` is a change of units (``scale: 255``), and an identity normaliser says nothing.

Structure never proves the mistake (a net trained on inputs normalised twice is right with
both), so the finding is a warning, stored with the run, never a refusal
(docs/own-model.md, "A network that normalises itself").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

NORMALISERS = frozenset({"Normalize", "ImageNormalizer"})
PAIRS = (("mu", "sigma"), ("mean", "std"))
DEPTH = 4  # first submodules looked down: Sequential(Sequential(Normalize, ...), ...)


def normalised_twice(
    module: nn.Module, mean: Sequence[float] | None, std: Sequence[float] | None
) -> tuple[str, str] | None:
    """(the ``mean``/``std`` given, the module's own normalisation) in words where both
    normalise; None otherwise (the predictor's ``normalised_twice``)."""
    given = given_normalisation(mean, std)
    if given is None:
        return None
    try:
        own = own_normalisation(module)
    except Exception:  # noqa: BLE001 - a user's attribute may raise anything: a hint, no more
        return None
    return None if own is None else (given, own)


def own_normalisation(module: nn.Module) -> str | None:
    """The network's own normalisation in words (``ImageNormalizer mean (0.485, ...) std
    (...)``), or None where none is recognised."""
    for _ in range(DEPTH):
        found = _normaliser(module)
        if found is not None:
            return found
        first = next(module.children(), None)
        if first is None:
            return None
        module = first
    return None


def _normaliser(module: nn.Module) -> str | None:
    """``module`` itself as a normaliser class, or its ``mu``/``sigma`` (``mean``/``std``)."""
    kind = getattr(module, "original_name", None) or type(module).__name__
    pairs = (("mean", "std"),) if kind in NORMALISERS else PAIRS
    for mean_name, std_name in pairs:
        mean, std = _values(module, mean_name), _values(module, std_name)
        if mean is not None and std is not None and any(m != 0 for m in mean):
            where = kind if kind in NORMALISERS else f"{kind}.{mean_name}/{std_name}"
            return f"{where} mean {_short(mean)} std {_short(std)}"
    return None


def _values(module: nn.Module, attribute: str) -> tuple[float, ...] | None:
    """A float tensor or a sequence of numbers named ``attribute``, flat; None otherwise."""
    value = getattr(module, attribute, None)
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() == 0 or value.numel() > 4:
            return None  # per channel: 1, 3 or 4 values; a weight tensor is something else
        return tuple(float(v) for v in value.detach().flatten().cpu())
    numbers = isinstance(value, Sequence) and 0 < len(value) <= 4
    if numbers and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    return None


def _short(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def given_normalisation(mean: Sequence[float] | None, std: Sequence[float] | None) -> str | None:
    """The ``mean``/``std`` given for a model in words, or None when they do not normalise
    (not given, or a mean of 0: a change of units such as ``scale: 255``)."""
    if mean is None or not any(m != 0 for m in mean):
        return None
    return f"mean {_short(mean)} std {_short(std or (1.0,))}"


def twice_message(model: str, normalisations: tuple[str, str]) -> str:
    """The warning for a network fed the ``given`` normalisation in front of its ``own``."""
    given, own = normalisations
    return (
        f"model {model!r} normalises its input itself ({own}), and the {given} given for it "
        "put a second normalisation in front of that, so the network is fed inputs "
        "normalised twice and every number of this run is of inputs it was not trained on "
        "(accuracy well below the model's, yet possibly above chance). Drop mean and std "
        "for this model (the plan's model.mean/model.std, aisafety.evaluate's mean=/std=), "
        "so that it is fed the pixels its own normalisation expects ([0, 1]; a plan adds "
        "scale: 255 for 0..255); keep them only if it was trained on inputs normalised "
        "twice (docs/own-model.md)"
    )
