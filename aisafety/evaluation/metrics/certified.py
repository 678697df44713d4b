"""Certified metrics: proved lower bounds of robustness, each next to an attack's upper bound.

* ``certified-accuracy``: the fraction of samples a verifier proves robust in the l-inf
  eps-ball (within [0, 1]); a certified sample is correctly classified on the whole ball.
  Stored with an upper bound at the same eps: the fraction of samples that neither the
  attack (PGD by default) nor the verifier broke, sample by sample (a verifier's
  ``falsified`` counts where its counterexample replays through the predictor here); the
  true robust accuracy lies between the two. ``ibp-certified-accuracy`` is the ``ibp`` case.
  With ``attack_first`` (the default) the verifier runs only on the samples the attack did
  not break: a sample the attack breaks (or that is misclassified) has a replayed
  counterexample, so no sound verifier certifies it; it is stored ``falsified`` (attack
  key ``attack_first``) and costs the verifier nothing, as in alpha-beta-CROWN and the
  SoK's pipeline. With ``attack_first: false`` the verifier runs on every sample and a
  certificate on a broken one fails the run as a soundness bug.
* ``average-certified-radius``: per sample, the largest radius in [0, 0.5] the verifier
  certifies, found by binary search to 0.01 (as the SoK of Li et al.), averaged; 0 for a
  sample not certified at radius 0 (misclassified). Stored with the average radius of the
  smallest counterexample a box-PGD finds by the same search (an upper bound).

Per-sample verdicts, margins and seconds go to the ``verification_samples`` table.

Registered metrics: ``certified-accuracy``, ``ibp-certified-accuracy``,
``average-certified-radius``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from typing import Any

import torch
from pydantic import Field, field_validator

from aisafety.config_base import PluginConfig
from aisafety.errors import AISafetyError, CapabilityError
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackSpec, Capability, Direction, MetricValue, SampleVerdict
from aisafety.verification.falsify import pgd_on_rows, replay
from aisafety.verification.graph import BoundGraph, build_graph
from aisafety.verification.margins import certified, ibp_margin_bounds
from aisafety.verification.property import Property, robustness_property
from aisafety.verification.registry import PluginRegistry, make_verifier, needs_registry
from aisafety.verification.result import Verdict, VerificationResult


def ibp_certified_mask(
    network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, batch_size: int = 500
) -> torch.Tensor:
    """True where IBP certifies ``network`` (normalisation included) at ``eps`` (float32)."""
    with torch.inference_mode():
        return torch.cat([
            certified(ibp_margin_bounds(network, xb, yb, eps), yb)
            for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True)
        ])  # fmt: skip


def predictor_graph(predictor: Any, metric: str) -> BoundGraph:
    """The bound graph of a predictor's PyTorch network (normalisation included)."""
    why_not = getattr(predictor, "unavailable", {}).get("bounds")
    if why_not:
        raise CapabilityError(
            f"metric {metric!r} needs a bound graph of model {predictor.name!r}; {why_not}"
        )
    network = getattr(predictor, "bound_network", None) or getattr(predictor, "network", None)
    if not isinstance(network, torch.nn.Module):
        raise CapabilityError(
            f"metric {metric!r} needs the model's PyTorch layers, but {predictor.name!r} "
            f"({type(predictor).__name__}) does not expose them; evaluate a zoo, PyTorch or "
            "ONNX model (gradients: true) without input defenses"
        )
    return build_graph(on_cpu(network), predictor.input_shape, predictor.name)


def on_cpu(network: torch.nn.Module) -> torch.nn.Module:
    """``network`` where it is on the CPU, else a CPU copy: the verifiers bound on the CPU, and
    ``Module.cpu()`` would move the predictor's own network away from its device (every later
    forward pass of a GPU run then failed with tensors on two devices)."""
    tensors = [*network.parameters(), *network.buffers()]
    if all(t.device.type == "cpu" for t in tensors):
        return network
    return copy.deepcopy(network).cpu()


def checked_graph(verifier: Any, predictor: Any, metric: str) -> BoundGraph:
    """The predictor's bound graph, after ``verifier`` confirmed it can bound every op: an
    unsupported op is an error naming the op and the model (called at the plan check)."""
    graph = predictor_graph(predictor, metric)
    verifier.check(graph)
    return graph


def attack_result(ctx: EvaluationContext, spec: AttackSpec, eps: float, registry: PluginRegistry):
    """The attack's result at ``eps``: the plan's (shared, computed once) if the plan runs
    this attack, else run here through the attack's public call."""
    try:
        return ctx.adversarial(spec, eps)
    except KeyError:  # not one of the plan's attacks
        attack = registry.create("attack", spec.name, spec.config)
        return attack(ctx.predictor, ctx.x, ctx.y, eps, clean_logits=ctx.clean_logits)


