"""AISafety: evaluate how robust an image classifier really is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aisafety.version import __version__

if TYPE_CHECKING:
    from aisafety.interfaces import EvaluationPlan, RunRecord

__all__ = ["__version__", "evaluate"]


def evaluate(
    plan: EvaluationPlan | str | Path | dict | None = None,
    db: str = "sqlite:///aisafety.db",
    resume: bool = False,
    quiet: bool = True,
    *,
    model: Any = None,
    data: tuple[Any, Any] | None = None,
    name: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    classes: Sequence[str] | int | None = None,
) -> RunRecord:
    """Run a plan (object, dict, YAML/TOML path, or None for the embedded default).

    ``model`` (a ``torch.nn.Module`` taking [0, 1] images, normalised by ``mean``/``std`` if
    given, or a ``Predictor``) and ``data`` (images and labels: tensors or arrays, NCHW or
    NHWC, uint8 or [0, 1] floats) replace the plan's model and dataset, so a notebook's
    objects are evaluated, stored and reported like any run (docs/own-model.md). ``classes``
    (the data's class names in label order, or their count) declares what ``data`` is
    labelled with, so a model of another class count is warned about, as for a dataset
    that names its classes (labels alone say nothing of the count).
    """
    from aisafety.in_memory import modes_kept

    with modes_kept(model):
        return _evaluate(plan, db, resume, quiet, model, data, name, mean, std, classes)


def _evaluate(
    plan: EvaluationPlan | str | Path | dict | None,
    db: str,
    resume: bool,
    quiet: bool,
    model: Any,
    data: tuple[Any, Any] | None,
    name: str | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    classes: Sequence[str] | int | None,
) -> RunRecord:
    from aisafety.config import default_plan, load_plan, plan_from_dict
    from aisafety.execution import run_plan
    from aisafety.in_memory import (
        check_resumable,
        in_memory_data,
        in_memory_model,
        module_input,
    )
    from aisafety.interfaces import IN_MEMORY_DATA
    from aisafety.loading import fingerprint
    from aisafety.store.results import ResultStore

    if plan is None:
        plan = default_plan()
    elif isinstance(plan, str | Path):
        plan = load_plan(plan)
    elif isinstance(plan, dict):
        plan = plan_from_dict(plan)
    if classes is not None and data is None:
        from aisafety.errors import ConfigError

        raise ConfigError(
            "classes= declares the classes of data= given in memory; pass data=(images, "
            "labels) too (a plan's dataset declares its own)"
        )
    given_data = None if data is None else in_memory_data(data, classes)
    given_model, spec = None, None
    if model is not None:
        shape, images = module_input(model, given_data, plan)
        given_model, spec = in_memory_model(
            model, shape, name=name, mean=mean, std=std, images=images
        )
    if resume:  # a stored plan's fingerprints against the objects given now
        check_resumable(plan, given_model and given_model[1], given_data)
    if given_data is not None:
        arrays = {"name": IN_MEMORY_DATA, "path": None, "fingerprint": fingerprint(given_data)}
        plan = plan.model_copy(update={"dataset": plan.dataset.model_copy(update=arrays)})
    if spec is not None:  # validated again: the reference may share the object's name
        given = {field: getattr(plan, field) for field in plan.model_fields_set}
        plan = plan_from_dict({**given, "model": spec}, "the plan with model=")
    elif any(v is not None for v in (name, mean, std)):
        from aisafety.errors import ConfigError

        raise ConfigError("name, mean and std describe a model= given in memory; pass model= too")
    return run_plan(
        plan, ResultStore(db), resume=resume, quiet=quiet, model=given_model, data=given_data
    )
