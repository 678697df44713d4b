"""The hooks: each specified in full, listed once in docs/plugins.md, and each answered.

As datasette's ``test_plugin_hooks_are_documented``: the headings of docs/plugins.md's hook
list are the hooks of ``aisafety/hookspecs.py``, in order, each with the base class and the
version its docstring gives. Then, per hook, a plugin answering it registers its class (or
record), and a class of the wrong base (or anything but the hook's record) is skipped as a
failure naming the plugin and the hook.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from pathlib import Path

import pytest

from aisafety import hookspecs
from aisafety.plugin import ModelEntry, ModelSpec, hookimpl
from aisafety.plugins import KINDS, RECORDS, build_registry, default_registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
KIND_OF = {hook: kind for kind, hook in KINDS.items()}
KINDS_RECORDS = RECORDS


def documented_hooks() -> dict[str, str]:
    """Hook name -> its section of docs/plugins.md."""
    text = DOC.read_text().split("## The hooks", 1)[1]
    parts = re.split(r"^### `(\w+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def since(hook: str) -> str:
    found = re.search(r"^\s*Since: (\S+)$", inspect.getdoc(getattr(hookspecs, hook)), re.M)
    assert found, f"{hook}'s docstring says since which version: 'Since: X.Y.Z'"
    return found.group(1)


def test_every_hook_is_documented_once_in_order():
    assert list(documented_hooks()) == hookspecs.hook_names()


@pytest.mark.parametrize("hook", hookspecs.hook_names())
def test_hook_is_specified_in_full(hook):
    """Typed return, a docstring saying what, when, bad returns and since which version,
    and the docs agree on the base and the version."""
    spec = getattr(hookspecs, hook)
    bases, records = hookspecs.hook_bases(), hookspecs.hook_records()
    assert (hook in bases) != (hook in records), f"{hook}: list[type[Base]] or list[Record]"
    if hook in bases:
        answer, returned = bases[hook], f"list[type[{bases[hook].__name__}]]"
        assert typing.get_type_hints(spec)["return"] == list[type[answer]]
    else:
        answer, returned = records[hook], f"list[{records[hook].__name__}]"
        assert typing.get_type_hints(spec)["return"] == list[answer]
        assert KINDS_RECORDS[KIND_OF[hook]] is answer  # the registry checks the same type
    doc = inspect.getdoc(spec)
    assert "Called once" in doc and "Bad returns:" in doc and answer.__name__ in doc
    section = documented_hooks()[hook]
    assert f"`{returned}`" in section
    assert f"Since {since(hook)}." in section


def test_every_hook_is_a_registry_kind():
    assert sorted(KINDS.values()) == sorted(hookspecs.hook_names())


def _plugin(hook: str, classes: list[type]) -> types.ModuleType:
    module = types.ModuleType(f"hooktest_{hook}")

    def answer():
        return classes

    answer.__name__ = hook
    setattr(module, hook, hookimpl(answer))
    return module


def _answer(hook: str, name: str) -> object:
    """A valid answer of ``hook`` named ``name``: a subclass of a built-in of its kind, or a
    record."""
    kind = KIND_OF[hook]
    if hook == "aisafety_models":  # no built-in entry: a checkpoint of a zoo architecture
        spec = ModelSpec(source="checkpoint", architecture="mnist-cnn", path="net.pt")
        return ModelEntry(name, spec)
    builtin = default_registry().classes[kind]
    assert builtin, f"no built-in answers {hook}"
    first = builtin[sorted(builtin)[0]]
    if hook in hookspecs.hook_records():
        return dataclasses.replace(first, name=name)
    return type("Mine", (first,), {"name": name})


@pytest.mark.parametrize("hook", hookspecs.hook_names())
def test_a_plugin_answering_the_hook_is_registered(hook):
    """A subclass of a built-in of the hook's kind (a record for the record hooks), under a
    new name, is registered."""
    kind = KIND_OF[hook]
    mine = _answer(hook, f"hooktest-{kind}")
    registry = build_registry(extra_plugins=[("hooktest", _plugin(hook, [mine]))])
    assert registry.failures == []
    assert registry.get(kind, f"hooktest-{kind}") is mine
    info = [p for p in registry.plugins if p.name == "hooktest"]
    assert info and info[0].provides == {kind: [f"hooktest-{kind}"]}


@pytest.mark.parametrize("hook", sorted(hookspecs.hook_records()))
def test_a_record_hook_answering_something_else_is_skipped_and_named(hook):
    kind = KIND_OF[hook]
    stranger = type("Stranger", (), {"name": f"hooktest-{kind}"})
    registry = build_registry(extra_plugins=[("hooktest", _plugin(hook, [stranger]))])
    assert f"hooktest-{kind}" not in registry.classes[kind]
    errors = [f.error for f in registry.failures if f.name == "hooktest"]
    assert len(errors) == 1 and hook in errors[0] and "Stranger" in errors[0]


@pytest.mark.parametrize("hook", sorted(hookspecs.hook_bases()))
def test_a_class_of_the_wrong_base_is_skipped_and_named(hook):
    kind = KIND_OF[hook]
    stranger = type("Stranger", (), {"name": f"hooktest-{kind}"})
    nameless = type("Nameless", (hookspecs.hook_bases()[hook],), {})
    registry = build_registry(extra_plugins=[("hooktest", _plugin(hook, [stranger, nameless]))])
    assert f"hooktest-{kind}" not in registry.classes[kind]
    errors = [f.error for f in registry.failures if f.name == "hooktest"]
    assert len(errors) == 2, registry.failures
    assert hook in errors[0] and "Stranger" in errors[0]
    assert "without a 'name'" in errors[1] and "Nameless" in errors[1]
