"""The import graph of ``aisafety/`` respects the layers of docs/architecture.md.

Every ``import``/``from ... import`` of an ``aisafety`` module anywhere in a file (top level,
inside functions, under ``TYPE_CHECKING``) and every ``importlib.import_module("aisafety...")``
with a literal name is an edge. A module may import its own layer and the layers below it;
any upward edge fails, and so does any import cycle between modules. The same graph collapsed
to folders (``aisafety/X/`` one node, a top-level file one node) must have each folder in one
layer and no arrow running up. Nothing is allowed
silently: the only exceptions are named in ``KNOWN_EXCEPTIONS`` with the issue that removes
them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aisafety"

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "aisafety.errors",
            "aisafety.interfaces",
            "aisafety.model_names",  # the names a plan's models take when it gives none
            "aisafety.config_base",
            "aisafety.version",
            "aisafety.memory",
            "aisafety.memory_budget",  # the memory budget every capability chunks under
            "aisafety.memory_ledger",  # default budgets claimed between processes
            "aisafety.randomness",
            "aisafety.files",  # files from outside, checked by stat before they are read
            "aisafety.command_clock",  # when the command began, for the wall time a user waits
            "aisafety.unit_cost",  # a unit's time and peak memory, stored with it
            "aisafety.warning_log",  # a run's warnings, kept for the store
            "aisafety.scoped",  # a ContextVar set for a with block (deadline, budget, ...)
        ),
    ),
    (
        "models and data",
        (
            "aisafety.prediction",
            "aisafety.database",  # architectures, dataset sources, the model zoo
        ),
    ),
    ("threat and bounds", ("aisafety.attack", "aisafety.verification")),
    (
        "corruptions and defenses",
        (
            "aisafety.corruption",
            # and defense.smoothing: randomized smoothing certifies a defense (the smoothed
            # classifier) and draws its noise through that defense's sampler, so it sits with
            # the defense, not below it in verification/
            "aisafety.defense",
        ),
    ),
    ("evaluation", ("aisafety.evaluation",)),
    (
        "results",
        (
            # results (writing a run), schema, migration(s) (Alembic), liveness (heartbeats,
            # stale runs), engine, read_only (aisafety query), interruption, compare
            "aisafety.store",
            "aisafety.report",  # the report's data, sections, plots, tables; the gate
        ),
    ),
    (
        "registry",
        (
            "aisafety.plugins",
            "aisafety.builtin",
            # the hooks are typed with the base class of each plugin kind (layers 2-6), and
            # only the registry reads them: they sit with it
            "aisafety.hookspecs",
            # the one module plugin authors import: every base, its types, hookimpl
            "aisafety.plugin",
        ),
    ),
    (
        "application",
        (
            "aisafety",  # the package's __init__: aisafety.evaluate()
            "aisafety.config",
            "aisafety.loading",
            "aisafety.in_memory",  # aisafety.evaluate(model=..., data=...): a notebook's objects
            "aisafety.runner",
            "aisafety.default_budget",  # a budget the plan left out, warned off MNIST
            "aisafety.progress",  # progress and ETA over a plan's units
            "aisafety.execution",  # picks the executor: local (runner) or Ray (distributed)
            "aisafety.distributed",  # units as Ray tasks
            "aisafety.zoo_build",
            "aisafety.report_page",  # builds pages from the registry's sections
            "aisafety.report_catalog",  # what the report reads of the registry (or its listing)
            "aisafety.sanity",  # reads attack defaults from the registry
            "aisafety.check",  # the release gate: evaluates, reads sanity checks, writes pages
            "aisafety.listing",  # what `aisafety list` shows: reads the registry and the zoo
            "aisafety.cli",  # one module per command
        ),
    ),
]

# (importer, imported) edges that break the layering today, each with the issue that removes it.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@cache
def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to (``from a.b import c`` may name a module or an object)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``aisafety`` modules ``module`` imports, wherever in the file.

    The parent packages Python runs on the way (``aisafety/__init__.py`` for any import) are
    not edges: only the module named is.
    """
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                package = _package_of(module, path).split(".")
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            # ``from a import b``: the module a.b if b is one, else (an object of) module a
            names += [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    found = {_resolve(n, modules) for n in names if n == "aisafety" or n.startswith("aisafety.")}
    return {m for m in found if m is not None and m != module}


@cache
def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports(m, path, modules) for m, path in modules.items()}


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to the docs"
    return best


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_no_upward_import():
    upward = []
    for module, targets in import_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module) and (module, target) not in KNOWN_EXCEPTIONS:
                upward.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_known_exceptions_still_exist():
    """An exception whose edge is gone must leave the list: the list never hides anything."""
    graph = import_graph()
    stale = [edge for edge in KNOWN_EXCEPTIONS if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"remove these from KNOWN_EXCEPTIONS, the imports are gone: {stale}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path a -> ... -> a), or None. Iterative depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_no_import_cycle():
    """No cycle once the named exceptions' edges are set aside (they are listed above)."""
    graph = {
        m: {t for t in ts if (m, t) not in KNOWN_EXCEPTIONS} for m, ts in import_graph().items()
    }
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_what_they_must():
    """The checker itself: an upward edge, a cycle and a relative import are seen."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("aisafety.zoo_build") > layer_of("aisafety.plugins")
    assert layer_of("aisafety.database.zoo") < layer_of("aisafety.attack.pgd")
    graph = import_graph()
    assert "aisafety.plugins" in graph["aisafety.zoo_build"]
    assert "aisafety.execution" in graph["aisafety"]  # imported inside a function: an edge


def folder_of(module: str) -> str:
    """The folder a module lives in, as a reader sees it: ``aisafety.X`` for anything under the
    package directory ``aisafety/X/`` (at any depth); a file at the top (``aisafety/runner.py``)
    is a node of its own."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def folder_layers(modules, layer=layer_of) -> dict[str, set[int]]:
    """The layers of the modules under each folder."""
    layers: dict[str, set[int]] = {}
    for module in modules:
        layers.setdefault(folder_of(module), set()).add(layer(module))
    return layers


def upward_folder_arrows(graph: dict[str, set[str]], layer=layer_of) -> list[str]:
    """The import graph collapsed to folders: an arrow ``F -> G`` where some module under F
    imports one under G (F != G). One runs up when G holds a layer above F's lowest, so a
    reader taking each folder for one floor would see a lower floor import a higher one."""
    layers = folder_layers(graph, layer)
    arrows = {(folder_of(m), folder_of(t)) for m, ts in graph.items() for t in ts}
    return sorted(
        f"{f} (layers {sorted(layers[f])}) -> {g} (layers {sorted(layers[g])})"
        for f, g in arrows
        if f != g and max(layers[g]) > min(layers[f])
    )


def test_every_folder_is_one_layer():
    """A folder names one floor: every module under ``aisafety/X/`` is in the same layer."""
    mixed = {f: sorted(ls) for f, ls in folder_layers(import_graph()).items() if len(ls) > 1}
    assert not mixed, f"folders spanning layers (move the modules): {mixed}"


def test_no_upward_arrow_between_folders():
    """The import graph collapsed to folders (``folder_of``) has no arrow running up."""
    upward = upward_folder_arrows(import_graph())
    assert not upward, "upward folder arrows:\n" + "\n".join(upward)


def test_the_folder_check_catches_an_upward_arrow():
    """The store back in database/ (layer 6 in a layer-2 folder): the attack's import of the
    zoo then runs up at folder level although no module imports upward."""
    graph = {
        "aisafety.attack.pgd": {"aisafety.database.zoo"},
        "aisafety.database.zoo": set(),
        "aisafety.database.results": {"aisafety.evaluation.base"},
        "aisafety.evaluation.base": set(),
    }
    layers = {"aisafety.attack.pgd": 2, "aisafety.database.zoo": 1,
              "aisafety.database.results": 5, "aisafety.evaluation.base": 4}  # fmt: skip
    arrows = upward_folder_arrows(graph, layers.__getitem__)
    assert arrows == [
        "aisafety.attack (layers [2]) -> aisafety.database (layers [1, 5])",
        "aisafety.database (layers [1, 5]) -> aisafety.evaluation (layers [4])",
    ]
    assert upward_folder_arrows(graph, lambda m: 1) == []
    assert folder_of("aisafety.runner") == "aisafety.runner"
    assert folder_of("aisafety.defense.training.loop") == "aisafety.defense"
