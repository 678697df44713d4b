"""A notebook's model and data, turned into what a plan would load: ``aisafety.evaluate``'s
``model=`` and ``data=``.

The stored run records an ``object`` model spec (name, input shape, classes) and a dataset
named ``arrays``, with fingerprints of the real module (code and weights, see
``loading.predictor_fingerprint``) and the real images, so its results are keyed, resumed and
reported like any run's. The stored plan carries both fingerprints: re-run without the
objects, it names what to pass; re-run with other objects and ``resume``, it says that
nothing of the stored run can be resumed.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset, images_to_tensor
from aisafety.database.datasets.npz import image_layout
from aisafety.errors import ConfigError
from aisafety.interfaces import IN_MEMORY_DATA, EvaluationPlan, ModelSpec, mean_problem
from aisafety.loading import fingerprint, predictor_fingerprint, probe_classes
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor


def _array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data {what} cannot be read as an array ({exc})") from None


def in_memory_data(
    data: tuple[Any, Any], classes: Sequence[str] | int | None = None
) -> LoadedDataset:
    """``(x, y)``: images (N, H, W), NHWC or NCHW, uint8 0..255 or floats in [0, 1]; labels.
    ``classes``: their names in label order, or their count; declared (checked against the
    model's class count, ``evaluation/class_count.py``) only when given."""
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise ConfigError("data= is a pair (images, labels), e.g. data=(x_test, y_test)")
    x, y = _array(data[0], "images"), _array(data[1], "labels")
    if x.ndim not in (3, 4):
        raise ConfigError(f"data images have shape {x.shape}; give (N, H, W), NHWC or NCHW")
    if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
        raise ConfigError(f"data images are {x.dtype}; give uint8 0..255 or floats in [0, 1]")
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
        raise ConfigError(
            f"data labels are {y.dtype} {y.shape}; give {x.shape[0]} integer labels 0..K-1"
            + (" (one-hot rows? give y.argmax(1))" if y.ndim == 2 and y.shape[1] > 1 else "")
        )
    images = images_to_tensor(x, image_layout(x.shape))
    labels = torch.from_numpy(y.astype(np.int64))
    if classes is None:  # numbered from the labels: no count declared
        names = tuple(str(i) for i in range(int(y.max()) + 1 if y.size else 0))
        return LoadedDataset(IN_MEMORY_DATA, images, labels, names, declared=False)
    names = class_names(classes)
    if y.size and int(y.max()) >= len(names):
        raise ConfigError(
            f"data labels run up to {int(y.max())}, but classes= declares {len(names)} "
            f"classes (labels 0..{len(names) - 1}); give every class, in label order"
        )
    return LoadedDataset(IN_MEMORY_DATA, images, labels, names, declared=True)


def class_names(classes: Sequence[str] | int) -> tuple[str, ...]:
    """``aisafety.evaluate(classes=...)`` as names: a count numbers them 0..K-1."""
    if isinstance(classes, numbers.Integral) and not isinstance(classes, bool):
        if classes < 1:
            raise ConfigError(f"classes={classes}: give the number of classes (1 or more)")
        return tuple(str(i) for i in range(int(classes)))
    listed = hasattr(classes, "__iter__") and not isinstance(classes, str | bytes)
    names = tuple(classes) if listed else ()  # a list, a tuple or a numpy array of names
    if not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            "classes= takes the class names in label order (strings, e.g. a torchvision "
            f"dataset's .classes) or their count, got {str(classes)[:60]!r}"
        )
    return names


def module_input(
    model: Any, data: LoadedDataset | None, plan: EvaluationPlan
) -> tuple[tuple[int, ...] | None, str]:
    """The input shape of a module handed in, and where it comes from: the images of
    ``data=``, else those of the plan's dataset, which the module then runs on (before
    session 21 a module without ``data=`` was refused, whatever dataset the plan named)."""
    if data is not None:
        return tuple(data.x.shape[1:]), "data="
    if not isinstance(model, nn.Module):
        return None, "data="
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry

    images = load_data(plan.dataset, default_registry()).x
    return tuple(images.shape[1:]), f"the plan's dataset {plan.dataset.name!r} (or give data=)"


