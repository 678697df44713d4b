"""A run's shared state fingerprinted around every plugin call, so that no plugin changes
the numbers of the others.

Every attack, defense and metric of a run reads one model and one ``EvaluationContext``:
an attack that scales the weights, or a metric that writes into ``ctx.x``, would change
every later unit's numbers while the run still ends ``finished``. ``RunIntegrity`` keeps a
content fingerprint (BLAKE2b of the bytes) of the weights and buffers of the evaluated and
reference models, the images, the labels and the clean outputs, plus a pristine copy of
each; ``check(who)`` after each plugin call raises ``TamperingError`` naming the plugin and
what changed, and ``restore()`` puts the pristine copies back and drops every cached
artifact, so the next unit computes on exactly what a run without that plugin would.
Content, not identity or write counters: ``.data`` writes and replaced tensors are caught
too. Cost: hashing the model and the evaluated data once per plugin call (about 1 GB/s).

The pristine copies are kept on the host (``host_copy``), whatever the model's device: on a
GPU a copy there would be a second model in the card's memory for the whole run: a plan's
``limits.memory_gib`` does not count it, and it shrinks the default budget (half of the
card's free memory) by half its size. A restore is rare (a plugin that tampered) and a
digest copies every tensor to the host anyway; on the CPU the copies weigh what they did
(docs/memory.md, "What a run holds besides its work").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

import torch

from aisafety.errors import TamperingError
from aisafety.evaluation.context import EvaluationContext
from aisafety.prediction.watch import model_tensors

T = TypeVar("T")
CLEAN_OUTPUTS = ("clean_logits", "clean_probs", "clean_correct")


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``tensor`` in host memory, sharing nothing with it."""
    return tensor.detach().to("cpu", copy=True)


def digest(tensor: torch.Tensor) -> str:
    """Fingerprint of a tensor's dtype, shape and bytes."""
    data = tensor.detach().cpu().contiguous()
    hasher = hashlib.blake2b(f"{data.dtype}{tuple(data.shape)}".encode(), digest_size=16)
    if data.numel():
        hasher.update(data.reshape(-1).view(torch.uint8).numpy().data)
    return hasher.hexdigest()


class RunIntegrity:
    """Fingerprints and pristine copies of what every unit of one context shares."""

    def __init__(self, ctx: EvaluationContext) -> None:
        self.ctx = ctx
        self._predictors = (ctx.predictor, ctx.reference_predictor)
        shared = self._shared()
        self._pristine = {name: host_copy(t) for name, t in shared.items()}
        self._home = {name: t.device for name, t in shared.items()}  # where each belongs
        self._digests = {name: digest(t) for name, t in self._pristine.items()}
        self._unit: tuple[str, object, dict[str, str]] | None = None  # the unit's attack result
        self.calling = ""  # the plugin call under way (or last made)

    def _shared(self) -> dict[str, torch.Tensor]:
        """The shared tensors by a name a user understands."""
        tensors: dict[str, torch.Tensor] = {}
        for role, predictor in zip(("model", "reference model"), self._predictors, strict=True):
            if predictor is not None:
                for name, tensor in model_tensors(predictor).items():
                    tensors[f"{role} {predictor.name!r} {name}"] = tensor
        tensors["the images (ctx.x)"] = self.ctx.data.x
        tensors["the labels (ctx.y)"] = self.ctx.data.y
        for name in CLEAN_OUTPUTS:
            if name in self.ctx.__dict__:
                tensors[f"ctx.{name}"] = self.ctx.__dict__[name]
        return tensors

    def watch_result(self, label: str, result: object) -> None:
        """Also check the tensors of this unit's attack result (``label``) until ``end_unit``."""
        self._unit = (label, result, self._result_digests(result))

    def end_unit(self) -> None:
        self._unit = None

    @staticmethod
    def _result_digests(result: object) -> dict[str, str]:
        return {k: digest(v) for k, v in vars(result).items() if isinstance(v, torch.Tensor)}

    def check(self, who: str) -> None:
        """Raise ``TamperingError`` naming ``who`` if it changed any shared tensor."""
        changed = [name for name, tensor in self._shared().items() if self._changed(name, tensor)]
        if self.ctx.predictor is not self._predictors[0]:
            changed.append("the model (ctx.predictor was replaced)")
        if self._unit is not None:
            label, result, before = self._unit
            now = self._result_digests(result)
            changed += [f"{label}'s result ({k})" for k, v in before.items() if now.get(k) != v]
        if changed:
            shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" * (len(changed) > 4))
            raise TamperingError(
                f"{who} changed {shown}, which every unit of the run shares; nothing of this "
                "unit is stored, and the next units compute on the original state. A plugin "
                "must not write into the model or the context's tensors: work on a copy "
                "(x.clone()) and leave the model's weights alone"
            )

    def checked(self, who: str, call: Callable[[], T]) -> T:
        """``call()`` followed by ``check(who)``; when it raises, a change it made first is
        reported instead (zeroed weights end in NaN scores: the cause is the plugin)."""
        self.calling = who  # named if the call crashes (runner.py)
        try:
            result = call()
        except TamperingError:
            raise
        except Exception:
            self.check(who)
            raise
        self.check(who)
        return result

    def _changed(self, name: str, tensor: torch.Tensor) -> bool:
        if name not in self._digests:  # computed since (the clean outputs): taken as they are
            self._pristine[name] = host_copy(tensor)
            self._home[name] = tensor.device
            self._digests[name] = digest(tensor)
            return False
        return digest(tensor) != self._digests[name]

    @torch.no_grad()
    def restore(self) -> None:
        """Put the pristine weights, images and labels back; forget every cached artifact."""
        self.ctx.predictor = self._predictors[0]
        for name, tensor in self._shared().items():
            pristine = self._pristine.get(name)
            if pristine is not None and tensor.shape == pristine.shape:
                tensor.copy_(pristine)  # from the host, no second copy on the device
        self.ctx.forget_cached()
        for name in CLEAN_OUTPUTS:  # the clean outputs as first computed, where they were
            if (key := f"ctx.{name}") in self._pristine:
                self.ctx.__dict__[name] = self._pristine[key].to(self._home[key], copy=True)
        self.end_unit()

    def pristine_bytes(self) -> dict[str, int]:
        """Bytes of the pristine copies held, per device type (all ``cpu``: ``host_copy``)."""
        held: dict[str, int] = {}
        for tensor in self._pristine.values():
            kind = tensor.device.type
            held[kind] = held.get(kind, 0) + tensor.numel() * tensor.element_size()
        return held
