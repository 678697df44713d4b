"""pluggy hook specifications: what a plugin can add to the platform.

A plugin is a module named in the ``aisafety`` entry-point group; it defines some of these
functions, decorated with ``aisafety.plugin.hookimpl``, under exactly these names (a
misspelt hook makes the whole plugin fail to load). The built-ins (``aisafety.builtin``)
answer the same hooks, first, and every installed plugin after them.

Each hook takes no argument and returns a list: of classes (never instances) for the plugin
kinds, of records for ``aisafety_architectures`` and ``aisafety_models``. The registry
(``aisafety.plugins``) calls every hook once per process, when it is first needed (the first
command that builds a plan, lists names or renders a report). What it does with a bad
answer is the same for every hook: a hook that raises, a misspelt hook or a module that
fails to import makes that plugin fail as a whole; a returned class that does not subclass
the hook's base, has no ``name``, or takes a name another plugin registered first is
skipped. Each of these is recorded as a failure naming the plugin: ``aisafety plugins``
prints it and the commands that run plans warn about it; the other plugins still load.

The base each hook takes is read from its return annotation (``hook_bases``), so the
registry's check and this documentation cannot disagree. Every name a plugin needs is
exported by ``aisafety.plugin``.
"""

from __future__ import annotations

import typing
from functools import cache

import pluggy

from aisafety.attack.base import Attack
from aisafety.database.datasets.base import DatasetSource
from aisafety.defense.base import InputDefense
from aisafety.defense.training.base import TrainingDefense
from aisafety.evaluation.base import Metric
from aisafety.interfaces import Architecture, ModelEntry
from aisafety.report.sections import ReportSection
from aisafety.verification.base import Verifier

PROJECT = "aisafety"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def aisafety_attacks() -> list[type[Attack]]:
    """Adversarial attacks: ``Attack`` subclasses, each implementing ``perturb``.

    Called once when the registry is built; each class is registered under its ``name`` as
    an attack that a plan's ``attacks:`` and the attack metrics can run. The
    base class owns the checks (inputs, budget projection, the final re-evaluation), so an
    attack cannot report a success that is over budget.

    Bad returns: a class that is not an ``Attack`` subclass, or has no ``name``, or a name
    already taken, is skipped and recorded as a failure of this plugin.

    Since: 0.1.0
    """


@hookspec
def aisafety_defenses() -> list[type[InputDefense]]:
    """Input defenses: ``InputDefense`` subclasses, predictors that wrap the model.

    Called once when the registry is built; each class is registered under its ``name`` for
    a plan's ``defenses:``. Input and training defenses share one namespace.

    Bad returns: a ``TrainingDefense`` is skipped with a failure naming
    ``aisafety_training_defenses``; any other class that is not an ``InputDefense``, has no
    ``name``, or takes a name already taken, is skipped and recorded as a failure.

    Since: 0.1.0
    """


@hookspec
def aisafety_training_defenses() -> list[type[TrainingDefense]]:
    """Training defenses: ``TrainingDefense`` subclasses, each a loss per batch.

    Called once when the registry is built; each class is registered under its ``name`` for
    ``aisafety zoo train --defense``. A plan naming one under ``defenses:`` is told how to
    train it instead.

    Bad returns: an input defense is skipped with a failure naming ``aisafety_defenses``;
    any other class that is not a ``TrainingDefense``, has no ``name``, or takes a name
    already taken, is skipped and recorded as a failure.

    Since: 0.1.0
    """


@hookspec
def aisafety_metrics() -> list[type[Metric]]:
    """Metrics: ``CleanMetric`` (once per run) or ``AttackMetric`` (once per attack and
    budget) subclasses, each implementing ``compute``.

    Called once when the registry is built; each class is registered under its ``name`` for
    a plan's ``metrics:``.

    Bad returns: a class that is not a ``Metric`` subclass, or has no ``name``, or a name
    already taken, is skipped and recorded as a failure of this plugin.

    Since: 0.1.0
    """


