"""Whether the model has as many classes as the dataset declares.

A CIFAR-100 model on CIFAR-10, or an ImageNet model on a 10-class image folder, runs: its
labels 0..9 are in range, so nothing refuses them. But a label is read as the model's class
index, so clean accuracy, the attacks' margins (the largest of all the model's other
classes) and every metric are those of the model's problem, right only where the model's
class i is the dataset's class i. The run goes on with a warning: a model with an extra
class (background, unknown) or one whose first classes are the dataset's is legitimate.

Only a *declared* class list counts (CIFAR-10's ten names, an image folder's subfolders, an
npz's ``classes``, ImageNet's 1,000, ``aisafety.evaluate``'s ``classes=``): data numbered
from its labels (an npz without ``classes``, arrays handed to ``aisafety.evaluate`` without
``classes=``, a source's empty class list) says nothing of its class count: 20 ImageNet
images with labels up to 980 are not 981 classes.
"""

from __future__ import annotations

import warnings

from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ClassCountWarning
from aisafety.prediction.base import Predictor


def class_count_message(data: LoadedDataset, predictor: Predictor) -> str | None:
    """The warning's text when ``predictor``'s class count differs from ``data``'s declared
    one, else None."""
    declared, classes = len(data.classes), predictor.num_classes
    if not data.declared or declared in (0, classes):  # none declared, or the same
        return None
    return (
        f"model {predictor.name!r} has {classes} classes and dataset {data.name!r} declares "
        f"{declared}: its labels are read as the model's class indices, so clean accuracy, "
        f"the attacks' margins (over all {classes} of the model's classes) and every metric "
        f"are right only where the model's class i is the dataset's class i; if it is not "
        "(a CIFAR-100 or ImageNet model on a 10-class set), evaluate the model on data of "
        "its own classes, or wrap it to return the scores of the dataset's classes in the "
        'dataset\'s order (docs/own-model.md, "Classes")'
    )


def warn_if_class_count_differs(data: LoadedDataset, predictor: Predictor) -> None:
    """Warn when the model's class count is not the one the dataset declares."""
    message = class_count_message(data, predictor)
    if message:
        warnings.warn(message, ClassCountWarning, stacklevel=2)