def in_memory_model(
    model: Any,
    input_shape: Sequence[int] | None,
    *,
    name: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    images: str = "data=",
) -> tuple[tuple[Predictor, str], ModelSpec]:
    """The predictor and its fingerprint, and the ``object`` spec stored for it; ``images``
    says where ``input_shape`` comes from (data=, or the plan's dataset)."""
    if isinstance(model, Predictor):
        if mean is not None or std is not None:
            raise ConfigError("mean and std apply to an nn.Module; a Predictor normalises itself")
        predictor = model
        if name:
            predictor.name = name
    elif isinstance(model, nn.Module):
        if input_shape is None:
            raise ConfigError(
                "model= is an nn.Module: give data= too, whose images tell its input shape "
                "(or wrap it in a TorchPredictor with input_shape)"
            )
        problem = mean_problem(mean, std, plan=False)
        if problem:
            raise ConfigError(f"aisafety.evaluate(mean=...): {problem}")
        label = name or type(model).__name__
        predictor = _module_predictor(model, input_shape, label, mean, std, images)
    else:
        file = (
            f" {str(model)!r}; a model file is named in the plan instead: model: {{source: "
            "onnx, export, torchscript or python (with factory), path: ...}} (docs/own-model.md)"
            if isinstance(model, str | Path)
            else ""
        )
        raise ConfigError(
            "model= takes a torch.nn.Module or an aisafety Predictor, got "
            f"{type(model).__name__}{file}"
        )
    digest = predictor_fingerprint(predictor)
    spec = ModelSpec(
        name=predictor.name, source="object", input_shape=predictor.input_shape,
        num_classes=predictor.num_classes, fingerprint=digest,
    )  # fmt: skip
    return (predictor, digest), spec


@contextmanager
def modes_kept(model: Any) -> Iterator[None]:
    """Give the module back in the train/eval mode of each submodule it came in.

    The predictor evaluates in eval mode (BatchNorm's running statistics, no dropout); a
    notebook's net handed in mid-training used to stay in eval mode afterwards, so further
    training went on silently without dropout and with frozen BatchNorm statistics. Each
    parameter's ``requires_grad`` comes back too: the predictor freezes them for the attacks,
    and the net stayed frozen until session 21 (its next ``backward()`` failed)."""
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    modes = [(m, m.training) for m in modules]
    wanted = [(p, p.requires_grad) for m in modules for p in m.parameters(recurse=False)]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for parameter, flag in wanted:
            parameter.requires_grad_(flag)


RERUN = (
    "re-run it in Python: aisafety.evaluate(plan, model=<the nn.Module or Predictor>, "
    "data=(images, labels)); or, to run it from a plan file, describe the model with "
    "source: python or export and save the data with numpy.savez for dataset: {name: npz, "
    "path: FILE} (docs/own-model.md)"
)


def require_objects(plan: EvaluationPlan, model: Any, data: Any) -> None:
    """A plan stored from ``evaluate(model=..., data=...)`` cannot load those objects itself:
    one error naming each one missing, before any work."""
    missing = []
    if plan.model.source == "object" and model is None:
        missing.append(f"model= (model {plan.model.name!r}, {_short(plan.model.fingerprint)})")
    if plan.dataset.name == IN_MEMORY_DATA and data is None:
        missing.append(f"data= (the arrays, {_short(plan.dataset.fingerprint)})")
    if missing:
        raise ConfigError(
            f"this plan ran on objects handed to aisafety.evaluate() in memory, which a plan "
            f"cannot load again: {' and '.join(missing)}; {RERUN}"
        )


def check_resumable(plan: EvaluationPlan, model: str | None, data: LoadedDataset | None) -> None:
    """``resume`` with a stored plan's fingerprints and other objects resumes nothing: say so."""
    stored = {"model=": plan.model.fingerprint, "data=": plan.dataset.fingerprint}
    given = {"model=": model, "data=": None if data is None else fingerprint(data)}
    for what, was in stored.items():
        if was is not None and given[what] is not None and given[what] != was:
            raise ConfigError(
                f"resume: the plan was stored for {what} with {_short(was)}, and the {what} "
                f"given now has {_short(given[what])} (other code, weights or images), so "
                "nothing of that run can be resumed; pass the same objects, or resume=False "
                "to evaluate these afresh"
            )


def _short(digest: str | None) -> str:
    return f"fingerprint {digest[:12]}" if digest else "no fingerprint recorded"


# what a module handed to aisafety.evaluate() is fed, and the arguments that change it: the
# plan's fields (model.scale, model.layout) do not reach it
MODULE_INPUT_SETTINGS = (
    "aisafety.evaluate's mean= and std= (the training normalisation, applied to [0, 1] "
    "images; a network trained on 0..255 pixels takes mean=(0, 0, 0), std=(1/255, 1/255, "
    "1/255)), that the module takes NCHW images (wrap a channels-last one)"
)


def _module_predictor(
    module: nn.Module, shape, name: str, mean, std, images: str
) -> TorchPredictor:
    predictor = TorchPredictor(module, shape, 2, name=name, mean=mean, std=std)
    predictor.input_settings = MODULE_INPUT_SETTINGS
    fix = (
        f"the shape of one image of {images}, channels first as every module is fed (NHWC "
        "arrays are transposed): wrap a module that takes channels-last (N, H, W, C) batches "
        "so that its forward runs net(x.permute(0, 2, 3, 1)); else give images of the shape "
        "the model was trained on"
    )
    predictor.num_classes = probe_classes(name, predictor.network, predictor.input_shape, fix)
    return predictor