class CertifiedConfig(PluginConfig):
    eps: float = Field(default=0.1, ge=0, description="l-inf radius in [0, 1] pixel units")

    @field_validator("eps")
    @classmethod
    def _pixel_scale(cls, eps: float) -> float:
        """eps 2 meant 2/255: the box then covered every image and certified nothing, silently."""
        if eps > 1:
            raise ValueError(
                f"eps={eps:g} exceeds 1, the largest l-inf distance between two images in "
                f"[0, 1]; eps is in the [0, 1] pixel scale (on the 0-255 scale {eps:g} is "
                f"{eps / 255:.4g})"
            )
        return eps

    verifier: str = Field(default="crown", description="a name from `aisafety list verifiers`")
    verifier_config: dict[str, Any] = Field(default_factory=dict)
    attack: str = Field(default="pgd-linf", description="attack giving the upper bound")
    attack_config: dict[str, Any] = Field(default_factory=dict)
    attack_first: bool = Field(
        default=True,
        description="verify only the samples the attack did not break (the others: "
        "falsified); false: verify every sample and check each certificate against the attack",
    )


class VerifierMetric(CleanMetric):
    """What the certified metrics share: a verifier built from the registry by name, checked
    against the model before any work, and a resumable unit of its own per metric (a
    complete verifier can run for hours on one model)."""

    category = "certified"
    requires = Capability.GRADIENTS  # white-box: needs the weights, not only outputs
    own_unit = True
    # The registry passes itself (``registry=``): verifier and attack are built by name from
    # it. Importing the registry here would close the cycle certified -> plugins -> builtin.
    builds_from_registry = True

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        registry: PluginRegistry | None = None,
        **overrides: Any,
    ):
        super().__init__(config, **overrides)
        self.registry = needs_registry(registry, self.name)
        self.verifier = make_verifier(
            self.registry, self.config.verifier, self.config.verifier_config
        )

    def check_model(self, predictor: Any) -> None:
        checked_graph(self.verifier, predictor, self.name)


class CertifiedAccuracy(VerifierMetric):
    name = "certified-accuracy"
    description = "Fraction of samples a verifier proves robust in the l-inf eps-ball (lower bound)"
    direction = Direction.HIGHER
    unit = "fraction"
    Config = CertifiedConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        graph = checked_graph(self.verifier, ctx.predictor, self.name)
        eps = self.config.eps
        spec = AttackSpec(name=self.config.attack, config=self.config.attack_config, eps=(eps,))
        adversarial = attack_result(ctx, spec, eps, self.registry)
        broken = adversarial.adv_pred.cpu() != adversarial.y.cpu()
        checked = torch.nonzero(~broken if self.config.attack_first else torch.ones_like(broken))
        checked = checked.flatten()
        x, y = ctx.x.cpu(), ctx.y.cpu()
        result, refuted = self._verify(graph, ctx, x[checked], y[checked], eps)
        conflicts = int((result.certified & broken[checked]).sum())
        if conflicts:
            raise AISafetyError(
                f"verifier {self.verifier.name!r} certified {conflicts} sample(s) that "
                f"{spec.label} breaks at eps {eps:g}: a soundness bug, please report it"
            )
        samples = [
            SampleVerdict(sample_index=i, label=int(y[i]), verdict=Verdict.FALSIFIED.value,
                          margin=None, seconds=None,
                          attack={"attack_broken": True, "attack_first": True})
            for i in range(len(y))
        ]  # fmt: skip
        for row, i in enumerate(checked.tolist()):
            margin = float(result.margins[row])
            samples[i] = SampleVerdict(
                sample_index=i, label=int(y[i]), verdict=result.verdicts[row].value,
                margin=margin if math.isfinite(margin) else None,
                seconds=float(result.seconds[row]), attack={"attack_broken": bool(broken[i])},
            )  # fmt: skip
        counts = Counter(sample.verdict for sample in samples)
        n = len(y)
        robust = ~broken  # per sample, neither the attack nor a replayed falsification broke it
        robust[checked[refuted]] = False
        return [self.value(
            counts[Verdict.CERTIFIED.value] / n, n, eps=eps, verifier=self.verifier.name,
            falsified=counts[Verdict.FALSIFIED.value] / n,
            unknown=counts[Verdict.UNKNOWN.value] / n, timeout=counts[Verdict.TIMEOUT.value] / n,
            attack_first=self.config.attack_first, verified_samples=len(checked),
            upper_bound_attack=spec.label, attack_upper_bound=float(robust.double().mean()),
            attack_robust_accuracy=float(adversarial.robust_accuracy),
            seconds_per_sample=float(result.seconds.sum()) / n, verdicts=samples,
        )]  # fmt: skip

    def _verify(self, graph, ctx, x, y, eps: float) -> tuple[VerificationResult, torch.Tensor]:
        """The verifier's result on ``x`` and, per sample, whether it refuted it
        (``refuted``)."""
        if not len(y):  # the attack broke every sample
            empty = VerificationResult(self.verifier.name, [], torch.zeros(0), torch.zeros(0),
                                       torch.zeros(0, *x.shape[1:]))  # fmt: skip
            return empty, torch.zeros(0, dtype=torch.bool)
        prop = robustness_property(x, y, eps, ctx.predictor.num_classes)
        result = self.verifier.verify(graph, prop, ctx.predictor.logits)
        return result, refuted(result, prop, ctx.predictor.logits)


