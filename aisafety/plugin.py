"""The one module extension authors import from: hooks, base classes and their types.

A plugin (an attack, defense, metric, dataset format, verifier, report section,
architecture or model entry) needs nothing from any other ``aisafety`` module::

    from aisafety.plugin import Attack, AttackCall, Norm, hookimpl

The platform's modules may move between versions; these names stay here.
``tests/test_plugin_api.py`` walks every hook's base class and the types its methods and
class attributes mention, and fails on any that is missing from this module.
"""

from __future__ import annotations

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.result import AttackResult
from aisafety.attack.streams import SampleStreams
from aisafety.attack.threat import ThreatModel
from aisafety.config_base import PluginConfig
from aisafety.database.datasets.base import DatasetSource, LoadedDataset
from aisafety.defense.base import InputDefense, InputDefenseConfig, RandomDefenseConfig
from aisafety.defense.training.base import FitFunction, TrainingDefense, TrainingStep
from aisafety.errors import (
    AISafetyError,
    AISafetyWarning,
    CapabilityError,
    ConfigError,
    GradientMaskingWarning,
    InputError,
    IntegrityError,
    ModelOutputError,
    PluginError,
    StoreError,
    UnknownNameError,
)
from aisafety.evaluation.base import AttackMetric, CleanMetric, Metric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.corrupted import SequencePredictions
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import (
    Architecture,
    AttackFamily,
    AttackSpec,
    Capability,
    CorruptionsSpec,
    Direction,
    MetricValue,
    ModelEntry,
    ModelSpec,
    Norm,
    Precision,
    SampleVerdict,
    SmoothingCertificates,
)
from aisafety.prediction.base import Predictor
from aisafety.report.data import (
    AttackRunRow,
    Example,
    MemberRow,
    MetricRow,
    RunData,
    UnitRow,
    WarningRow,
)
from aisafety.report.sections import ReportSection, ReportView
from aisafety.verification.base import Verifier, VerifierConfig
from aisafety.verification.deadline import Deadline
from aisafety.verification.falsify import Model
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Op
from aisafety.verification.property import Property
from aisafety.verification.result import Verdict, VerificationResult

__all__ = [
    # hooks
    "hookimpl",
    # attacks
    "Attack",
    "AttackCall",
    "AttackConfig",
    "AttackResult",
    "SampleStreams",
    "ThreatModel",
    # defenses
    "FitFunction",
    "InputDefense",
    "InputDefenseConfig",
    "RandomDefenseConfig",
    "TrainingDefense",
    "TrainingStep",
    # metrics
    "AttackMetric",
    "CleanMetric",
    "EvaluationContext",
    "Metric",
    "MetricValue",
    "SampleVerdict",
    "SequencePredictions",
    "SmoothingCertificates",
    # verifiers
    "BoundGraph",
    "Deadline",
    "Model",
    "Op",
    "Property",
    "Verdict",
    "VerificationResult",
    "Verifier",
    "VerifierConfig",
    # datasets and models
    "Architecture",
    "DatasetSource",
    "LoadedDataset",
    "ModelEntry",
    "ModelSpec",
    "Predictor",
    # report sections
    "AttackRunRow",
    "Example",
    "MemberRow",
    "MetricRow",
    "ReportSection",
    "ReportView",
    "RunData",
    "UnitRow",
    "WarningRow",
    # configuration, specs and enums
    "AttackFamily",
    "AttackSpec",
    "Capability",
    "CorruptionsSpec",
    "Direction",
    "Norm",
    "PluginConfig",
    "Precision",
    # errors and warnings
    "AISafetyError",
    "AISafetyWarning",
    "CapabilityError",
    "ConfigError",
    "GradientMaskingWarning",
    "InputError",
    "IntegrityError",
    "ModelOutputError",
    "PluginError",
    "StoreError",
    "UnknownNameError",
]
