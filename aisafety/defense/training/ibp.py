"""Interval bound propagation (Gowal et al., 2018) and CROWN-IBP (Zhang et al., 2020) training.

The bounds come from ``aisafety.verification`` (see its ``margins.py``); they are on the
margins m_j = f_y(x') - f_j(x') over the l-inf ball of radius eps around x intersected
with [0, 1]; m_j > 0 for every j != y certifies the prediction.

* IBP pushes a box through the network (an affine layer maps centre c and radius r to
  W c + b and |W| r; ReLU, max- and average-pooling are monotone) and folds the margin
  matrix C into the last linear layer ("elision", Gowal et al. Sec. 3), which is tighter
  than subtracting the logit intervals.
* CROWN-IBP bounds C f(x') by one backward linear relaxation (CROWN, Zhang et al. 2018)
  whose ReLU relaxations use the IBP pre-activation bounds: upper line u/(u-l) (z - l),
  lower line z if u > -l else 0. It needs Linear, Conv2d, ReLU, Flatten and
  layers of ``aisafety.verification`` (no max-pooling: use the ``mnist-cnn-strided`` architecture).

Training mixes a clean and a robust cross-entropy with the schedules of Zhang et al.:
eps ramps linearly from 0, kappa (weight of the clean loss) goes from ``kappa_start`` (1)
to ``kappa_end`` and beta (weight of the CROWN-IBP bound against the IBP one) from 1 to 0
over the ramp. ``kappa_start = kappa_end = 0`` is CROWN-IBP's method ``robust`` (the robust
loss only once eps > 0), what the SoK's configs train with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.database.datasets.base import LoadedDataset
from aisafety.defense.mlp_gradient import relu_mlp_layers
from aisafety.defense.training.base import TrainingDefense, TrainingStep, batched_mean
from aisafety.defense.training.mlp_bounds import mlp_margin_bounds
from aisafety.verification.margins import (
    certified,
    crown_ibp_margin_bounds,
    ibp_margin_bounds,
    robust_cross_entropy,
)

__all__ = ["certified", "crown_ibp_margin_bounds", "ibp_margin_bounds", "IBPTraining"]


class IBPTrainingConfig(PluginConfig):
    eps: float = Field(default=0.1, ge=0, description="training radius (often above the test eps)")
    warmup_epochs: float = Field(default=1.0, ge=0, description="clean training before the ramp")
    ramp_epochs: float = Field(default=3.0, ge=0, description="eps 0 -> eps, kappa 1 -> kappa_end")
    kappa_start: float = Field(default=1.0, ge=0, le=1, description="clean weight at ramp start")
    kappa_end: float = Field(default=0.5, ge=0, le=1)


class CrownIBPTrainingConfig(IBPTrainingConfig):
    kappa_end: float = Field(default=0.0, ge=0, le=1)


def ramp(progress: float, warmup: float, length: float) -> float:
    """0 during warm-up, then linear to 1 over ``length`` epochs."""
    if progress < warmup:
        return 0.0
    return 1.0 if length <= 0 else min(1.0, (progress - warmup) / length)


class IBPTraining(TrainingDefense):
    name = "ibp"
    description = "interval bound propagation training (Gowal et al. 2018), l-inf certified"
    Config = IBPTrainingConfig
    crown_weight_start = 0.0  # beta at the start of the ramp; IBP never uses CROWN
    selection_metric = "IBP-certified accuracy"
    later_wins_ties = True

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        t = ramp(step.progress, c.warmup_epochs, c.ramp_epochs)
        if t == 0:
            return F.cross_entropy(network(x), y)
        kappa = c.kappa_start + t * (c.kappa_end - c.kappa_start)
        eps, beta = t * c.eps, self.crown_weight_start * (1 - t)
        mlp = relu_mlp_layers(network)
        if mlp is not None:  # the same bounds, written out (``mlp_bounds``): faster
            bound = mlp_margin_bounds(*mlp, x, y, eps, beta)
        else:
            bound = ibp_margin_bounds(network, x, y, eps)
            if beta > 0:
                bound = beta * crown_ibp_margin_bounds(network, x, y, eps) + (1 - beta) * bound
        robust = robust_cross_entropy(bound, y)
        if kappa == 0:
            return robust
        return kappa * F.cross_entropy(network(x), y) + (1 - kappa) * robust

    def selection_score(self, network: nn.Module, data: LoadedDataset, epoch: int) -> float | None:
        """IBP-certified accuracy at the full eps, from the epoch after the first full-eps
        one on (0-based ``epoch >= warmup + ramp + 1``): CROWN-IBP's code keeps the best
        IBP-verified epoch once ``t >= schedule_start + schedule_length``, where its ramp
        is ``schedule_length - 1`` epochs long; ties keep the later epoch, as its ``<=``."""
        c = self.config
        if epoch < c.warmup_epochs + c.ramp_epochs + 1:
            return None
        with torch.no_grad():
            return batched_mean(
                data, lambda x, y: certified(ibp_margin_bounds(network, x, y, c.eps), y)
            )


class CrownIBPTraining(IBPTraining):
    name = "crown-ibp"
    description = "CROWN-IBP certified training (Zhang et al. 2020), l-inf"
    Config = CrownIBPTrainingConfig
    crown_weight_start = 1.0
