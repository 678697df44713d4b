"""pluggy hook specifications: what a plugin can add to the platform.

Each hook returns a list of classes. The built-ins (``aisafety.builtin``) answer the same
hooks as any third-party plugin found through the ``aisafety`` entry-point group.
"""

from __future__ import annotations

import pluggy

from aisafety.interfaces import Architecture, ModelEntry

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


@hookspec
def aisafety_architectures() -> list[Architecture]:
    """Return ``aisafety.interfaces.Architecture`` records: networks a plan names with
    ``architecture: NAME`` to load a state dict (``source: checkpoint``), so a package of a
    lab's architectures is one ``pip install`` away.

    Called once per process, when the registry is built (the first plan, ``aisafety list``,
    ``aisafety plugins``); the factories run only when a plan loads a model. A record that is
    not an ``Architecture`` (or whose fields are invalid: ``Architecture`` checks them) or a
    name already registered is reported by ``aisafety plugins`` and skipped, and the other
    plugins still load. The zoo's own architectures answer this hook too (``aisafety.builtin``).
    Since 0.2.0 (added after the 0.1.0 release).
    """


@hookspec
def aisafety_models() -> list[ModelEntry]:
    """Return ``aisafety.interfaces.ModelEntry`` records: named, ready-to-evaluate models
    (``model: {name: NAME}`` in a plan, as a zoo model is), each with the ``ModelSpec`` that
    loads it (e.g. a ``checkpoint`` of one of the plugin's architectures).

    Called once per process, when the registry is built; the spec is loaded only when a plan
    names the entry. A record that is not a ``ModelEntry`` or a name already registered is
    reported by ``aisafety plugins`` and skipped; a zoo model of the same name wins over an
    entry (the zoo is checked first). Since 0.2.
    """
