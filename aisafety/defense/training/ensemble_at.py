"""Ensemble adversarial training (Tramèr et al., 2018).

Each batch is trained on 0.5 * (CE(f(x), y) + CE(f(x'), y)), where x' is FGSM at eps made on
a source drawn uniformly per batch from the model being trained and the static, pre-trained
models. The FGSM loss uses the source's own predicted label instead of y (the authors'
``gen_adv_loss(loss='training')``, against label leaking), x' is clipped to [0, 1]. This is
the authors' MNIST code (``train_adv.py``, ``tf_utils.tf_train``); they train 6 or 12 epochs.

The static models are zoo entries pinned by sha256 in the config, so the recipe names
exactly which weights the transferred examples came from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.database.zoo import load_zoo_state
from aisafety.defense.training.base import FitFunction, TrainingDefense, TrainingStep
from aisafety.errors import ConfigError, IntegrityError

# Two shipped MNIST models of other architectures than mnist-cnn (a strided CNN and a
# 3 x 100 MLP), as the paper's static models differ from the trained one; mnist-cnn itself
# is held out as the source of the transfer attack the entry is evaluated with.
DEFAULT_STATIC = {
    "sok-cnn-a-clean": "32992f600afa0ada86bb0cc84abf95c98a17917071bbb05139d70831144d7a85",
    "sok-fcnn-b-clean": "c5ff44932686411be960f2a84e88dc9537fbb58ef496212b307251771f50d4ed",
}


class EnsembleATConfig(PluginConfig):
    eps: float = Field(default=0.3, gt=0, description="l-inf FGSM budget")
    static_models: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_STATIC),
        description="zoo entry -> its sha256: the pre-trained models examples transfer from",
    )
    holdout: str = Field(
        default="mnist-cnn", description="zoo model the evaluation's transfer attack runs on"
    )


def fgsm_predicted_label(network: nn.Module, x: torch.Tensor, eps: float) -> torch.Tensor:
    """FGSM at ``eps`` on CE against ``network``'s own prediction, clipped to [0, 1]."""
    x = x.detach().clone().requires_grad_(True)
    logits = network(x)
    loss = F.cross_entropy(logits, logits.argmax(1).detach(), reduction="sum")
    (grad,) = torch.autograd.grad(loss, x)
    return (x.detach() + eps * grad.sign()).clamp(0, 1)


def load_static(name: str, sha256: str) -> nn.Module:
    """Zoo entry ``name`` (with its normalisation), refused unless its sha256 is ``sha256``."""
    from aisafety.database.architectures import build
    from aisafety.prediction.torch_module import Normalize

    entry, state = load_zoo_state(name)
    if entry.sha256 != sha256:
        raise IntegrityError(
            f"ensemble-at: static model {name!r} has sha256 {entry.sha256[:12]}…, the recipe "
            f"pins {sha256[:12]}…; restore that checkpoint or name its sha256 in static_models"
        )
    module = build(entry.architecture)
    module.load_state_dict(state)
    return nn.Sequential(Normalize(entry.mean, entry.std), module).eval().requires_grad_(False)


class EnsembleAdversarialTraining(TrainingDefense):
    name = "ensemble-at"
    description = "ensemble adversarial training (Tramèr et al. 2018): FGSM from static models"
    Config = EnsembleATConfig
    # The paper's claim is robustness to transferred examples (``evaluation_attacks``);
    # white-box PGD-40, recorded for every entry, is the attack that beats it.

    static: list[nn.Module] | None = None

    def prepare(self, network: nn.Module, fit: FitFunction) -> None:
        if not self.config.static_models:
            raise ConfigError("ensemble-at: static_models is empty; name at least one zoo entry")
        self.static = [load_static(n, h) for n, h in self.config.static_models.items()]

    def evaluation_attacks(self) -> list[tuple[str, dict]]:
        # The paper's threat model: FGSM transferred from a held-out model; and its own
        # white-box check R+FGSM (PGD-40, which the manifest always records, is the stronger).
        transfer = {"surrogate": self.config.holdout, "attack": "fgsm"}
        return [("transfer", transfer), ("r-fgsm", {})]

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        if self.static is None:
            raise RuntimeError("ensemble-at: prepare() must load the static models first")
        sources = [network, *self.static]
        pick = int(torch.randint(len(sources), (1,), generator=step.generator))
        source = sources[pick]
        was_training = network.training
        network.eval()
        x_adv = fgsm_predicted_label(source, x, self.config.eps)
        network.train(was_training)
        return 0.5 * (F.cross_entropy(network(x), y) + F.cross_entropy(network(x_adv), y))
