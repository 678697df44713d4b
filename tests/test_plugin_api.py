"""``aisafety.plugin`` is the one door: every name a plugin needs is exported there.

The walk starts from the base class or record type each hook returns (``hookspecs``) and
follows every public class attribute and method signature of it, and of every ``aisafety``
class found on the way, to a fixed point. Any class met that ``aisafety.plugin`` does not
export fails the test: a plugin author would have to import it from an internal module.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import types
import typing
import venv
from pathlib import Path

import pytest
import torch

import aisafety.plugin as api
from aisafety.hookspecs import hook_bases, hook_records
from aisafety.plugins import build_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property

ROOT = Path(__file__).resolve().parents[1]


def _classes_in(annotation: object) -> set[type]:
    """The ``aisafety`` classes an annotation names (inside generics, unions, callables)."""
    found = set()
    if isinstance(annotation, type) and annotation.__module__.startswith("aisafety"):
        found.add(annotation)
    origin = typing.get_origin(annotation)
    if isinstance(origin, type) and origin.__module__.startswith("aisafety"):
        found.add(origin)
    for arg in typing.get_args(annotation):
        found |= _classes_in(arg)
    return found


def _public_hints(owner: object) -> dict[str, object]:
    hints = typing.get_type_hints(owner)  # a name only under TYPE_CHECKING fails here
    return {k: v for k, v in hints.items() if not k.startswith("_") or k == "return"}


def _own_members(cls: type) -> list[object]:
    """The public methods and properties ``cls`` has from ``aisafety`` classes (pydantic's
    and torch's own members are theirs to document)."""
    members = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        function = member.fget if isinstance(member, property) else member
        module = getattr(function, "__module__", "") or ""
        if callable(function) and not isinstance(function, type) and module.startswith("aisafety"):
            members.append(function)
    return members


def plugin_facing(roots: typing.Iterable[type]) -> set[type]:
    """Every public ``aisafety`` class reachable from ``roots`` through annotations."""
    seen: set[type] = set()
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if cls in seen or cls.__name__.startswith("_"):
            continue
        seen.add(cls)
        for base in cls.__mro__:
            if base.__module__.startswith("aisafety"):
                for annotation in _public_hints(base).values():
                    todo += _classes_in(annotation)
        for member in _own_members(cls):
            for annotation in _public_hints(member).values():
                todo += _classes_in(annotation)
    return seen


def missing_from(module: object, classes: set[type]) -> list[str]:
    return sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in classes
        if getattr(module, c.__name__, None) is not c
    )


def test_every_plugin_facing_class_is_exported():
    facing = plugin_facing([*hook_bases().values(), *hook_records().values()])
    assert len(facing) > 20  # the walk reached the call, context and result types
    missing = missing_from(api, facing)
    assert not missing, f"export these from aisafety/plugin.py: {missing}"


FAKE_PLUGIN_BASE = """
from __future__ import annotations
from typing import ClassVar
from aisafety.plugin import Norm

class Hidden: ...
class Knob: ...

class Base:
    norm: ClassVar[Norm]
    kind: ClassVar[type[Knob]]

    def run(self, norm: Norm) -> list[Hidden]:
        return []
"""


def test_the_walk_finds_a_type_only_an_internal_module_has(monkeypatch):
    """The checker itself: a base whose method returns an unexported class is caught, and
    so is one named only in a class attribute; an exported one (``Norm``) is not."""
    module = types.ModuleType("aisafety.fake")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(FAKE_PLUGIN_BASE, module.__dict__)
    missing = missing_from(api, plugin_facing([module.Base]))
    assert missing == ["aisafety.fake.Base", "aisafety.fake.Hidden", "aisafety.fake.Knob"]


def test_exports_exist_and_are_listed_once():
    assert len(api.__all__) == len(set(api.__all__))
    assert [name for name in api.__all__ if not hasattr(api, name)] == []


def _aisafety_imports(source: str, where: str) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aisafety"):
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules += [a.name for a in node.names if a.name.startswith("aisafety")]
    return modules


