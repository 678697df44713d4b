"""Which executor runs a plan: this process (``local``, the default) or a Ray cluster.

Both compute every unit with ``Runner.compute`` and store it in one transaction, so a plan
stores the same numbers on either. Ray is imported only for a plan that runs on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aisafety.interfaces import EvaluationPlan, RunRecord
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

if TYPE_CHECKING:
    from aisafety.database.datasets.base import LoadedDataset
    from aisafety.prediction.base import Predictor


def run_plan(
    plan: EvaluationPlan,
    store: ResultStore,
    resume: bool = False,
    quiet: bool = False,
    model: tuple[Predictor, str] | None = None,
    data: LoadedDataset | None = None,
) -> RunRecord:
    """Run ``plan`` on ``plan.executor`` and store its results in ``store``; ``model`` and
    ``data`` (in memory, from ``aisafety.evaluate``) replace the plan's, on the local executor."""
    from aisafety.in_memory import require_objects

    require_objects(plan, model, data)  # a plan stored from evaluate(model=, data=) alone
    return run_with(Runner(plan, store, resume=resume, quiet=quiet, model=model, data=data))


def run_with(runner: Runner) -> RunRecord:
    """Run a ``Runner`` built already (``aisafety check`` builds one to look for a stored
    run first) on its plan's executor."""
    if runner.plan.executor.name == "local":
        return runner.run()
    if runner.given_model is not None or runner.given_data is not None:
        from aisafety.errors import ConfigError

        raise ConfigError(
            "a model or data handed to aisafety.evaluate() lives in this process; run it with "
            "the local executor, or save it (source: python / export) for the ray executor"
        )
    try:
        from aisafety.distributed.executor import run_on_ray
    except ImportError as exc:
        from aisafety.errors import ConfigError

        raise ConfigError(
            f"the ray executor needs Ray ({exc}); install it with "
            'pip install "aisafety[distributed]" (docs/scale-out.md)'
        ) from None
    return run_on_ray(runner)
