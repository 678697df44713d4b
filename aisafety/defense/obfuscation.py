"""Warn before an evaluation that would report robustness a defense does not have.

A gradient attack on a defense whose transform is not differentiable (bit-depth rounding,
JPEG, the votes of randomized smoothing) follows PyTorch's gradient of that transform: zero
or meaningless, so the attack fails and the robust accuracy it reports is an upper bound that
can be as high as the clean accuracy (Athalye, Carlini & Wagner 2018, "obfuscated
gradients"). The adaptive attack passes the gradient of a differentiable surrogate instead
(``bpda: true``). A random defense attacked with one draw per step is the same trap for
randomness (``eot_samples``). The run still goes ahead: measuring the non-adaptive attack is
legitimate as long as nobody reads it as robustness.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from aisafety.attack.base import Attack
from aisafety.defense.base import InputDefense
from aisafety.errors import GradientMaskingWarning
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor


def input_defenses(predictor: Predictor) -> list[InputDefense]:
    """The input defenses wrapped around a model, outermost first."""
    found = []
    while isinstance(predictor, InputDefense):
        found.append(predictor)
        predictor = predictor.inner
    return found


def obfuscation_warnings(predictor: Predictor, attacks: Iterable[Attack]) -> list[str]:
    gradient = sorted({a.name for a in attacks if a.requires is Capability.GRADIENTS})
    if not gradient:
        return []
    names = ", ".join(gradient)
    messages = []
    for defense in input_defenses(predictor):
        kind, config = type(defense).name, defense.config
        if not defense.differentiable and not getattr(config, "bpda", False):
            messages.append(
                f"defense {kind!r} is not differentiable and its bpda is off: the gradient "
                f"attacks ({names}) follow its zero or meaningless gradient, so their robust "
                "accuracy can be far too high (obfuscated gradients, Athalye et al. 2018). "
                f"For an adaptive evaluation set bpda: true in its config "
                f"({{name: {kind}, config: {{bpda: true}}}}), or add a score-based attack "
                "(square-linf); docs/defenses.md"
            )
        if hasattr(config, "seed") and getattr(config, "eot_samples", 1) == 1:
            messages.append(
                f"defense {kind!r} is random and its eot_samples is 1: the gradient attacks "
                f"({names}) follow one random draw per step, so their robust accuracy can be "
                "too high. For an adaptive evaluation set eot_samples (e.g. 8) in its config "
                "(Expectation over Transformation); docs/defenses.md"
            )
    return messages


def warn_obfuscation(predictor: Predictor, attacks: Iterable[Attack]) -> None:
    for message in obfuscation_warnings(predictor, attacks):
        warnings.warn(message, GradientMaskingWarning, stacklevel=3)
