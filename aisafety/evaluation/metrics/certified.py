"""IBP-certified accuracy: the fraction of samples no l-inf perturbation of size eps can flip.

A sample counts when it is classified correctly *and* interval bound propagation proves
f_y(x') - f_j(x') > 0 for every j != y and every x' in the eps-ball around x intersected
with [0, 1] (Gowal et al. 2018, with the margin folded into the last layer). The bound is
sound, so certified accuracy <= robust accuracy under any attack <= clean accuracy.

Registered metrics: ``ibp-certified-accuracy``.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.defense.training.ibp import certified, ibp_margin_bounds
from aisafety.errors import CapabilityError
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import Capability, Direction, MetricValue


class CertifiedConfig(PluginConfig):
    eps: float = Field(default=0.1, ge=0, description="l-inf radius in [0, 1] pixel units")


def ibp_certified_mask(
    network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, batch_size: int = 500
) -> torch.Tensor:
    """True where IBP certifies ``network`` (normalisation included) at ``eps``."""
    with torch.inference_mode():
        return torch.cat([
            certified(ibp_margin_bounds(network, xb, yb, eps), yb)
            for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True)
        ])  # fmt: skip


class IBPCertifiedAccuracy(CleanMetric):
    name = "ibp-certified-accuracy"
    description = "Fraction of samples whose l-inf eps-ball IBP certifies (a verified lower bound)"
    direction = Direction.HIGHER
    unit = "fraction"
    category = "certified"
    requires = Capability.GRADIENTS  # white-box: needs the weights, not only outputs
    Config = CertifiedConfig

    def compute(self, ctx: EvaluationContext) -> MetricValue:
        network = getattr(ctx.predictor, "network", None)
        if not isinstance(network, torch.nn.Module):
            raise CapabilityError(
                f"metric {self.name!r} needs the model's PyTorch layers, but "
                f"{ctx.predictor.name!r} ({type(ctx.predictor).__name__}) does not expose "
                "them; evaluate a zoo or PyTorch model without input defenses"
            )
        device = next(network.parameters()).device
        mask = ibp_certified_mask(network, ctx.x.to(device), ctx.y.to(device), self.config.eps)
        return self.value(mask.double().mean(), len(ctx.y))
