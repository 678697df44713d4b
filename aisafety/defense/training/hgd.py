"""HGD, the high-level representation guided denoiser (Liao et al., CVPR 2018), LGD variant.

A denoiser in front of a fixed target classifier f (architecture ``hgd-mnist-cnn``: a small
U-Net before ``mnist-cnn``) is trained so that the denoised adversarial image gives the same
high-level representation as the clean one: loss ||f_l(D(x')) - f_l(x)||_1 (Liao et al.'s
eq. 2). LGD, the variant used here, takes l = the logits, the layer before the softmax (FGD
would take the last feature map). Only the denoiser learns; the target's weights are the
shipped zoo entry's, pinned by sha256.

Training examples x' are made on the target itself, per batch: l-inf PGD (``steps`` steps
of 2.5 eps_i / steps, random start) with a budget eps_i drawn per sample uniformly in
[0, eps]. Liao et al. made theirs offline with FGSM and I-FGSM on several ImageNet models at
eps in [1, 16] / 255; the per-sample budget keeps near-clean inputs in the training set, as
their smallest budgets did. Their threat model is the oblivious attacker (examples crafted
on the undefended target); the denoiser is differentiable, so white-box PGD through it is
the adaptive attack that broke it (Athalye & Carlini 2018).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.database.denoiser import DenoisedClassifier
from aisafety.database.zoo import load_zoo_state
from aisafety.defense.training.base import FitFunction, TrainingDefense, TrainingStep
from aisafety.defense.training.sat import transfer_correct
from aisafety.errors import ConfigError, IntegrityError
from aisafety.prediction.base import Predictor


class HGDConfig(PluginConfig):
    target: str = Field(default="mnist-cnn", description="zoo classifier behind the denoiser")
    target_sha256: str | None = Field(default=None, description="pins the target's weights")
    eps: float = Field(default=0.3, gt=0, description="largest l-inf budget of the examples")
    steps: int = Field(default=5, ge=1, description="PGD steps making each training example")


def denoised_parts(network: nn.Module) -> DenoisedClassifier:
    body = network[1]
    if not isinstance(body, DenoisedClassifier):
        raise ConfigError(
            "training defense 'hgd' needs a denoiser in front of the classifier; use "
            "--architecture hgd-mnist-cnn"
        )
    return body


def varied_budget_pgd(
    target: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """PGD on ``target`` with a budget drawn per sample uniformly in [0, eps]."""
    budget = eps * torch.rand(len(x), 1, 1, 1, generator=generator, device=x.device)
    start = torch.rand(x.shape, generator=generator, device=x.device)
    delta = (2 * start - 1) * budget
    for _ in range(steps):
        delta.requires_grad_(True)
        loss = F.cross_entropy(target((x + delta).clamp(0, 1)), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, delta)
        delta = delta.detach() + 2.5 * budget / steps * grad.sign()
        delta = torch.maximum(torch.minimum(delta, budget), -budget)
    return (x + delta).clamp(0, 1).detach()


class HighLevelGuidedDenoiser(TrainingDefense):
    name = "hgd"
    description = "high-level representation guided denoiser, LGD (Liao et al. 2018)"
    Config = HGDConfig
    architecture = "hgd-mnist-cnn"
    adaptive_attack = "worst case of white-box PGD-40 through the denoiser and PGD-40 "
    adaptive_attack += "transferred from the target (Liao et al.'s oblivious attacker)"

    def prepare(self, network: nn.Module, fit: FitFunction) -> None:
        """Load the target classifier's shipped weights and freeze them."""
        c = self.config
        entry, state = load_zoo_state(c.target)
        if c.target_sha256 is not None and entry.sha256 != c.target_sha256:
            raise IntegrityError(
                f"hgd target {c.target!r} has sha256 {entry.sha256[:12]}…, the recipe pins "
                f"{c.target_sha256[:12]}…; restore that checkpoint or retrain it"
            )
        classifier = denoised_parts(network).classifier
        classifier.load_state_dict(state)
        classifier.eval().requires_grad_(False)

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        parts = denoised_parts(network)
        parts.classifier.eval()
        normalize = network[0]

        def target(images: torch.Tensor) -> torch.Tensor:
            return parts.classifier(normalize(images))

        x_adv = varied_budget_pgd(target, x, y, c.eps, c.steps, step.generator)
        with torch.no_grad():
            guide = target(x)
        denoised = parts.classifier(parts.denoiser(normalize(x_adv)))
        return (denoised - guide).abs().sum(1).mean()

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return transfer_correct(predictor, x, y, eps, self.config.target)
