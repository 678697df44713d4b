"""A budget the plan did not give. An attack without ``eps`` (and a metric with an ``eps``
setting, ``certified-accuracy``'s, left out) runs at 0.1: a budget of MNIST's scale, where
0.1-0.3 are the usual l-inf budgets. On any other data that is far larger than meant (on
CIFAR-10, 25.5/255 against the usual 8/255) and the robust accuracy it gives is not the
one a reader expects, so the run says so: a warning that names the default used, what it is
on 0..255 pixels and the dataset, shown once and stored with the run. The default itself is
kept: every stored number of a plan that gives its budgets, or runs on MNIST, is unchanged
(docs/configuration.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from aisafety.errors import AISafetyWarning
from aisafety.interfaces import EvaluationPlan, MetricSpec

# the datasets whose images 0.1 was chosen for (28 x 28 grey, l-inf 0.1-0.3 in the papers)
MNIST_SCALE = frozenset({"mnist", "mnist-embedded", "fashion-mnist"})
CIFAR_LINF = 8 / 255  # the usual l-inf budget of 32 x 32 colour images, named as an example


def warn_default_budgets(plan: EvaluationPlan, metrics: Iterable[object]) -> None:
    """One warning per attack or metric of ``plan`` that runs at a default budget on data
    that is not MNIST's; ``metrics`` are the plan's built metrics, in its order."""
    if plan.dataset.name in MNIST_SCALE:
        return
    for spec in plan.attacks:
        if "eps" not in spec.model_fields_set:
            _warn(f"attack {spec.name!r}", spec.eps[0], plan.dataset.name, f"eps: {CIFAR_LINF!r}")
    for spec, metric in zip(plan.metrics, metrics, strict=True):
        default = _metric_default(spec, metric)
        if default is not None:
            _warn(
                f"metric {spec.name!r}", default, plan.dataset.name,
                f"config: {{eps: {CIFAR_LINF!r}}}",
            )  # fmt: skip


def _metric_default(spec: MetricSpec, metric: object) -> float | None:
    """The ``eps`` a metric runs at when its config has the setting and the plan left it out."""
    config = getattr(metric, "config", None)
    eps = getattr(config, "eps", None)
    if "eps" in spec.config or not isinstance(eps, float):
        return None
    return eps


def _warn(what: str, eps: float, dataset: str, fix: str) -> None:
    warnings.warn(
        f"{what} gives no eps and runs at the default {eps:g} ({eps * 255:g}/255 of the "
        f"[0, 1] pixel range), a budget of MNIST's scale, on dataset {dataset!r}; give the "
        f"budget meant, e.g. {fix} for CIFAR-10's usual l-inf 8/255 (ImageNet's: 4/255 = "
        "0.01569; docs/configuration.md)",
        AISafetyWarning,
        stacklevel=4,
    )
