"""A second aisafety plugin: an attack, a metric and a verifier, one file each."""

from __future__ import annotations

from aisafety_contract_demo.adversarial_margin import AdversarialMargin
from aisafety_contract_demo.fgm_l2 import FGML2
from aisafety_contract_demo.plain_ibp import PlainIBP

__all__ = ["FGML2", "AdversarialMargin", "PlainIBP"]
__version__ = "0.1.0"
