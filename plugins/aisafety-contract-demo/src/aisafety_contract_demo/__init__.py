"""A second aisafety plugin: an attack, a metric, a verifier and an architecture, one file each."""

from __future__ import annotations

from aisafety_contract_demo.adversarial_margin import AdversarialMargin
from aisafety_contract_demo.fgm_l2 import FGML2
from aisafety_contract_demo.lenet_demo import LENET_DEMO
from aisafety_contract_demo.plain_ibp import PlainIBP

__all__ = ["FGML2", "LENET_DEMO", "AdversarialMargin", "PlainIBP"]
__version__ = "0.1.0"
