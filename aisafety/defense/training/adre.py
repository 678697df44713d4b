"""ADRE (Feng et al. 2020): Gaussian augmentation plus an adaptive radius-enhancing term.

Per batch, ``noise_samples`` (k) Gaussian copies of each image give the base classifier's
cross-entropy (averaged over copies, as Gaussian augmentation) and the soft smoothed
classifier G(x) = mean_i softmax(f(x + delta_i)). The regulariser adds ``lbd`` times
max_{c != y} log G_c(x): the log-probability of the strongest wrong class. Lowering it raises
the margin between the label and its runner-up, and with it the certified radius
sigma/2 (Phi^-1(p_A) - Phi^-1(p_B)) the paper's analysis bounds; where the label is not on
top it pushes down the wrong winner itself (the "adaptive" part).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.defense.training.base import TrainingDefense, TrainingStep

# Added inside the log, as in the peer implementations: log 0 would give -inf and NaN grads.
_FLOOR = 1e-10


class AdreConfig(PluginConfig):
    sigma: float = Field(default=0.25, gt=0, description="Gaussian noise std, [0, 1] pixel units")
    noise_samples: int = Field(default=4, ge=1, description="noisy copies per image (k)")
    lbd: float = Field(default=1.0, ge=0, description="weight of the ADRE term (lambda)")


def adre_loss(logits: torch.Tensor, y: torch.Tensor, lbd: float) -> torch.Tensor:
    """Mean over images of mean_i CE(logits_i, y) + lbd max_{c != y} log G_c, ``logits``
    (copies, batch, classes)."""
    k, batch, classes = logits.shape
    classification = F.cross_entropy(logits.flatten(0, 1), y.repeat(k), reduction="none")
    g = torch.softmax(logits, dim=2).mean(0)
    wrong = g.masked_fill(F.one_hot(y, classes).bool(), float("-inf"))
    regulariser = torch.log(wrong.max(dim=1).values + _FLOOR)
    return classification.view(k, batch).mean(0).mean() + lbd * regulariser.mean()


class Adre(TrainingDefense):
    name = "adre"
    description = "ADRE (Feng et al. 2020): Gaussian augmentation + the wrong class's log G_c"
    Config = AdreConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        shape = torch.Size([c.noise_samples, *x.shape])
        noise = sample_noise(Noise.GAUSSIAN, c.sigma, shape, step.generator, x.device)
        logits = network((x.unsqueeze(0) + noise).flatten(0, 1)).view(c.noise_samples, len(x), -1)
        return adre_loss(logits, y, c.lbd)
