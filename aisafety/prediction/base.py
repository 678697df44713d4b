"""The one interface every model is seen through.

Attacks and metrics never touch a model directly: they ask a ``Predictor`` for logits,
probabilities or activations, and check its declared capabilities first. Inputs are always
float32 NCHW in [0, 1]; any normalisation lives inside the predictor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from aisafety.errors import AISafetyError, CapabilityError, InputError, ModelOutputError
from aisafety.interfaces import Capability
from aisafety.prediction.outputs import cuda_fix, raised_text
from aisafety.prediction.watch import (
    check_forward,
    forward_deadline,
    hang_backstop,
    model_tensors,
    versions,
)


class Predictor(ABC):
    """A classifier behind a uniform, capability-declaring interface."""

    name: str
    capabilities: frozenset[Capability]
    input_shape: tuple[int, int, int]
    num_classes: int
    device: torch.device = torch.device("cpu")
    # seconds one forward pass may take before it is stopped (the runner sets the plan's
    # limits.forward_seconds); None: no watchdog
    forward_timeout: float | None = None
    # Why a capability (or "bounds": a graph a verifier can bound) is missing, naming the
    # model source that would give it; ``require`` says it instead of the generic advice.
    unavailable: dict[str, str] = {}
    # What computes the scores where it is not PyTorch code in this process (ONNX Runtime, a
    # server), in words; None: PyTorch. torch.autocast cannot reach such a model, so an
    # attack's bf16/fp16 search is refused for it (attack/precision.py).
    engine: str | None = None
    # Where the settings that say how the images reach the network are given, in words
    # (a wrong one leaves a model at chance): the plan's fields, unless the model was
    # handed to aisafety.evaluate(), which takes them as arguments (in_memory.py).
    input_settings: str = (
        "model.mean/std (the training normalisation), model.scale (0..1 vs 0..255 pixels), "
        "model.layout (nchw/nhwc), model.input_shape"
    )
    # (the mean/std given for it, the network's own normalisation), in words, where the
    # network normalises its input itself and is fed inputs normalised twice
    # (prediction/own_normalisation.py); warned about and stored with the run
    normalised_twice: tuple[str, str] | None = None

    @abstractmethod
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Model scores for a validated batch; differentiable if GRADIENTS is declared."""

    def watched_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``_logits`` (no checks: an attack's inner loop, on inputs it checked once) under
        the hang backstop of ``forward_timeout`` (prediction/watch.py)."""
        with hang_backstop(self.name, self.forward_timeout):
            return self._logits(x)

    def logits(self, x: torch.Tensor, *, in_range: bool = False) -> torch.Tensor:
        """Scores for ``x``, every check done. ``in_range``: the caller built ``x`` by
        clamping into [0, 1] from checked inputs (a query attack's proposals), so the scan of
        its values (a device synchronisation per call, thousands per attack on a GPU) is
        skipped; its shape and dtype are still checked, and so are the scores."""
        if in_range:
            self.check_input_layout(x)
        else:
            self.check_input(x)
        watched = self._watched_tensors()
        before = versions(x, watched)
        try:
            with forward_deadline(self.name, self.forward_timeout):
                scores = self._logits(x)
        except AISafetyError:
            raise
        except Exception as exc:  # its code, which can raise anything (KeyError, ...)
            raise ModelOutputError(
                f"model {self.name!r} failed on a batch of shape {tuple(x.shape)}: "
                f"{raised_text(exc)} ("
                + (
                    cuda_fix(exc)
                    or "check input_shape, num_classes and that the file is the intended model"
                )
                + ")"
            ) from exc
        check_forward(self.name, x, watched, before)
        self.check_output(scores, len(x))
        return scores

    def _watched_tensors(self) -> dict[str, torch.Tensor]:
        """The weights and buffers a forward pass must leave alone (found once)."""
        if "_watched" not in self.__dict__:
            self.__dict__["_watched"] = model_tensors(self)
        return self.__dict__["_watched"]

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x), dim=1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        # no_grad, not inference_mode: the labels may be fed to a gradient attack as targets.
        with torch.no_grad():
            return self.logits(x).argmax(dim=1)

    def layer_names(self) -> list[str]:
        """Layers whose activations ``features`` can return (empty without ACTIVATIONS)."""
        return []

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        self.require(Capability.ACTIVATIONS, "features()")
        raise CapabilityError(f"{type(self).__name__} declares activations but has no features()")

    def require(self, capability: Capability, user: str) -> None:
        """Fail clearly when ``user`` (an attack or metric) needs what the model lacks."""
        if capability not in self.capabilities:
            offered = ", ".join(sorted(c.value for c in self.capabilities))
            if capability.value in self.unavailable:
                raise CapabilityError(
                    f"{user} needs {capability.value}; model {self.name!r} offers only "
                    f"{offered}: {self.unavailable[capability.value]}"
                )
            raise CapabilityError(
                f"{user} needs {capability.value}; model {self.name!r} offers only {offered}. "
                f"Use an algorithm that needs only those, or load the model so that it "
                f"gives {capability.value} (e.g. as a PyTorch module)."
            )

    def check_output(self, scores: torch.Tensor, n: int) -> None:
        """Scores must be (N, num_classes) and finite: a NaN would become a wrong prediction
        (argmax of NaN is arbitrary) and a stored number, before anything fails."""
        expected = (n, self.num_classes)
        if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != expected:
            got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores)
            raise ModelOutputError(
                f"model {self.name!r} returned scores of shape {got} for {n} input(s); "
                f"expected {expected} (one score per class: check num_classes and the "
                "model's last layer)"
            )
        if not scores.is_floating_point():
            raise ModelOutputError(
                f"model {self.name!r} returned scores of dtype {scores.dtype}; expected "
                "floating-point scores, one per class (logits): a model that returns labels "
                "or rounded scores cannot be attacked or measured"
            )
        finite = torch.isfinite(scores.detach()).all(dim=1)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise ModelOutputError(
                f"model {self.name!r} returned NaN or infinite scores for {bad} of {n} "
                "input(s); nothing was stored. Check the weights (NaN after training?) and "
                "the normalisation (a std of 0 divides by zero)"
            )

    def check_input(self, x: torch.Tensor) -> None:
        """Reject tensors that would give silently wrong numbers."""
        self.check_input_layout(x)
        lo, hi = torch.aminmax(x.detach())
        if not (torch.isfinite(lo) and torch.isfinite(hi)):
            raise InputError(f"input to model {self.name!r} holds NaN or inf values")
        if lo < 0 or hi > 1:
            raise InputError(
                f"input to model {self.name!r} lies in [{lo.item():.3g}, {hi.item():.3g}]; "
                "inputs are in [0, 1] (divide uint8 images by 255; normalisation belongs in "
                "the predictor)"
            )

    def _shape_fix(self, x: torch.Tensor) -> str:
        """How to make ``x`` fit: a channels-last model is named as such, not 'resize'."""
        h, w, c = (tuple(self.input_shape) + (0, 0, 0))[:3]
        if x.dim() == 4 and len(self.input_shape) == 3 and tuple(x.shape[1:]) == (c, h, w):
            return self.channels_last_fix(c, h, w)
        channels = self.input_shape[0] if len(self.input_shape) == 3 else None
        if x.dim() == 4 and channels and tuple(x.shape[2:]) == tuple(self.input_shape[1:]):
            return (
                f"the images have {x.shape[1]} channel(s) and the model takes {channels}: "
                f"evaluate it on images of {channels} channel(s) (a grey model on colour "
                "images, or the reverse, would see inputs it was not trained on), or check "
                "input_shape"
            )
        if x.dim() == 4 and channels and x.shape[1] == channels:
            return self.size_fix(tuple(x.shape[2:]), tuple(self.input_shape[1:]))
        return "add a batch dimension or resize the images"

    def channels_last_fix(self, c: int, h: int, w: int) -> str:
        """The fix for an (H, W, C) input_shape fed (C, H, W) images: a setting of the model."""
        return (
            f"the model's input_shape ({h}, {w}, {c}) is channels-last (H, W, C), the "
            "images are (C, H, W) as the platform feeds them: for a channels-last ONNX "
            f"graph set layout: nhwc; for a module give input_shape [{c}, {h}, {w}] "
            "(docs/prediction.md)"
        )

    def size_fix(self, images: tuple[int, ...], takes: tuple[int, ...]) -> str:
        """The fix for images of another height and width: no dataset resizes on request
        (imagenet-samples is fixed at 224x224), so the model resizes them, or other images."""
        (ih, iw), (th, tw) = images, takes
        c = self.input_shape[0]
        return (
            f"the images are {ih}x{iw} and the model takes {th}x{tw}: resize the images "
            f"inside the model (for a PyTorch network, a factory returning nn.Sequential("
            f"nn.Upsample(size=({th}, {tw}), mode='bilinear'), net) with input_shape "
            f"[{c}, {ih}, {iw}]; attacks then perturb the {ih}x{iw} images), or evaluate it on "
            f"{th}x{tw} images (an imagefolder or npz dataset of {th}x{tw} images, or "
            'aisafety.evaluate(data=...); docs/own-model.md, "Data", crops images to a '
            "size into an npz file)"
        )

    def check_input_layout(self, x: torch.Tensor) -> None:
        """The batch's type, shape and dtype (no look at its values: no synchronisation)."""
        if not isinstance(x, torch.Tensor):
            raise InputError(f"model {self.name!r} takes a torch.Tensor, got {type(x).__name__}")
        shape = ", ".join(map(str, self.input_shape))
        if x.dim() != 4 or tuple(x.shape[1:]) != tuple(self.input_shape):
            raise InputError(
                f"model {self.name!r} takes batches of shape (N, {shape}),"
                f" got {tuple(x.shape)}; {self._shape_fix(x)}"
            )
        if x.dtype != torch.float32:
            raise InputError(
                f"model {self.name!r} takes float32 inputs, got {x.dtype}; use x.float()"
            )
        if x.shape[0] == 0:
            raise InputError(f"model {self.name!r} got an empty batch; pass at least one image")
