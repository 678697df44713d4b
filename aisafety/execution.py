"""Which executor runs a plan: this process (``local``, the default) or a Ray cluster.

Both compute every unit with ``Runner.compute`` and store it in one transaction, so a plan
stores the same numbers on either. Ray is imported only for a plan that runs on it.
"""

from __future__ import annotations

from aisafety.database.store import ResultStore
from aisafety.interfaces import EvaluationPlan, RunRecord
from aisafety.runner import Runner


def run_plan(
    plan: EvaluationPlan, store: ResultStore, resume: bool = False, quiet: bool = False
) -> RunRecord:
    """Run ``plan`` on ``plan.executor`` and store its results in ``store``."""
    runner = Runner(plan, store, resume=resume, quiet=quiet)
    if plan.executor.name == "local":
        return runner.run()
    try:
        from aisafety.distributed.executor import run_on_ray
    except ImportError as exc:
        from aisafety.errors import ConfigError

        raise ConfigError(
            f"the ray executor needs Ray ({exc}); install it with "
            'pip install "aisafety[distributed]" (docs/scale-out.md)'
        ) from None
    return run_on_ray(runner)