def refuted(result: VerificationResult, prop: Property, model) -> torch.Tensor:
    """(n,) True where the verdict is ``falsified`` and its counterexample replays through
    ``model`` (``falsify.replay``: in the box, the label not answered there): checked here,
    not taken on a verifier's word (a plugin's ``verify`` need not replay), as the upper
    bound counts it. Before session 21 the upper bound was the attack's alone, above what the
    verifiers' counterexamples showed (0.8 where they gave at most 0.75)."""
    falsified = torch.tensor([v is Verdict.FALSIFIED for v in result.verdicts], dtype=torch.bool)
    found = torch.zeros(len(prop), dtype=torch.bool)
    if falsified.any():
        found[falsified] = replay(model, prop[falsified], result.counterexamples[falsified])
    return found


class IBPCertifiedConfig(CertifiedConfig):
    verifier: str = Field(default="ibp", description="always 'ibp' for this metric")


class IBPCertifiedAccuracy(CertifiedAccuracy):
    name = "ibp-certified-accuracy"
    description = "certified-accuracy with the 'ibp' verifier (interval bound propagation)"
    Config = IBPCertifiedConfig


class RadiusConfig(PluginConfig):
    verifier: str = Field(default="crown", description="a name from `aisafety list verifiers`")
    verifier_config: dict[str, Any] = Field(default_factory=dict)
    max_radius: float = Field(default=0.5, gt=0, le=1)
    precision: float = Field(default=0.01, gt=0)
    attack_steps: int = Field(default=50, ge=1, description="box-PGD steps of the upper bound")


class AverageCertifiedRadius(VerifierMetric):
    name = "average-certified-radius"
    description = "Mean largest l-inf radius a verifier certifies per sample (binary search)"
    direction = Direction.HIGHER
    unit = "linf"
    Config = RadiusConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        graph = checked_graph(self.verifier, ctx.predictor, self.name)
        x, y = ctx.x.cpu(), ctx.y.cpu()
        classes = ctx.predictor.num_classes
        c = self.config

        def certifies(radius: torch.Tensor) -> torch.Tensor:
            prop = robustness_property(x, y, radius.view(-1, 1, 1, 1), classes)
            return self.verifier.verify(graph, prop, ctx.predictor.logits).certified

        def breaks(radius: torch.Tensor) -> torch.Tensor:
            prop = robustness_property(x, y, radius.view(-1, 1, 1, 1), classes)
            point = pgd_on_rows(ctx.predictor.logits, prop, c.attack_steps)
            return replay(ctx.predictor.logits, prop, point)

        certified_radius = bisect(certifies, len(y), c.max_radius, c.precision, proved_low=True)
        attack_radius = bisect(breaks, len(y), c.max_radius, c.precision, proved_low=False)
        samples = [
            SampleVerdict(sample_index=i, label=int(y[i]), verdict="radius",
                          margin=float(certified_radius[i]), seconds=None,
                          attack={"attack_radius": float(attack_radius[i])})
            for i in range(len(y))
        ]  # fmt: skip
        return [self.value(
            certified_radius.mean(), len(y), verifier=self.verifier.name,
            attack_upper_bound=float(attack_radius.mean()), verdicts=samples,
        )]  # fmt: skip


def bisect(test, n: int, top: float, precision: float, proved_low: bool) -> torch.Tensor:
    """Per sample: the largest radius where ``test`` holds (``proved_low``: certified radius,
    0 if not even at 0) or the smallest where it holds (an attack's radius, ``top`` if never)."""
    low, high = torch.zeros(n, dtype=torch.float64), torch.full((n,), top, dtype=torch.float64)
    at_top = test(high)
    at_zero = test(low)
    if proved_low:
        low = torch.where(at_top, high, low)
        settled = at_top | ~at_zero
    else:
        high = torch.where(at_zero, low, high)
        settled = at_zero | ~at_top
    while bool(((high - low) > precision).any()):
        mid = (low + high) / 2
        holds = test(mid)
        grow = holds if proved_low else ~holds
        low = torch.where(~settled & grow, mid, low)
        high = torch.where(~settled & ~grow, mid, high)
        high = torch.where(settled, low if proved_low else high, high)
        low = torch.where(settled, high if not proved_low else low, low)
    return low if proved_low else high
