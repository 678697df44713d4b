"""AISafety: evaluate how robust an image classifier really is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aisafety.version import __version__

if TYPE_CHECKING:
    from aisafety.interfaces import EvaluationPlan, RunRecord

__all__ = ["__version__", "evaluate"]


def evaluate(
    plan: EvaluationPlan | str | Path | dict | None = None,
    db: str = "sqlite:///aisafety.db",
    resume: bool = False,
    quiet: bool = True,
) -> RunRecord:
    """Run a plan (object, dict, YAML/TOML path, or None for the embedded default)."""
    from aisafety.config import default_plan, load_plan, plan_from_dict
    from aisafety.database.store import ResultStore
    from aisafety.execution import run_plan

    if plan is None:
        plan = default_plan()
    elif isinstance(plan, str | Path):
        plan = load_plan(plan)
    elif isinstance(plan, dict):
        plan = plan_from_dict(plan)
    return run_plan(plan, ResultStore(db), resume=resume, quiet=quiet)
