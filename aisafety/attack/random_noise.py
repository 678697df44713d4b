"""Random noise at the attack's budget: the baseline every real attack must beat.

Each draw puts every pixel at a random corner of the l-inf ball (+-eps, then clipped to
[0, 1]); a sample counts as broken when any of ``draws`` draws flips it. An attack that
does *worse* than this at the same budget is not following the loss (gradient masking,
Carlini et al. 2019, "On Evaluating Adversarial Robustness", Sec. 5.2): the report's
sanity checks compare the two.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class RandomNoiseConfig(AttackConfig):
    draws: int = Field(default=10, ge=1, description="random sign-noise draws per sample")


class RandomNoise(Attack):
    name = "random-noise"
    family = AttackFamily.DECISION  # needs only labels; never follows the model
    norm = Norm.LINF
    requires = Capability.LABELS
    chunk_independent = True
    description = "Random +-eps sign noise, best of N draws, l-inf (sanity baseline)"
    Config = RandomNoiseConfig

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        best = x.clone()
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        open_ = torch.ones(len(x), dtype=torch.bool, device=x.device)
        for _ in range(self.config.draws):
            rows = open_.nonzero().squeeze(1)  # only samples never flipped draw again
            signs = call.streams[rows].signs((len(rows), *x.shape[1:]), x.dtype)
            candidate = (x[rows] + eps * signs).clamp(0, 1)
            with torch.inference_mode():
                flipped = predictor.predict(candidate) != y[rows]
            best[rows] = candidate  # the last draw stands for a sample never flipped
            steps[rows] += 1
            open_[rows[flipped]] = False
            if not open_.any():
                break
        return best, steps
