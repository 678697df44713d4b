"""pluggy hook specifications: what a plugin can add to the platform.

Each hook returns a list of classes. The built-ins (``aisafety.builtin``) answer the same
hooks as any third-party plugin found through the ``aisafety`` entry-point group.
"""

from __future__ import annotations

import pluggy

PROJECT = "aisafety"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def aisafety_attacks() -> list[type]:
    """Return ``aisafety.attack.base.Attack`` subclasses."""


@hookspec
def aisafety_defenses() -> list[type]:
    """Return ``aisafety.defense.base.InputDefense`` subclasses."""


@hookspec
def aisafety_training_defenses() -> list[type]:
    """Return ``aisafety.defense.training.base.TrainingDefense`` subclasses."""


@hookspec
def aisafety_metrics() -> list[type]:
    """Return ``aisafety.evaluation.base.Metric`` subclasses."""


@hookspec
def aisafety_datasets() -> list[type]:
    """Return ``aisafety.database.datasets.base.DatasetSource`` subclasses."""


@hookspec
def aisafety_verifiers() -> list[type]:
    """Return ``aisafety.verification.base.Verifier`` subclasses."""


@hookspec
def aisafety_report_sections() -> list[type]:
    """Return ``aisafety.report.sections.ReportSection`` subclasses (sections of the HTML
    report, placed by their ``order``)."""
