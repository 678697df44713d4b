"""Ensembles of attacks, as AutoAttack (Croce & Hein, ICML 2020, "Reliable evaluation of
adversarial robustness with an ensemble of diverse parameter-free attacks"): a sample counts
as robust only if every member fails on it.

``standard`` runs APGD-CE, then APGD-T (targeted DLR, top-9 targets), then FAB-T (top-9
targets), then Square (5,000 queries); ``rand``, for randomised defenses, runs APGD-CE and
APGD-DLR with gradients averaged over 20 draws (EOT). ``-l2`` versions use the members' l2
variants. Each member runs only on the samples every earlier member left robust (and none on
a sample the model already misclassifies), with the ensemble's clean logits; the gradient
members stop moving a sample once it is misclassified (``early_stop``). The order
(``attacks``), iterations (``steps``), restarts (``n_restarts``), Square's ``queries``, EOT
draws (``eot_iter``) and any member's own settings (``attack_configs``) are configurable.

Per sample the result holds the worst case: the example of the member that broke it, else
the member output with the lowest margin ``z_y - max_{i != y} z_i``; ``broken_by`` names the
member that broke it. Each member is an ``Attack`` run through its own base class, which
projects and re-checks its examples; the ensemble projects and re-evaluates the chosen points
once more (so a randomised model confirms them on a fresh draw: a sample whose break does
not survive it counts as robust, and as broken by none).

``steps`` are summed over the members (gradient steps and queries alike).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig, keep_clean_mistakes
from aisafety.attack.call import AttackCall
from aisafety.attack.result import AttackResult
from aisafety.attack.transfer import AttackRegistry
from aisafety.attack.work import counted
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# the member settings the ensemble sets, from its own config, in each member that has them
_SHARED = ("steps", "n_restarts", "queries", "early_stop", "eot_iter", "precision")


def _clock(device: torch.device) -> float:
    """Now, after the device's queued work: a GPU runs asynchronously, so a member's time
    read without a synchronisation would count its launches, not its work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class EnsembleConfig(AttackConfig):
    attacks: list[str] | None = Field(
        default=None, min_length=1, description="members in the order they run (default: "
        "the version's, e.g. apgd-ce, apgd-t, fab-t, square-linf for standard)",
    )  # fmt: skip
    steps: int = Field(default=100, gt=0, description="iterations of APGD and FAB members")
    n_restarts: int = Field(default=1, gt=0, description="restarts of each member that has them")
    queries: int = Field(default=5000, gt=0, description="query budget of Square")
    eot_iter: int = Field(default=1, gt=0, description="gradients averaged per step (EOT)")
    early_stop: bool = Field(
        default=True, description="members stop moving a sample once it is misclassified"
    )
    attack_configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="a member's own settings, by name (override the above)"
    )


@dataclass
class _Outcome:
    x_adv: torch.Tensor
    steps: torch.Tensor
    broken_by: torch.Tensor
    attacked: torch.Tensor
    member_steps: torch.Tensor
    seconds: tuple[float, ...]


def _margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``z_y - max_{i != y} z_i``: how far from misclassified (the worst case is the lowest)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    return true - logits.scatter(1, y[:, None], float("-inf")).amax(1)


