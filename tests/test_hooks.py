"""The hooks: each specified in full, listed once in docs/plugins.md, and each answered.

As datasette's ``test_plugin_hooks_are_documented``: the headings of docs/plugins.md's hook
list are the hooks of ``aisafety/hookspecs.py``, in order, each with the base class and the
version its docstring gives. Then, per hook, a plugin answering it registers its class, and
a class of the wrong base is skipped as a failure naming the plugin and the hook.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path

import pytest

from aisafety import hookspecs
from aisafety.plugin import hookimpl
from aisafety.plugins import KINDS, build_registry, default_registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
KIND_OF = {hook: kind for kind, hook in KINDS.items()}


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
    assert hook in hookspecs.hook_bases(), f"{hook} must return list[type[Base]]"
    base = hookspecs.hook_bases()[hook]
    assert typing.get_type_hints(spec)["return"] == list[type[base]]
    doc = inspect.getdoc(spec)
    assert "Called once" in doc and "Bad returns:" in doc and base.__name__ in doc
    section = documented_hooks()[hook]
    assert f"`list[type[{base.__name__}]]`" in section
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


@pytest.mark.parametrize("hook", hookspecs.hook_names())
def test_a_plugin_answering_the_hook_is_registered(hook):
    """A subclass of a built-in of the hook's kind, under a new name, is registered."""
    kind = KIND_OF[hook]
    builtin = default_registry().classes[kind]
    assert builtin, f"no built-in answers {hook}"
    parent = builtin[sorted(builtin)[0]]
    mine = type("Mine", (parent,), {"name": f"hooktest-{kind}"})
    registry = build_registry(extra_plugins=[("hooktest", _plugin(hook, [mine]))])
    assert registry.failures == []
    assert registry.get(kind, f"hooktest-{kind}") is mine
    info = [p for p in registry.plugins if p.name == "hooktest"]
    assert info and info[0].provides == {kind: [f"hooktest-{kind}"]}


@pytest.mark.parametrize("hook", hookspecs.hook_names())
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
