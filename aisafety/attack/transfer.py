"""Transfer attack: craft adversarial examples on a surrogate model, apply them to the target.

The black-box setting of Papernot et al. ("Transferability in Machine Learning", 2016;
"Practical Black-Box Attacks against Machine Learning", AsiaCCS 2017) and of the AISafety
evaluation framework's "PGD-l_p transfer" rows: any registered attack (``attack``, default
``pgd-linf``, configured by ``attack_config``) runs on a surrogate from the model zoo
(``surrogate``), with full access to it; the target model is never queried by the attack, only
by the final evaluation, so the attack needs nothing of the target beyond its labels.

The norm of a transfer attack is its inner attack's: ``TransferAttack.norm`` (the class
attribute, l-inf, used when attacks are listed) describes the default ``pgd-linf``; an
instance sets ``self.norm`` to the inner attack's norm, and the base class projects into that
budget. The inner attack runs on this call (its random stream, its targets, its samples)
with the surrogate's clean logits; the stream is seeded with the inner attack's seed
(``attack_config["seed"]``, default this attack's ``seed``), so crafting on a surrogate that
*is* the target gives exactly the inner attack's own result.

``steps`` reports the inner attack's steps (or queries) on the surrogate per sample; the
target costs no queries.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class AttackRegistry(Protocol):
    """What the transfer attack uses of ``aisafety.plugins.Registry``."""

    def get(self, kind: str, name: str) -> type: ...

    def create(self, kind: str, name: str, config: dict[str, Any] | None = None) -> Any: ...


class TransferConfig(AttackConfig):
    surrogate: str = Field(default="mnist-cnn", description="zoo model the examples are made on")
    attack: str = Field(default="pgd-linf", description="registered attack run on the surrogate")
    attack_config: dict[str, Any] = Field(
        default_factory=dict, description="configuration of the inner attack"
    )


class TransferAttack(Attack):
    name = "transfer"
    family = AttackFamily.TRANSFER
    norm = Norm.LINF  # the default inner attack's; instances take their inner attack's norm
    requires = Capability.LABELS
    chunk_independent = True
    description = "Transfer: run an attack on a zoo surrogate, apply the examples to the target"
    Config = TransferConfig

    # The registry passes itself (``registry=``): the inner attack is built by name from it.
    # Importing the registry here instead would close the cycle transfer -> plugins -> builtin.
    builds_from_registry = True

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        registry: AttackRegistry | None = None,
        **overrides: Any,
    ):
        super().__init__(config, **overrides)
        from aisafety.database.zoo import list_models
        from aisafety.errors import UnknownNameError

        cfg = self.config
        if cfg.attack == self.name:
            raise ConfigError(
                "attack 'transfer': the inner attack cannot be 'transfer' itself; name the "
                "attack to run on the surrogate, e.g. attack: pgd-linf"
            )
        if registry is None:
            raise ConfigError(
                "attack 'transfer' builds its inner attack by name: create it through the "
                "plugin registry, aisafety.plugins.default_registry().create('attack', "
                "'transfer', config)"
            )
        self.inner: Attack = registry.create(
            "attack", cfg.attack, {"seed": cfg.seed, **cfg.attack_config}
        )
        self.norm = self.inner.norm  # type: ignore[misc]  # the instance's budget is the inner's
        self.chunk_independent = self.inner.chunk_independent  # type: ignore[misc]
        self.targeted = self.inner.supports_targets()  # type: ignore[misc]
        models = list_models()
        if cfg.surrogate not in models:
            raise UnknownNameError("zoo model", cfg.surrogate, models)
        self._surrogates: dict[str, Predictor] = {}

    def random_seed(self) -> int:
        return self.inner.random_seed()

    def surrogate(self, device: torch.device) -> Predictor:
        """The surrogate model on ``device``, loaded once (sha256-checked by the zoo)."""
        from aisafety.database.zoo import load_zoo_model

        key = str(device)
        if key not in self._surrogates:
            self._surrogates[key] = load_zoo_model(self.config.surrogate, device=device)
        return self._surrogates[key]

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        surrogate = self.surrogate(predictor.device)
        self._check_surrogate(surrogate, predictor)
        surrogate.require(
            self.inner.requires,
            f"attack 'transfer' (inner attack {self.inner.name!r} on surrogate)",
        )
        with torch.no_grad():
            surrogate_logits = surrogate.logits(x)
        # the surrogate searches in the precision asked of transfer or of its inner attack
        searcher = self.inner.search_predictor(self.search_predictor(surrogate))
        return self.inner.perturb_todo(searcher, x, y, eps, call.with_logits(surrogate_logits))

    def _check_surrogate(self, surrogate: Predictor, target: Predictor) -> None:
        if tuple(surrogate.input_shape) != tuple(target.input_shape):
            raise ConfigError(
                f"attack 'transfer': surrogate {self.config.surrogate!r} takes inputs of shape "
                f"{tuple(surrogate.input_shape)}, the target model {target.name!r} takes "
                f"{tuple(target.input_shape)}; choose a surrogate trained on inputs like the "
                "target's (e.g. the same dataset)"
            )
        if surrogate.num_classes != target.num_classes:
            raise ConfigError(
                f"attack 'transfer': surrogate {self.config.surrogate!r} has "
                f"{surrogate.num_classes} classes, the target model {target.name!r} has "
                f"{target.num_classes}; choose a surrogate with the target's classes"
            )
