"""Standard adversarial training, SAT (Goodfellow, Shlens & Szegedy, ICLR 2015, Sec. 5).

The paper's objective, eq. (4):
J~(theta, x, y) = alpha J(theta, x, y) + (1 - alpha) J(theta, x + eps sign(grad_x J), y)
with alpha = 0.5: a clean and an FGSM cross-entropy mixed, the FGSM example made from the clean
point (no random start) with the model being trained. Not Wong et al.'s ``fgsm-at`` (a random
start, step 1.25 eps, adversarial loss only). Single-step training like this is known to mask
gradients (Tramer et al. 2018): its adaptive evaluation adds a transfer attack from the
undefended model to white-box PGD.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.threat import LinfThreat
from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.prediction.base import Predictor


class SATConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0, description="FGSM budget (the paper: 0.25 on MNIST)")
    alpha: float = Field(default=0.5, ge=0, le=1, description="weight of the clean loss")
    surrogate: str = Field(
        default="mnist-cnn", description="zoo model the adaptive evaluation transfers PGD from"
    )


def fgsm_examples(network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """x + eps sign(grad_x CE), clipped to [0, 1]; gradients reach the input only."""
    was_training = network.training
    network.eval()
    x_in = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(network(x_in), y), x_in)
    network.train(was_training)
    return torch.clamp(x + eps * LinfThreat().ascent(grad), 0, 1).detach()


class StandardAdversarialTraining(TrainingDefense):
    name = "sat"
    description = "standard adversarial training (Goodfellow et al. 2015): clean + FGSM, alpha 0.5"
    Config = SATConfig
    adaptive_attack = "worst case of white-box PGD-40 and PGD-40 transferred from the surrogate"

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        x_adv = fgsm_examples(network, x, y, c.eps)
        clean = F.cross_entropy(network(x), y)
        return c.alpha * clean + (1 - c.alpha) * F.cross_entropy(network(x_adv), y)

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """Tramer et al. 2018 (Sec. 4.1): examples transferred from an undefended model beat
        white-box ones on single-step adversarially trained models (gradient masking)."""
        return transfer_correct(predictor, x, y, eps, self.config.surrogate)


def transfer_correct(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, surrogate: str
) -> torch.Tensor:
    """Per sample: still classified right after PGD-40 made on zoo model ``surrogate`` (the
    platform's ``transfer`` attack, without the registry this layer may not import)."""
    from aisafety.attack.pgd import PGDLinf
    from aisafety.database.zoo import load_zoo_model

    source = load_zoo_model(surrogate, device=predictor.device)
    x_adv = PGDLinf({"steps": 40})(source, x, y, eps).x_adv
    with torch.no_grad():
        return predictor.predict(x_adv) == y
