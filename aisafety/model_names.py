"""The names a plan's models are stored and reported under, when the plan gives none.

A user's file or factory without a ``name`` is named after it (``/tmp/m.pt``: ``m``). Two
different files of one stem in one plan (``runs/a/model.pt`` as the model, ``runs/b/model.pt``
as its reference) would then share a name that the stored run, the warnings, the report and
every comparison show: the derived names that clash take the shortest parent-folder suffix
that tells them apart (``a/model``, ``b/model``), read from the path alone (a relative one
from the working directory), so a resumed run derives the same names. Names the user gave
are never changed: two different models given one name are refused (docs/own-model.md,
"Names").
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

OWN_SOURCES = ("checkpoint", "python", "export", "torchscript", "onnx")


def name_forms(source: Any, path: Any, factory: Any) -> list[str]:
    """The names a user's model may take, shortest first: its file's stem, then with one
    parent folder more each (``model``, ``a/model``, ``runs/a/model``; the folders of the
    absolute path); else a ``python`` factory's callable, then with its modules
    (``Net``, ``v1:Net``, ``nets.v1:Net``). Empty for the zoo and for the sources whose
    name is required (it says what to load)."""
    if source not in OWN_SOURCES:
        return []
    if isinstance(path, str | Path) and str(path):
        return _file_forms(str(path))
    if source == "python" and isinstance(factory, str) and ":" in factory:
        module, _, attribute = factory.partition(":")
        if not attribute:
            return []
        modules = module.split(".")
        suffixes = (".".join(modules[-k:]) for k in range(1, len(modules) + 1))
        return [attribute, *(f"{suffix}:{attribute}" for suffix in suffixes)]
    return []


def _file_forms(path: str) -> list[str]:
    file = Path(path)
    stem = file.stem or file.name or path
    folders = PurePath(os.path.abspath(path)).parent.parts[1:]  # without the root
    return [stem, *("/".join((*folders[-k:], stem)) for k in range(1, len(folders) + 1))]


def own_model_name(source: Any, path: Any, factory: Any) -> str | None:
    """The name of a user's model that a plan does not name: its file's stem (a state dict's,
    when a ``python`` factory loads one: the weights tell checkpoints of one network apart),
    else the callable a ``python`` factory names ("mynets:ResNet18": "ResNet18"); None for
    the zoo, and for sources whose name is required."""
    forms = name_forms(source, path, factory)
    return forms[0] if forms else None


@dataclass(frozen=True)
class NamedEntry:
    """One model of a plan: where it is (``model``, ``reference_model``), its name, the
    longer names it may take when that name was derived (``name_forms``; empty when the
    user gave it), what it loads (its settings as JSON: equal for the same model) and how
    to say so."""

    field: str
    name: str
    forms: Sequence[str]
    identity: str
    shown: str

    @property
    def derived(self) -> bool:
        return bool(self.forms)

    def form(self, depth: int) -> str:
        return self.forms[min(depth, len(self.forms) - 1)] if self.forms else self.name


def distinct_names(entries: Sequence[NamedEntry]) -> list[str]:
    """The entries' names, each derived name that another model's name clashes with
    lengthened to the shortest parent-folder suffix that tells the clashing ones apart.
    One name for the same model (a defended model's undefended self as its reference) is
    kept. ValueError, naming both entries and the fix, for two different models given one
    name, or derived names no suffix tells apart."""
    for first, second in clashes(entries):
        if not (first.derived or second.derived):
            raise ValueError(_given_twice(first, second))
    given = {e.name for e in entries if not e.derived}
    names = [e.name for e in entries]
    for base in dict.fromkeys(e.name for e in entries if e.derived):
        sharing = [i for i, e in enumerate(entries) if e.name == base]
        if len({entries[i].identity for i in sharing}) < 2:
            continue  # one model under one name
        derived = [i for i in sharing if entries[i].derived]
        depth = _apart_at([entries[i] for i in derived], given)
        if depth is None:
            raise ValueError(_no_suffix([entries[i] for i in sharing]))
        for i in derived:
            names[i] = entries[i].form(depth)
    final = [replace(e, name=name) for e, name in zip(entries, names, strict=True)]
    for first, second in clashes(final):  # a suffix that meets another derived name
        raise ValueError(_no_suffix([first, second]))
    return names


def clashes(entries: Sequence[NamedEntry]) -> list[tuple[NamedEntry, NamedEntry]]:
    """The pairs of different models under one name."""
    return [(a, b) for a, b in _pairs(entries) if a.name == b.name and a.identity != b.identity]


def _pairs(entries: Sequence[NamedEntry]) -> list[tuple[NamedEntry, NamedEntry]]:
    return [(a, b) for i, a in enumerate(entries) for b in entries[i + 1 :]]


def _apart_at(clashing: list[NamedEntry], given: set[str]) -> int | None:
    """The smallest depth (1: one parent folder) whose forms of different models differ,
    and none is a name the user gave; None where no depth does."""
    deepest = max(len(e.forms) for e in clashing)
    for depth in range(1, deepest):
        forms = {e.identity: e.form(depth) for e in clashing}
        if len(set(forms.values())) == len(forms) and not given & set(forms.values()):
            return depth
    return None


def _given_twice(first: NamedEntry, second: NamedEntry) -> str:
    return (
        f"{first.field} and {second.field} are both named {first.name!r} but are different "
        f"models ({_listed([first, second])}): the stored run, the report and comparisons "
        "could not tell them apart; give one of them another name (one name is for one "
        "model, e.g. a defended model's undefended self as its reference)"
    )


def _no_suffix(sharing: list[NamedEntry]) -> str:
    unnamed = " or ".join(e.field for e in sharing if e.derived) or sharing[-1].field
    return (
        f"{' and '.join(e.field for e in sharing)} are different models that would share "
        f"the name {sharing[0].name!r} ({_listed(sharing)}), and no parent folder (or "
        f"module) tells them apart: give {unnamed} a name of its own (name: ...)"
    )


def _listed(entries: list[NamedEntry]) -> str:
    """What each entry loads; where that reads the same, the settings they differ in."""
    listed = "; ".join(f"{e.field}: {e.shown}" for e in entries)
    if len({e.shown for e in entries}) > 1:
        return listed
    settings = [json.loads(e.identity) for e in entries]
    keys = sorted({k for s in settings for k in s if any(s.get(k) != t.get(k) for t in settings)})
    return f"{listed}; they differ in {', '.join(keys)}"