@hookspec
def aisafety_datasets() -> list[type[DatasetSource]]:
    """Dataset formats: ``DatasetSource`` subclasses, each implementing ``load``.

    Called once when the registry is built; each class is registered under its ``name`` for
    a plan's ``dataset: {name: ...}``.

    Bad returns: a class that is not a ``DatasetSource`` subclass, or has no ``name``, or a
    name already taken, is skipped and recorded as a failure of this plugin.

    Since: 0.1.0
    """


@hookspec
def aisafety_verifiers() -> list[type[Verifier]]:
    """Verifiers: ``Verifier`` subclasses, each implementing ``lower_bounds``.

    Called once when the registry is built; each class is registered under its ``name`` for
    the certified metrics' ``verifier:`` option and ``aisafety verify``. The base class turns
    bounds into verdicts and replays every counterexample through the model.

    Bad returns: a class that is not a ``Verifier`` subclass, or has no ``name``, or a name
    already taken, is skipped and recorded as a failure of this plugin.

    Since: 0.1.0
    """


@hookspec
def aisafety_report_sections() -> list[type[ReportSection]]:
    """Sections of the HTML report: ``ReportSection`` subclasses, placed by their ``order``.

    Called once when the registry is built; ``aisafety report`` renders every registered
    section; one that raises while rendering is shown as failed and the page is still
    written.

    Bad returns: a class that is not a ``ReportSection`` subclass, or has no ``name``, or a
    name already taken, is skipped and recorded as a failure of this plugin.

    Since: 0.1.0
    """


@hookspec
def aisafety_architectures() -> list[Architecture]:
    """Networks a plan names with ``architecture: NAME`` to load a state dict (``source:
    checkpoint``): ``Architecture`` records (not classes), so a package of a lab's
    architectures is one ``pip install`` away. The zoo's own architectures answer it too.

    Called once when the registry is built (the first plan, ``aisafety list``, ``aisafety
    plugins``); the factories run only when a plan loads a model.

    Bad returns: anything that is not an ``Architecture`` record, or a name already taken, is
    skipped and recorded as a failure of this plugin; a record with invalid fields raises in
    the hook (``Architecture`` checks them), so the plugin fails as a whole.

    Since: 0.2.0
    """


@hookspec
def aisafety_models() -> list[ModelEntry]:
    """Named, ready-to-evaluate models (``model: {name: NAME}`` in a plan, as a zoo model is):
    ``ModelEntry`` records, each with the ``ModelSpec`` that loads it (e.g. a ``checkpoint``
    of one of the plugin's architectures).

    Called once when the registry is built; the spec is loaded only when a plan names the
    entry, and a zoo model of the same name wins (the zoo is checked first).

    Bad returns: anything that is not a ``ModelEntry`` record, or a name already taken, is
    skipped and recorded as a failure of this plugin.

    Since: 0.2.0
    """


def hook_names() -> list[str]:
    """Every hook of this module, in the order they are declared."""
    return [name for name, value in globals().items() if _is_hookspec(value)]


def _is_hookspec(value: object) -> bool:
    return callable(value) and hasattr(value, f"{PROJECT}_spec")


@cache
def hook_bases() -> dict[str, type]:
    """Hook name -> the base class its returned classes must subclass, read from the
    ``list[type[Base]]`` return annotation; a hook annotated otherwise has no entry (and
    fails ``tests/test_hooks.py``) rather than breaking the registry."""
    bases = {}
    for name in hook_names():
        returned = typing.get_type_hints(globals()[name])["return"]
        of_type = typing.get_args(returned) if typing.get_origin(returned) is list else ()
        base = typing.get_args(of_type[0]) if len(of_type) == 1 else ()
        if typing.get_origin(of_type[0] if of_type else None) is type and len(base) == 1:
            bases[name] = base[0]
    return bases


@cache
def hook_records() -> dict[str, type]:
    """Hook name -> the record type of the hooks that return instances (``list[Record]``),
    read from the return annotation."""
    records = {}
    for name in hook_names():
        returned = typing.get_type_hints(globals()[name])["return"]
        of = typing.get_args(returned) if typing.get_origin(returned) is list else ()
        if len(of) == 1 and isinstance(of[0], type):
            records[name] = of[0]
    return records
