"""Build a user's ``nn.Module`` from ``factory: "package.module:callable"`` in a plan.

This runs the user's code, as pytest runs a ``conftest.py``: a plan naming a factory is as
trusted as the module it names. The module is imported from the given folders (a plan
file's folder first) or else from the Python path.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import nn

from aisafety.errors import ConfigError


@contextmanager
def _search_path(folders: Sequence[Path]) -> Iterator[None]:
    """``folders`` ahead of ``sys.path`` while the factory's module is imported."""
    added = [str(Path(f)) for f in folders if str(Path(f)) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            sys.path.remove(folder)


def resolve_factory(factory: str, folders: Sequence[Path], model: str) -> Callable[..., Any]:
    """The callable ``factory`` names, or an error naming the module and where it was sought."""
    module_name, _, attribute = factory.partition(":")
    with _search_path(folders):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or "?"
            if module_name != missing and not module_name.startswith(missing + "."):
                raise ConfigError(
                    f"model {model!r}: factory {factory!r}: module {module_name!r} imports "
                    f"{missing!r}, which is not installed; pip install it"
                ) from None
            where = ", ".join(str(f) for f in folders) or "(no plan folder)"
            raise ConfigError(
                f"model {model!r}: factory {factory!r}: no module {module_name!r} in {where} "
                "or on the Python path; put the file beside the plan, list its folder in "
                "'python_path', or pip install its package"
            ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            raise ConfigError(
                f"model {model!r}: factory {factory!r}: module {module_name!r} has no "
                f"{attribute!r}; it defines {', '.join(public[:20]) or '(nothing public)'}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"model {model!r}: factory {factory!r} is not callable")
    return target


def build_module(
    factory: Callable[..., Any], kwargs: Mapping[str, Any] | None, model: str, label: str
) -> nn.Module:
    """``factory(**kwargs)``, which must return an ``nn.Module``."""
    try:
        module = factory(**dict(kwargs or {}))
    except TypeError as exc:  # most often kwargs that the factory does not take
        raise ConfigError(
            f"model {model!r}: {label}(**{dict(kwargs or {})}) fails: {exc}"
        ) from None
    except RuntimeError as exc:  # torch.OutOfMemoryError included
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        if "allocate" not in reason:
            raise
        raise ConfigError(
            f"model {model!r}: {label}(**{dict(kwargs or {})}) ran out of memory building the "
            f"module ({reason}); check the sizes its settings ask for (a width or a layer "
            "count far too large), or run it where that memory is"
        ) from None
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"model {model!r}: {label} returned a {type(module).__name__}, not a torch.nn.Module"
        )
    return module
