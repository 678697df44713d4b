"""Thermometer-encoded training with LS-PGA adversarial examples (Buckman et al., ICLR 2018).

The network reads a thermometer encoding of its input (architecture
``mnist-cnn-thermometer-16``; ``aisafety.database.thermometer``). Gradients cannot pass the
encoding, so Buckman et al. attack in the encoding's own space: logit-space projected
gradient ascent (LS-PGA, their Alg. 3). Per pixel, the buckets reachable within the l-inf
eps-ball get logits z (random start, unreachable ones -inf); a relaxed encoding is
P(bucket >= k) under softmax(z / T); each step adds xi sign(grad_z CE) and anneals T <- T / delta;
the final example is the argmax bucket's hard encoding (every reachable bucket is the
encoding of some pixel value inside the ball, so it is a real image's encoding).

The batch loss mixes clean and LS-PGA cross-entropy with weight ``adversarial_weight`` (0.5:
the mixed clean/adversarial recipe Buckman et al. follow from Kurakin et al. 2017; 0 trains
on clean encodings only). The adaptive evaluation is Athalye et al.'s BPDA (PGD-40 through
the soft encoding) together with LS-PGA itself, each per sample with white-box PGD-40.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.config_base import PluginConfig
from aisafety.database.thermometer import ThermometerEncoding, bpda, buckets, from_buckets
from aisafety.defense.adversarial_training import linear_warmup
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.errors import ConfigError
from aisafety.prediction.base import Predictor


class ThermometerConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0)
    steps: int = Field(default=7, ge=1, description="LS-PGA steps while training")
    attack_steps: int = Field(default=40, ge=1, description="LS-PGA steps when evaluating")
    xi: float = Field(default=1.0, gt=0, description="LS-PGA step on the bucket logits")
    delta: float = Field(default=1.2, ge=1, description="LS-PGA temperature annealing factor")
    adversarial_weight: float = Field(default=0.5, ge=0, le=1)
    warmup_epochs: float = Field(default=0.0, ge=0)


def split_encoder(network: nn.Module) -> tuple[ThermometerEncoding, nn.Module]:
    """The thermometer layer and the classifier behind it, checked: [0, 1] pixel input."""
    normalize, body = network[0], network[1]
    if not (isinstance(body, nn.Sequential) and isinstance(body[0], ThermometerEncoding)):
        raise ConfigError(
            "training defense 'thermometer' needs an architecture that starts with a "
            "thermometer encoding; use --architecture mnist-cnn-thermometer-16"
        )
    if bool((normalize.mean != 0).any() or (normalize.std != 1).any()):
        raise ConfigError(
            "training defense 'thermometer': the encoding reads pixel values in [0, 1]; "
            "train with --mean 0 --std 1"
        )
    return body[0], body[1:]


def ls_pga(
    classifier: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    levels: int,
    eps: float,
    steps: int,
    xi: float,
    delta: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """LS-PGA's hard encoding (N, C * levels, H, W) of an example inside the eps-ball."""
    low = buckets((x - eps).clamp(0, 1), levels).unsqueeze(2)
    high = buckets((x + eps).clamp(0, 1), levels).unsqueeze(2)
    k = torch.arange(levels, device=x.device).view(1, 1, levels, 1, 1)
    reachable = (k >= low) & (k <= high)
    shape = (*x.shape[:2], levels, *x.shape[2:])
    noise = torch.randn(shape, generator=generator, device=x.device)
    z = noise.masked_fill(~reachable, float("-inf"))
    was_training = classifier.training
    classifier.eval()
    temperature = 1.0
    for _ in range(steps):
        z.requires_grad_(True)
        p = F.softmax(z / temperature, dim=2)
        relaxed = p.flip(2).cumsum(2).flip(2)  # channel k: P(bucket >= k)
        loss = F.cross_entropy(classifier(relaxed.flatten(1, 2)), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, z)
        z = (z.detach() + xi * grad.sign()).masked_fill(~reachable, float("-inf"))
        temperature /= delta
    classifier.train(was_training)
    return from_buckets(z.argmax(2), levels).flatten(1, 2)


class ThermometerTraining(TrainingDefense):
    name = "thermometer"
    description = "thermometer-encoded input, LS-PGA adversarial training (Buckman et al. 2018)"
    Config = ThermometerConfig
    architecture = "mnist-cnn-thermometer-16"
    adaptive_attack = "worst case of PGD-40, BPDA PGD-40 (Athalye et al. 2018) and LS-PGA"

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        encoder, classifier = split_encoder(network)
        clean = F.cross_entropy(network(x), y)
        if c.adversarial_weight == 0:
            return clean
        eps = linear_warmup(c.eps, c.warmup_epochs, step.progress)
        levels = encoder.levels
        encoded = ls_pga(classifier, x, y, levels, eps, c.steps, c.xi, c.delta, step.generator)
        adversarial = F.cross_entropy(classifier(encoded), y)
        return (1 - c.adversarial_weight) * clean + c.adversarial_weight * adversarial

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return bpda_correct(predictor, x, y, eps) & ls_pga_correct(
            predictor, x, y, eps, self.config
        )


def bpda_correct(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per sample: still right after PGD-40 whose gradient passes the soft encoding."""
    with bpda(predictor):
        return PGDLinf({"steps": 40})(predictor, x, y, eps).adv_pred == y


def ls_pga_correct(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    config: ThermometerConfig,
    batch_size: int = 500,
) -> torch.Tensor:
    """Per sample: still right after LS-PGA with ``attack_steps`` steps (seed 0)."""
    encoder, classifier = split_encoder(predictor.network)
    generator = torch.Generator(device=x.device).manual_seed(0)
    correct = []
    for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True):
        encoded = ls_pga(
            classifier, xb, yb, encoder.levels, eps, config.attack_steps, config.xi,
            config.delta, generator,
        )  # fmt: skip
        with torch.no_grad():
            correct.append(classifier(encoded).argmax(1) == yb)
    return torch.cat(correct)
