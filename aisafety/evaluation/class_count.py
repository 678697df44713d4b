"""Whether the dataset's classes are as many as the model's outputs.

Label i is read as the model's output i. A model trained on another label set runs without
an error when the labels lie in its range: a CIFAR-100 network on CIFAR-10's labels 0..9, an
ImageNet network on an ``imagefolder`` of ten ImageNet classes (labelled 0..9 by folder
order, where the network's indices of those classes are 0, 217, 482, ...), a 1001-output
network with a background class on ImageNet's 0..999 (every label off by one). Each number
is then of the wrong classes. The run goes on (a model may have outputs the data never
uses), with a warning naming both counts and the fix.

Only for datasets that name their classes: an npz without ``classes`` and arrays handed to
``aisafety.evaluate`` number them from the labels, which says nothing about the label set.
"""

from __future__ import annotations

import warnings

from aisafety.errors import AISafetyWarning
from aisafety.evaluation.context import EvaluationContext


def class_count_warning(dataset: str, classes: int, model: str, outputs: int) -> str | None:
    """The warning's text when ``classes`` differs from the model's ``outputs``, else None."""
    if not classes or classes == outputs:
        return None
    return (
        f"dataset {dataset!r} has {classes} classes and model {model!r} has {outputs} "
        f"outputs: label i is read as the model's output i, so a model trained on another "
        f"label set (CIFAR-100 on CIFAR-10, ImageNet on a folder of a few of its classes, a "
        "background class first) is scored on the wrong classes; evaluate it on data "
        "labelled with its own output indices (an npz with its labels, docs/own-model.md)"
    )


def class_count_message(ctx: EvaluationContext) -> str | None:
    """The warning for ``ctx`` when its dataset names another number of classes."""
    if not ctx.data.classes_named:
        return None
    predictor = ctx.predictor
    return class_count_warning(
        ctx.data.name, len(ctx.data.classes), predictor.name, predictor.num_classes
    )


def warn_if_other_classes(ctx: EvaluationContext) -> None:
    """Warn when the dataset's classes are not as many as the model's outputs."""
    message = class_count_message(ctx)
    if message:
        warnings.warn(message, AISafetyWarning, stacklevel=2)
