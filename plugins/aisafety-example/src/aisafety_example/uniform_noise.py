"""Best-of-k uniform noise in the l-inf ball: the random baseline every evaluation needs.

Draw up to ``samples`` perturbations uniformly from [-eps, eps]^d (clipped to the [0, 1]
box) and keep, per sample, the first draw whose predicted label differs from the true one.
It only reads predicted labels, so it runs against any model. Its use is as a sanity check
(Carlini et al. 2019, "On Evaluating Adversarial Robustness", sec. 5): a gradient attack at
the same budget must do at least as well; if random noise beats it, the gradients the attack
sees are masked or obfuscated and its robust accuracy is not to be trusted.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.plugin import (
    Attack,
    AttackCall,
    AttackConfig,
    AttackFamily,
    Capability,
    Norm,
    Predictor,
)


class UniformNoiseConfig(AttackConfig):
    """``samples`` draws at most per input; ``seed`` (inherited) fixes the draws."""

    samples: int = Field(default=10, ge=1)


class UniformNoiseLinf(Attack):
    name = "uniform-noise-linf"
    family = AttackFamily.DECISION
    norm = Norm.LINF
    requires = Capability.LABELS
    description = (
        "Best of k uniform random draws in the l-inf ball; a baseline that gradient attacks "
        "must beat (if it wins, gradients are masked)"
    )
    Config = UniformNoiseConfig
    # it draws only from ``call.streams`` (one random stream per sample), so a sample's
    # result does not depend on the chunking: its units need no batch size in their key
    chunk_independent = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        best = x.clone()
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        found = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        # Batched over the batch; only the k draws are a loop. Each sample draws from its own
        # stream (seeded from ``seed`` and its index), every draw for the whole batch, so a
        # sample's noise depends neither on its chunk nor on when its neighbours succeed.
        for _ in range(self.config.samples):
            if bool(found.all()):
                break
            unit = call.streams.rand(x.shape, dtype=x.dtype)
            candidate = (x + eps * (2 * unit - 1)).clamp(0.0, 1.0)
            flipped = (predictor.predict(candidate) != y) & ~found
            steps += (~found).long()  # one more draw spent on every sample still searching
            best[flipped] = candidate[flipped]
            found |= flipped
        return best, steps
