"""What varies from one attack call to the next, handed to ``Attack.perturb`` in one object.

An attack instance holds only its configuration; everything a call brings (its random
stream, the model's clean logits, the target classes) travels in an ``AttackCall``, so one
instance can serve several calls, or another attack (``transfer``), without shared state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from aisafety.attack.streams import SampleStreams


@dataclass(frozen=True)
class AttackCall:
    """One call's inputs beyond ``(predictor, x, y, eps)``; every tensor has the batch first.

    ``streams``: one random stream per sample (``aisafety.attack.streams``), seeded from the
    attack's ``seed`` and the sample's index in the caller's batch: what an attack draws
    from them does not depend on the chunking. Built-in attacks draw only from these;
    ``generator``: one stream shared by the whole call (for plugins written before the
    streams: their results depend on the chunking, and the runner keys their units by it);
    ``samples``: which samples of the caller's batch these are, the ones still to do (the
    base class hands ``perturb`` only those: see ``Attack.__call__``'s ``todo``);
    ``clean_logits``: the model's logits on the clean batch (n, C), computed once per call;
    ``target``: a class per sample the attack moves towards (``None``: untargeted). A target
    guides the search; success is still misclassification (``adv_pred != y``), as in
    AutoAttack's targeted attacks. ``AttackResult.hit_target`` tells where the target was
    reached.
    """

    generator: torch.Generator
    samples: torch.Tensor
    clean_logits: torch.Tensor
    target: torch.Tensor | None = None
    streams: SampleStreams | None = None

    def __post_init__(self) -> None:
        if self.streams is None:  # built by hand (tests): streams of these sample indices
            device = self.clean_logits.device
            object.__setattr__(self, "streams", SampleStreams(0, self.samples, device))

    @property
    def targeted(self) -> bool:
        return self.target is not None

    def select(self, rows: torch.Tensor) -> AttackCall:
        """The same call restricted to the samples ``rows`` (their streams go with them;
        the shared generator is shared)."""
        target = None if self.target is None else self.target[rows]
        return replace(
            self,
            samples=self.samples[rows],
            clean_logits=self.clean_logits[rows],
            target=target,
            streams=self.streams[rows],
        )

    def with_logits(self, clean_logits: torch.Tensor) -> AttackCall:
        """The same call on another model (``transfer`` runs its inner attack on a surrogate)."""
        return replace(self, clean_logits=clean_logits)