def test_example_plugin_imports_only_the_public_module():
    files = sorted((ROOT / "plugins").glob("*/src/**/*.py"))
    assert files
    internal = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in _aisafety_imports(path.read_text(), str(path))
        if module.split(".")[0] == "aisafety" and module != "aisafety.plugin"
    }
    assert not internal, f"import these from aisafety.plugin: {sorted(internal)}"


@pytest.mark.parametrize("doc", ["README.md", "docs/plugins.md", "docs/report.md"])
def test_plugin_examples_in_the_docs_import_only_the_public_module(doc):
    """A Python block of the docs that writes a plugin (uses ``hookimpl``) shows the door."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    plugin_blocks = [b for b in blocks if "hookimpl" in b]
    assert plugin_blocks, f"{doc} shows no plugin"
    for block in plugin_blocks:
        modules = _aisafety_imports(block, doc)
        assert modules and set(modules) == {"aisafety.plugin"}, f"{doc}: {modules}"


def _demo_plugin():
    """The second plugin's source (plugins/aisafety-contract-demo), imported, not installed."""
    source = ROOT / "plugins" / "aisafety-contract-demo" / "src"
    sys.path.insert(0, str(source))
    try:
        import aisafety_contract_demo.plugin as plugin
    finally:
        sys.path.remove(str(source))
    return plugin


def test_the_demo_plugin_written_against_the_door_registers_and_is_sound(
    zoo_predictor, mnist_subset
):
    """An attack, a metric and a verifier from ``aisafety.plugin`` alone: registered, the
    attack's results inside its l2 budget, the verifier's bounds no tighter than the
    built-in IBP's (which elides the last layer: a bound above it would be unsound)."""
    registry = build_registry(extra_plugins=[("contract-demo", _demo_plugin())])
    assert registry.failures == []
    data = mnist_subset(8)
    result = registry.create("attack", "fgm-l2-demo")(zoo_predictor, data.x, data.y, 4.0)
    assert float(result.norms["l2"].max()) <= 4.0 + 1e-5 and result.success.any()
    assert registry.get("metric", "adversarial-margin-demo").per_attack

    torch.manual_seed(0)
    network = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 10)
    )
    x = torch.rand(6, 1, 4, 4, dtype=torch.float64)
    graph = build_graph(network, (1, 4, 4), "tiny")
    prop = robustness_property(x, network(x.float()).argmax(1), 0.02, 10)
    plain = registry.create("verifier", "plain-ibp-demo").verify(graph, prop)
    elided = registry.create("verifier", "ibp").verify(graph, prop)
    assert bool((plain.margins <= elided.margins + 1e-9).all())
    assert bool((plain.margins < elided.margins).any())  # looser: it really is another method


DEMO_NAMES = ("fgm-l2-demo", "adversarial-margin-demo", "plain-ibp-demo", "lenet-demo")


def test_the_demo_plugin_installed_in_a_fresh_venv_passes_the_contract_tests(tmp_path):
    """pip installs plugins/aisafety-contract-demo into a new virtual environment (on the
    installed torch and aisafety, no download), and the registry-wide contract tests, run
    there, find its four plugins through the entry point and pass each of them."""
    env_dir = tmp_path / "venv"
    # the environment's own pip and setuptools (ensurepip's setuptools predates bdist_wheel)
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    demo = ROOT / "plugins" / "aisafety-contract-demo"
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--no-build-isolation", str(demo)]  # fmt: skip
    subprocess.run(install, check=True, cwd=tmp_path, timeout=600)
    assert list(env_dir.rglob("aisafety_contract_demo/plugin.py"))  # in the venv itself
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not another installed copy
    tests = [str(python), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
             str(ROOT / "tests" / "test_contract.py"), "-k", "demo"]  # fmt: skip
    done = subprocess.run(tests, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.findall(r"^PASSED (\S+)", done.stdout, re.MULTILINE)
    for name in DEMO_NAMES:
        assert any(f"[{name}" in test for test in passed), (name, passed)
    assert any("test_architecture_contract[lenet-demo]" in test for test in passed)
