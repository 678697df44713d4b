"""The built-in attacks, input and training defenses, metrics, datasets and architectures,
registered like any plugin."""

from __future__ import annotations

from aisafety.attack.apgd import (
    APGDCE,
    APGDCEL2,
    APGDDLR,
    APGDDLRL2,
    APGDT,
    APGDTL2,
    APGDMargin,
    APGDMarginL2,
)
from aisafety.attack.bim import BIM
from aisafety.attack.boundary import BoundaryAttack
from aisafety.attack.cw import CWL2
from aisafety.attack.deepfool import DeepFoolL2, DeepFoolLinf
from aisafety.attack.ensemble import (
    RandEnsemble,
    RandEnsembleL2,
    StandardEnsemble,
    StandardEnsembleL2,
)
from aisafety.attack.fab import FABT, FABTL2
from aisafety.attack.fgsm import FGSM
from aisafety.attack.mifgsm import MIFGSM
from aisafety.attack.nattack import NAttack
from aisafety.attack.pgd import PGDLinf
from aisafety.attack.pgd_l1 import PGDL1
from aisafety.attack.pgd_l2 import PGDL2
from aisafety.attack.random_noise import RandomNoise
from aisafety.attack.rfgsm import RFGSM
from aisafety.attack.spsa import SPSA
from aisafety.attack.square import SquareLinf
from aisafety.attack.square_l2 import SquareL2
from aisafety.attack.transfer import TransferAttack
from aisafety.database.architectures import builtin_architectures
from aisafety.database.datasets.cifar10 import Cifar10Dataset
from aisafety.database.datasets.embedded import EmbeddedCifar10, EmbeddedMnist
from aisafety.database.datasets.idx import FashionMnistDataset, MnistDataset
from aisafety.database.datasets.image_folder import ImageFolderDataset
from aisafety.database.datasets.labelled_files import LabelledFilesDataset
from aisafety.database.datasets.npz import NpzDataset
from aisafety.database.datasets.svhn import SvhnDataset
from aisafety.defense.bit_depth import BitDepthReduction
from aisafety.defense.jpeg import JpegCompression
from aisafety.defense.median_filter import MedianFilter
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.resize_pad import RandomResizePad
from aisafety.defense.spatial_smoothing import SpatialSmoothing
from aisafety.defense.training.catalog import TRAINING_DEFENSES
from aisafety.evaluation.metrics.accuracy import (
    AdversarialAccuracyBlackBox,
    AdversarialAccuracyWhiteBox,
    CleanAccuracy,
)
from aisafety.evaluation.metrics.adversarial_confidence import (
    AverageConfidenceAdversarialClass,
    AverageConfidenceTrueClass,
    NoiseToleranceEstimation,
)
from aisafety.evaluation.metrics.attack_success import AttackSuccessRate, RobustAccuracy
from aisafety.evaluation.metrics.boundary_distance import (
    EmpiricalBoundaryDistance,
    EmpiricalBoundaryDistance2,
)
from aisafety.evaluation.metrics.certified import (
    AverageCertifiedRadius,
    CertifiedAccuracy,
    IBPCertifiedAccuracy,
)
from aisafety.evaluation.metrics.corruption import (
    MeanCorruptionError,
    MeanFlipProbability,
    MeanFlipRate,
    RelativeMeanCorruptionError,
)
from aisafety.evaluation.metrics.defense_cost import (
    ClassificationAccuracyVariance,
    ClassificationConfidenceVariance,
    ClassificationOutputStability,
    ClassificationRectifyRatio,
    ClassificationSacrificeRatio,
)
from aisafety.evaluation.metrics.feature_separation import RobustnessDifferenceIndex, Roby
from aisafety.evaluation.metrics.gradient_health import ZeroGradientRate
from aisafety.evaluation.metrics.hypervolume import AdversarialHypervolume
from aisafety.evaluation.metrics.imperceptibility import (
    AverageLpDistortion,
    AverageStructuralSimilarity,
)
from aisafety.evaluation.metrics.neuron import NeuronSensitivity, NeuronUncertainty
from aisafety.evaluation.metrics.neuron_coverage import (
    KMultisectionNeuronCoverage,
    NeuronBoundaryCoverage,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from aisafety.evaluation.metrics.noise_insensitivity import EmpiricalNoiseInsensitivity
from aisafety.evaluation.metrics.perturbation_sensitivity import PerturbationSensitivityDistance
from aisafety.evaluation.metrics.smoothed import (
    SmoothedAbstentionRate,
    SmoothedAverageCertifiedRadius,
    SmoothedCertifiedAccuracy,
)
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import Architecture
from aisafety.verification.bab import BabVerifier
from aisafety.verification.complete import CompleteVerifier
from aisafety.verification.deeppoly import DeepPolyVerifier
from aisafety.verification.dual_network import DualNetworkVerifier
from aisafety.verification.incomplete import INCOMPLETE
from aisafety.verification.krelu import KReluVerifier
from aisafety.verification.lipschitz import FastLipVerifier, OpNormVerifier
from aisafety.verification.lmi import LmiVerifier
from aisafety.verification.lp_full import LPFullVerifier
from aisafety.verification.recurjac import RecurJacVerifier
from aisafety.verification.refine_zono import RefineZonoVerifier
from aisafety.verification.sdp import SdpVerifier
from aisafety.verification.zonotope import DeepZVerifier


@hookimpl
def aisafety_attacks() -> list[type]:
    return [
        FGSM,
        RandomNoise,
        RFGSM,
        BIM,
        PGDLinf,
        PGDL2,
        PGDL1,
        MIFGSM,
        CWL2,
        DeepFoolL2,
        DeepFoolLinf,
        APGDCE,
        APGDDLR,
        APGDMargin,
        APGDCEL2,
        APGDDLRL2,
        APGDMarginL2,
        APGDT,
        APGDTL2,
        FABT,
        FABTL2,
        SquareLinf,
        SquareL2,
        SPSA,
        NAttack,
        BoundaryAttack,
        TransferAttack,
        StandardEnsemble,
        StandardEnsembleL2,
        RandEnsemble,
        RandEnsembleL2,
    ]


@hookimpl
def aisafety_defenses() -> list[type]:
    return [
        BitDepthReduction,
        MedianFilter,
        SpatialSmoothing,
        JpegCompression,
        RandomResizePad,
        RandomizedSmoothing,
    ]


@hookimpl
def aisafety_training_defenses() -> list[type]:
    return TRAINING_DEFENSES


@hookimpl
def aisafety_metrics() -> list[type]:
    return [
        CleanAccuracy,
        ZeroGradientRate,
        AdversarialAccuracyWhiteBox,
        AdversarialAccuracyBlackBox,
        AverageConfidenceAdversarialClass,
        AverageConfidenceTrueClass,
        NoiseToleranceEstimation,
        AverageLpDistortion,
        AverageStructuralSimilarity,
        RobustAccuracy,
        AttackSuccessRate,
        MeanCorruptionError,
        RelativeMeanCorruptionError,
        MeanFlipRate,
        MeanFlipProbability,
        ClassificationAccuracyVariance,
        ClassificationRectifyRatio,
        ClassificationSacrificeRatio,
        ClassificationConfidenceVariance,
        ClassificationOutputStability,
        EmpiricalBoundaryDistance,
        EmpiricalBoundaryDistance2,
        EmpiricalNoiseInsensitivity,
        PerturbationSensitivityDistance,
        KMultisectionNeuronCoverage,
        NeuronBoundaryCoverage,
        StrongNeuronActivationCoverage,
        TopKNeuronCoverage,
        NeuronSensitivity,
        NeuronUncertainty,
        IBPCertifiedAccuracy,
        CertifiedAccuracy,
        AverageCertifiedRadius,
        RobustnessDifferenceIndex,
        Roby,
        AdversarialHypervolume,
        SmoothedCertifiedAccuracy,
        SmoothedAverageCertifiedRadius,
        SmoothedAbstentionRate,
    ]


@hookimpl
def aisafety_datasets() -> list[type]:
    return [
        EmbeddedMnist,
        EmbeddedCifar10,
        MnistDataset,
        FashionMnistDataset,
        Cifar10Dataset,
        SvhnDataset,
        ImageFolderDataset,
        LabelledFilesDataset,
        NpzDataset,
    ]


@hookimpl
def aisafety_architectures() -> list[Architecture]:
    return builtin_architectures()


@hookimpl
def aisafety_verifiers() -> list[type]:
    return [
        *INCOMPLETE,
        DeepPolyVerifier,
        DualNetworkVerifier,
        DeepZVerifier,
        RefineZonoVerifier,
        LPFullVerifier,
        KReluVerifier,
        OpNormVerifier,
        FastLipVerifier,
        RecurJacVerifier,
        SdpVerifier,
        LmiVerifier,
        CompleteVerifier,
        BabVerifier,
    ]


@hookimpl
def aisafety_report_sections() -> list[type]:
    from aisafety.report.builtin_sections import builtin_sections

    return builtin_sections()
