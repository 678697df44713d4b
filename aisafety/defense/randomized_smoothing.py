"""Randomized-smoothing prediction (Cohen, Rosenfeld & Kolter 2019, PREDICT).

The smoothed classifier answers the class the base model most often gives under Gaussian
noise N(0, sigma^2 I) (or, with ``noise``, Laplace or uniform noise of scale ``sigma``: the
l1 smoothings of Teng et al. 2020 and Yang et al. 2020; certification is in
``aisafety.defense.smoothing``). PREDICT draws ``samples`` noisy copies, counts the votes, and
abstains unless a two-sided binomial test says the top class beats the runner-up at level
``alpha``; then the answer is wrong with probability at most ``alpha``.

As a predictor it returns log vote shares, log((count + 1/2) / (samples + classes/2))
(add-1/2 smoothing keeps the log finite for classes never voted), so the argmax is the
plurality class and score-based attacks see the vote. ``predict_smoothed`` gives the
PREDICT answer with abstentions. Votes are piecewise constant in x: a gradient attack sees a
zero gradient. With ``bpda`` the backward pass instead runs through the soft smoothed
classifier log E[softmax(f(x + noise))] over ``eot_samples`` draws, the attack of Salman
et al. (2019) on smoothed classifiers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field

from aisafety.defense.base import InputDefense, RandomDefenseConfig, is_attacker_pass
from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.memory_budget import fitting
from aisafety.prediction.footprint import image_bytes

ABSTAIN = -1


class RandomizedSmoothingConfig(RandomDefenseConfig):
    noise: Noise = Field(default=Noise.GAUSSIAN, description="gaussian, laplace or uniform")
    sigma: float = Field(
        default=0.25,
        gt=0,
        description="noise scale in [0, 1] pixel units: Gaussian std, Laplace scale b, "
        "uniform half-width",
    )
    samples: int = Field(default=100, ge=1, description="noisy copies per prediction (n)")
    alpha: float = Field(default=0.001, gt=0, lt=1, description="abstention test level")
    batch_size: int = Field(
        default=1024,
        ge=1,
        description="noisy images drawn at once, one forward pass (fewer per pass where the "
        "memory budget says so; the draws stay the same)",
    )


@dataclass(frozen=True)
class SmoothedPrediction:
    """PREDICT's answer per image: ``labels`` is ABSTAIN (-1) where it abstained."""

    labels: torch.Tensor
    abstained: torch.Tensor
    counts: torch.Tensor
    p_values: torch.Tensor