class _Ensemble(Attack):
    family = AttackFamily.GRADIENT
    requires = Capability.GRADIENTS
    Config = EnsembleConfig
    members_by_default: ClassVar[tuple[str, ...]]
    eot_by_default: ClassVar[int] = 1
    builds_from_registry = True
    # members get each sample's own index (its random stream), whichever samples are left
    chunk_independent = True

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        registry: AttackRegistry | None = None,
        **overrides: Any,
    ):
        raw = {**(config or {}), **overrides}
        raw.setdefault("eot_iter", self.eot_by_default)
        super().__init__(raw)
        if registry is None:
            raise ConfigError(
                f"attack {self.name!r} builds its members by name: create it through the "
                f"plugin registry, aisafety.plugins.default_registry().create('attack', "
                f"{self.name!r}, config)"
            )
        names = list(self.config.attacks or self.members_by_default)
        unknown = set(self.config.attack_configs) - set(names)
        if unknown:
            raise ConfigError(
                f"attack {self.name!r}: attack_configs names {sorted(unknown)}, which are not "
                f"members; the members are {names}"
            )
        self.members: list[Attack] = [self._member(registry, name) for name in names]

    def _member(self, registry: AttackRegistry, name: str) -> Attack:
        cls = registry.get("attack", name)
        if issubclass(cls, _Ensemble):
            raise ConfigError(
                f"attack {self.name!r}: member {name!r} is an ensemble; "
                "members are single attacks, e.g. apgd-ce, apgd-t, fab-t, square-linf"
            )
        if cls.norm is not self.norm:
            raise ConfigError(
                f"attack {self.name!r} is an l-{self.norm.value} ensemble but member {name!r} "
                f"attacks under {cls.norm.value if cls.norm else 'no norm'}; pick members of "
                f"the same norm (`aisafety list attacks` shows each attack's norm)"
            )
        fields = getattr(cls.Config, "model_fields", {})
        cfg = self.config
        config: dict[str, Any] = {"seed": cfg.seed}
        config.update({key: getattr(cfg, key) for key in _SHARED if key in fields})
        config.update(cfg.attack_configs.get(name, {}))
        return registry.create("attack", name, config)

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outcome = self._run_members(predictor, x, y, eps, call.clean_logits, call.samples)
        return outcome.x_adv, outcome.steps

    def _run_members(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        clean_logits: torch.Tensor,
        samples: torch.Tensor,
        todo: torch.Tensor | None = None,
    ) -> _Outcome:
        """Each member in turn on the samples still robust; the worst case per sample."""
        n, k, device = len(x), len(self.members), x.device
        robust = clean_logits.argmax(1) == y
        if todo is not None:
            robust &= todo
        if eps == 0:
            robust &= False
        x_adv, worst = x.clone(), _margin(clean_logits, y)
        broken_by = torch.full((n,), -1, dtype=torch.long, device=device)
        attacked = torch.zeros(n, k, dtype=torch.bool, device=device)
        member_steps = torch.zeros(n, k, dtype=torch.long, device=device)
        seconds = [0.0] * k
        for j in counted("member", k, [m.name for m in self.members]):
            member = self.members[j]
            rows = robust.nonzero().squeeze(1)
            if not len(rows):
                break
            started = _clock(device)
            part = member(
                predictor, x[rows], y[rows], eps, chunk_size=len(rows),
                clean_logits=clean_logits[rows], samples=samples[rows.cpu()],
            )  # fmt: skip
            seconds[j] = _clock(device) - started
            attacked[rows, j] = True
            member_steps[rows, j] = part.steps.to(device)
            margin = _margin(part.adv_logits.to(device), y[rows])
            better = part.success.to(device) | (margin < worst[rows])
            x_adv[rows[better]] = part.x_adv.to(device)[better]
            worst[rows[better]] = margin[better]
            broke = rows[part.success.to(device)]
            broken_by[broke] = j
            robust[broke] = False
        return _Outcome(x_adv, member_steps.sum(1), broken_by, attacked, member_steps,
                        tuple(seconds))  # fmt: skip

    def _attack_chunk(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        generator: torch.Generator,
        samples: torch.Tensor,
        clean_logits: torch.Tensor | None,
        target: torch.Tensor | None,
        todo: torch.Tensor | None,
    ) -> AttackResult:
        """The base class's chunk (project, re-evaluate), keeping who broke each sample."""
        started = time.perf_counter()
        x, y, clean_logits = self._chunk_inputs(predictor, x, y, clean_logits)
        todo = None if todo is None else todo.to(predictor.device)
        outcome = self._run_members(predictor, x, y, eps, clean_logits, samples.cpu(), todo)
        x_adv, adv_logits = self._final_check(predictor, outcome.x_adv, x, eps)
        x_adv, adv_logits = keep_clean_mistakes(x, y, clean_logits, x_adv, adv_logits)
        success = adv_logits.argmax(1) != y
        broken_by = torch.where(success, outcome.broken_by, -1)
        return AttackResult(
            attack=self.name, eps=eps, norm=self.norm, x=x, x_adv=x_adv, y=y,
            clean_logits=clean_logits, adv_logits=adv_logits, success=success,
            steps=outcome.steps, seconds=time.perf_counter() - started,
            members=tuple(m.name for m in self.members), broken_by=broken_by,
            member_attacked=outcome.attacked, member_steps=outcome.member_steps,
            member_seconds=outcome.seconds,
        )  # fmt: skip


class StandardEnsemble(_Ensemble):
    name = "standard"
    norm = Norm.LINF
    members_by_default = ("apgd-ce", "apgd-t", "fab-t", "square-linf")
    description = "AutoAttack standard: APGD-CE, APGD-T, FAB-T, Square-5000 on what is left, l-inf"


class StandardEnsembleL2(_Ensemble):
    name = "standard-l2"
    norm = Norm.L2
    members_by_default = ("apgd-ce-l2", "apgd-t-l2", "fab-t-l2", "square-l2")
    description = "AutoAttack standard: APGD-CE, APGD-T, FAB-T, Square-5000 on what is left, l2"


class RandEnsemble(_Ensemble):
    name = "rand"
    norm = Norm.LINF
    members_by_default = ("apgd-ce", "apgd-dlr")
    eot_by_default = 20
    description = "AutoAttack rand: APGD-CE and APGD-DLR with EOT over 20 draws, l-inf"


class RandEnsembleL2(_Ensemble):
    name = "rand-l2"
    norm = Norm.L2
    members_by_default = ("apgd-ce-l2", "apgd-dlr-l2")
    eot_by_default = 20
    description = "AutoAttack rand: APGD-CE and APGD-DLR with EOT over 20 draws, l2"
