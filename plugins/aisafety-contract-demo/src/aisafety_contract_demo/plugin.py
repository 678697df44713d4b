"""The entry-point module: the hooks this plugin answers, from ``aisafety.plugin`` only."""

from __future__ import annotations

from aisafety.plugin import Architecture, Attack, Metric, Verifier, hookimpl
from aisafety_contract_demo.adversarial_margin import AdversarialMargin
from aisafety_contract_demo.fgm_l2 import FGML2
from aisafety_contract_demo.lenet_demo import LENET_DEMO
from aisafety_contract_demo.plain_ibp import PlainIBP


@hookimpl
def aisafety_attacks() -> list[type[Attack]]:
    return [FGML2]


@hookimpl
def aisafety_metrics() -> list[type[Metric]]:
    return [AdversarialMargin]


@hookimpl
def aisafety_verifiers() -> list[type[Verifier]]:
    return [PlainIBP]


@hookimpl
def aisafety_architectures() -> list[Architecture]:
    return [LENET_DEMO]