class RandomizedSmoothing(InputDefense):
    name = "randomized-smoothing"
    description = (
        "Majority vote under Gaussian noise, abstaining by a binomial test (Cohen et al. 2019)"
    )
    Config = RandomizedSmoothingConfig

    def transform_copies(self) -> float:
        """A noisy copy and its noise (the votes' noisy batch is counted by ``votes``)."""
        return 2.0

    def passes(self, grad: bool) -> int:
        """An attacker's pass differentiates ``eot_samples`` noisy copies only with BPDA;
        without it the votes are gradient-free and chunk themselves (``forward_chunk``)."""
        return self.config.eot_samples if grad and self.config.bpda else 1

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """One noisy copy; not clipped to [0, 1], as in Cohen et al. (the guarantee needs
        the pure noise distribution)."""
        c = self.config
        return x + sample_noise(c.noise, c.sigma, x.shape, self.generator, self.device)

    def noisy_copies(self, x: torch.Tensor, draws: int) -> torch.Tensor:
        """``draws`` noisy copies of the batch, copy-major (draws * N, ...): the values of
        ``transform(x.repeat(draws, 1, 1, 1))`` without building the repeated batch."""
        c = self.config
        shape = (draws * len(x), *x.shape[1:])
        noise = sample_noise(c.noise, c.sigma, torch.Size(shape), self.generator, self.device)
        return noise.view(draws, *x.shape).add_(x).view(shape)

    def votes(self, x: torch.Tensor, samples: int | None = None) -> torch.Tensor:
        """(N, classes) counts of the base model's answers over ``samples`` noisy copies
        (default: the config's), ``batch_size`` noisy images per forward pass."""
        samples = self.config.samples if samples is None else samples
        counts = torch.zeros(len(x), self.num_classes, dtype=torch.long, device=self.device)
        per_pass = max(1, self.config.batch_size // len(x))
        forward = self.forward_chunk(per_pass * len(x))
        with torch.no_grad():
            for start in range(0, samples, per_pass):
                draws = min(per_pass, samples - start)
                noisy = self.noisy_copies(x.detach(), draws)
                answers = [self.inner._logits(part).argmax(1) for part in noisy.split(forward)]
                answers = torch.cat(answers).view(draws, len(x))
                counts.scatter_add_(1, answers.T, torch.ones_like(answers.T))
        return counts

    def forward_chunk(self, noisy: int) -> int:
        """Noisy images per forward pass: all ``noisy`` drawn at once, or fewer where their
        activations would not fit the memory budget (the draws, and so the votes, stay
        those of ``batch_size``); refused before any work where one does not fit."""
        image = 4 * math.prod(self.input_shape)
        return fitting(
            f"randomized smoothing of model {self.inner.name!r} ({noisy} noisy images of shape "
            f"{tuple(self.input_shape)} drawn at once)",
            image_bytes(self.inner, grad=False),
            noisy,
            "lower the defense's batch_size, or raise 'limits: {memory_gib: ...}' in the plan "
            "if the machine has the memory",
            self.device,
            fixed=noisy * image,
        )

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        counts = self.votes(x).to(torch.float32)
        shares = torch.log(counts + 0.5) - math.log(self.config.samples + self.num_classes / 2)
        if not is_attacker_pass(x):
            return shares
        if not self.config.bpda:
            # d(votes)/dx = 0 almost everywhere; keep x in the graph so attacks run.
            return shares + 0.0 * x.flatten(1).sum(1, keepdim=True)
        soft = self._soft_log_probs(x)
        return soft + (shares - soft).detach()

    def _soft_log_probs(self, x: torch.Tensor) -> torch.Tensor:
        draws = self.config.eot_samples
        noisy = self.transform(x.repeat(draws, 1, 1, 1))
        probs = torch.softmax(self.inner._logits(noisy), dim=1).view(draws, len(x), -1)
        return torch.log(probs.mean(0).clamp_min(1e-12))

    def predict_smoothed(self, x: torch.Tensor) -> SmoothedPrediction:
        """Cohen et al.'s PREDICT: the top class, or ABSTAIN when the binomial test of top
        versus runner-up counts is not significant at ``alpha``."""
        self.check_input(x)
        counts = self.votes(x)
        top2 = counts.topk(2, dim=1) if self.num_classes > 1 else counts.topk(1, dim=1)
        n_top = top2.values[:, 0]
        n_second = top2.values[:, 1] if self.num_classes > 1 else torch.zeros_like(n_top)
        p_values = torch.from_numpy(
            two_sided_binomial_p(n_top.cpu().numpy(), (n_top + n_second).cpu().numpy())
        )
        abstained = (p_values > self.config.alpha).to(self.device)
        labels = torch.where(abstained, torch.full_like(n_top, ABSTAIN), top2.indices[:, 0])
        return SmoothedPrediction(labels, abstained, counts, p_values.to(torch.float32))


def two_sided_binomial_p(successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """p-value of a two-sided binomial test of p = 1/2 (scipy's ``binomtest``), vectorised.

    For p = 1/2 the distribution is symmetric, so the p-value is twice the tail beyond the
    larger of k and n - k, capped at 1.
    """
    from scipy.stats import binom  # here: every process building the registry imports us

    larger = np.maximum(successes, trials - successes)
    return np.minimum(1.0, 2 * binom.sf(larger - 1, trials, 0.5))
