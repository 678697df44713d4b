"""Deep Defense (Yan, Guo & Zhang, NeurIPS 2018): penalise a small DeepFool perturbation.

loss = mean CE(f(x), y) + (lambda / B) * [ sum over correctly classified exp(-c ||r||/||x||)
                                          + sum over misclassified  exp( d ||r||/||x||) ],

with r the l2 DeepFool perturbation of x (``max_iter`` linearisation steps, overshoot 0.02),
built as a differentiable graph so the regulariser's gradient runs through every DeepFool
step ("solved just like training a recursive network"). For a correctly classified sample r
leads out of its class (towards the nearest of the other classes); for a misclassified one,
towards its true class, from whichever class it is currently predicted as. The defaults are
the authors' MNIST ones (``deepdefense.pytorch/main.py``): lambda 15, c 25, d 5, 5 DeepFool
iterations, fine-tuning a pre-trained reference model.

Departures, for the shared CPU: the regulariser is estimated on ``reg_samples`` samples of
each batch (the first ones of the shuffled batch; scaled by B / reg_samples so it estimates
the same batch mean), and DeepFool looks at the ``candidates`` classes with the highest
logits besides the label (the authors take all). Norms are taken in the [0, 1] pixel scale
the platform attacks in (the authors' ||x|| is in matconvnet's preprocessed scale).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.defense.training.parseval import apgd_dlr_correct
from aisafety.prediction.base import Predictor

OVERSHOOT = 0.02  # DeepFool's and the authors' value
TINY = 1e-6  # keeps a vanishing gradient's norm (and its derivative) finite; authors: 5e-6


class DeepDefenseConfig(PluginConfig):
    lam: float = Field(default=15.0, ge=0, description="weight of the regulariser (lambda)")
    c: float = Field(default=25.0, gt=0, description="scale for correctly classified samples")
    d: float = Field(default=5.0, gt=0, description="scale for misclassified samples")
    max_iter: int = Field(default=5, gt=0, description="DeepFool iterations")
    candidates: int = Field(default=9, gt=0, description="classes DeepFool considers")
    reg_samples: int = Field(default=128, gt=0, description="samples per batch regularised")


def logit_jacobian(
    network: nn.Module, x: torch.Tensor, classes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits f_k(x) and gradients d f_k / dx for the (B, K) ``classes`` of each sample, as
    a graph that can itself be differentiated (one pass over K copies of the batch)."""
    b, k = classes.shape
    if not x.requires_grad:
        x = x.requires_grad_(True)
    copies = x.unsqueeze(0).expand(k, *x.shape).reshape(k * b, *x.shape[1:])
    logits = network(copies)
    picked = logits.gather(1, classes.T.reshape(-1, 1)).view(k, b)
    (grad,) = torch.autograd.grad(picked.sum(), copies, create_graph=True)
    return picked.T, grad.view(k, b, -1).transpose(0, 1)


def deepfool_perturbation(
    network: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    correct: torch.Tensor,
    max_iter: int,
    candidates: int,
) -> torch.Tensor:
    """The l2 DeepFool perturbation (B, D), differentiable in the network's weights.

    ``correct`` samples move away from y to the nearest of the ``candidates`` runner-up
    classes (fixed at the start, as the authors'); the others move from their current
    prediction towards y. A sample stops moving once x + (1 + overshoot) r reaches its goal.
    """
    b = len(x)
    with torch.no_grad():
        clean = network(x)
    num_classes = clean.shape[1]
    others = clean.scatter(1, y[:, None], float("-inf"))
    runners = others.topk(min(candidates, num_classes - 1), dim=1).indices
    r = torch.zeros(b, x[0].numel(), dtype=x.dtype, device=x.device)
    active = torch.ones(b, dtype=torch.bool, device=x.device)
    origin = torch.where(correct, y, clean.argmax(1))
    for _ in range(max_iter):
        point = x + r.view_as(x)
        # Column 0 is the class the sample moves away from, the rest the targets.
        targets = torch.where(correct[:, None], runners, y[:, None].expand_as(runners))
        logits, grads = logit_jacobian(network, point, torch.cat([origin[:, None], targets], 1))
        gap = logits[:, 1:] - logits[:, :1]  # f_k - f_origin (< 0 until crossed)
        w = grads[:, 1:] - grads[:, :1]
        w_norm = (w.square().sum(2) + TINY**2).sqrt()
        distance = gap.abs() / w_norm
        best = distance.detach().argmin(1)
        pick = best[:, None]
        step_len = distance.gather(1, pick) / w_norm.gather(1, pick)
        step = step_len * w.gather(1, pick[:, :, None].expand(-1, -1, w.shape[2])).squeeze(1)
        r = r + torch.where(active[:, None], step, torch.zeros_like(step))
        with torch.no_grad():
            predicted = network(x + (1 + OVERSHOOT) * r.view_as(x)).argmax(1)
            reached = torch.where(correct, predicted != y, predicted == y)
            active = active & ~reached
            origin = torch.where(correct, y, predicted)
        if not active.any():
            break
    return (1 + OVERSHOOT) * r


def deep_defense_regulariser(
    network: nn.Module, x: torch.Tensor, y: torch.Tensor, c: DeepDefenseConfig
) -> torch.Tensor:
    """Sum over the samples of exp(-c rho) (correct) or exp(d rho) (wrong), rho = ||r||/||x||."""
    with torch.no_grad():
        correct = network(x).argmax(1) == y
    r = deepfool_perturbation(network, x, y, correct, c.max_iter, c.candidates)
    rho = r.norm(dim=1) / x.flatten(1).norm(dim=1).clamp_min(TINY)
    return torch.where(correct, torch.exp(-c.c * rho), torch.exp(c.d * rho)).sum()


class DeepDefense(TrainingDefense):
    name = "deep-defense"
    description = "Deep Defense (Yan et al. 2018): penalise small DeepFool perturbations"
    Config = DeepDefenseConfig
    adaptive_attack = "worst case of white-box PGD-40 and APGD-DLR"

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """Trained against one attack's perturbation (DeepFool's): a stronger white-box
        attack with a loss it was not shaped by, APGD-DLR."""
        return apgd_dlr_correct(predictor, x, y, eps)

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        ce = F.cross_entropy(network(x), y)
        if c.lam == 0:
            return ce
        n = min(c.reg_samples, len(x))
        regulariser = deep_defense_regulariser(network, x[:n], y[:n], c)
        return ce + c.lam * regulariser / n
