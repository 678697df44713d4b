"""No module of ``aisafety/`` reaches into another's private names.

A name with one leading underscore (``_conv``, ``_windows``) is free to change with its
module; a caller elsewhere would break unseen. The check parses every file with ``ast`` and
fails on ``x._name`` where ``_name`` is defined (a ``def``, or a name assigned at a module's
or class's top level) only in *other* files of the package, unless ``x`` is ``self``,
``cls`` or ``super()``. Names defined nowhere in the package (torch's ``_version``,
``os._exit``) are third-party and not this test's business. ``ALLOWED`` names the
conventions that cross modules on purpose.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aisafety"
BENCH = PACKAGE.parent / "bench"

ALLOWED = {
    # a predictor's unchecked forward: attacks and wrapping predictors call it inside their
    # loops once the batch was checked (docs/architecture.md, "Conventions")
    "_logits",
    # torch.Tensor's in-place write counter (memo.py, rounding.py); the check matches names,
    # not types, and prediction/watch.py has a function of that name
    "_version",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """Private names a file defines: functions and methods at any depth, and names assigned
    at the top level of the module or of a class."""
    names = set()
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in bodies:
        for node in body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    names |= {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    return {n for n in names if _private(n)}


def _own(value: ast.expr) -> bool:
    """Whether ``value`` is ``self``, ``cls`` or ``super()``: the object's own names."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    call = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
    return call and value.func.id == "super"


def foreign_private_uses(files: dict[str, str]) -> list[str]:
    """``path:line: x._name`` for each use of another file's private name (see the module's
    docstring); ``files`` maps a path to its source."""
    trees = {path: ast.parse(source) for path, source in files.items()}
    defined_in = defaultdict(set)
    for path, tree in trees.items():
        for name in _defined(tree):
            defined_in[name].add(path)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            owners = defined_in.get(node.attr, set())
            if owners and path not in owners and not _own(node.value) and node.attr not in ALLOWED:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def private_imports(files: dict[str, str]) -> list[str]:
    """``path:line: module._name`` for each ``from aisafety... import _name`` in ``files``:
    what a bench imports must be the package's public API, or a rename breaks it unseen."""
    found = []
    for path, source in files.items():
        for node in ast.walk(ast.parse(source)):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if module.split(".")[0] != "aisafety":
                continue
            found += [
                f"{path}:{node.lineno}: {module}.{a.name}" for a in node.names if _private(a.name)
            ]
    return sorted(found)


def test_no_bench_imports_the_packages_private_names():
    files = {str(p.relative_to(BENCH.parent)): p.read_text() for p in BENCH.rglob("*.py")}
    assert len(files) > 10
    assert private_imports(files) == []


def test_no_module_imports_another_modules_private_names():
    """``from aisafety.x import _name`` inside the package: the attribute check above does
    not see it (a plain name after the import), so the import check runs on the package too."""
    files = {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert private_imports(files) == []


def test_the_import_check_finds_a_private_name_inside_a_function():
    files = {
        "a.py": "from aisafety.verification.vnncomp import _property, load_network\n",
        "b.py": "def f():\n    from aisafety.x import public, _hidden as h\n",
        "c.py": "from torch import _C\nfrom aisafety import plugin\n",
    }
    assert private_imports(files) == [
        "a.py:1: aisafety.verification.vnncomp._property",
        "b.py:2: aisafety.x._hidden",
    ]


def test_no_module_uses_another_modules_private_names():
    files = {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert foreign_private_uses(files) == []


def test_the_check_finds_a_private_method_and_function_used_elsewhere():
    """The check on made-up files: the zonotope's former ``op._conv`` and joint_alpha's
    former ``b._initial_slopes`` are found; the owner's own uses, ``super()``, a third-party
    private name and the allowed ``_logits`` are not."""
    files = {
        "ops.py": "class Conv:\n    def _conv(self, x):\n        return x\n"
        "    def forward(self, x):\n        return self._conv(x)\n"
        "def own(op):\n    return op._conv(1)\n",
        "bounds.py": "_LIMIT = 3\ndef _initial_slopes(g):\n    return g\n",
        "zonotope.py": "def linear(op, x):\n    return op._conv(x)\n",
        "joint.py": "from pkg import bounds as b\nx = b._initial_slopes(1) + b._LIMIT\n",
        "other.py": "class A(B):\n    def f(self, t, p):\n"
        "        return super()._conv(t), t._version, p._logits(t)\n",
        "predictor.py": "class P:\n    def _logits(self, x):\n        return x\n",
    }
    assert foreign_private_uses(files) == [
        "joint.py:2: b._LIMIT",
        "joint.py:2: b._initial_slopes",
        "zonotope.py:2: op._conv",
    ]
