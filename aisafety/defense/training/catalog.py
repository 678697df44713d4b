"""Every built-in training defense, in the order ``aisafety list defenses`` shows them."""

from __future__ import annotations

from aisafety.defense.training.adre import Adre
from aisafety.defense.training.deep_defense import DeepDefense
from aisafety.defense.training.distillation import DefensiveDistillation
from aisafety.defense.training.ensemble_at import EnsembleAdversarialTraining
from aisafety.defense.training.fgsm_at import FGSMAdversarialTraining
from aisafety.defense.training.gaussian_augmentation import GaussianAugmentation
from aisafety.defense.training.hgd import HighLevelGuidedDenoiser
from aisafety.defense.training.hypervolume import HypervolumeTraining
from aisafety.defense.training.ibp import CrownIBPTraining, IBPTraining
from aisafety.defense.training.macer import Macer
from aisafety.defense.training.noise_augmentation import LaplaceAugmentation, UniformAugmentation
from aisafety.defense.training.parseval import ParsevalTraining
from aisafety.defense.training.pgd_at import PGDAdversarialTraining
from aisafety.defense.training.sat import StandardAdversarialTraining
from aisafety.defense.training.smoothadv import SmoothAdv
from aisafety.defense.training.standard import StandardTraining
from aisafety.defense.training.thermometer import ThermometerTraining
from aisafety.defense.training.trades import Trades

TRAINING_DEFENSES: list[type] = [
    StandardTraining,
    PGDAdversarialTraining,
    FGSMAdversarialTraining,
    StandardAdversarialTraining,
    Trades,
    DefensiveDistillation,
    GaussianAugmentation,
    LaplaceAugmentation,
    UniformAugmentation,
    Macer,
    SmoothAdv,
    Adre,
    IBPTraining,
    CrownIBPTraining,
    HypervolumeTraining,
    ParsevalTraining,
    EnsembleAdversarialTraining,
    DeepDefense,
    ThermometerTraining,
    HighLevelGuidedDenoiser,
]
