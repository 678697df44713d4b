"""A RobustBench model-zoo network from a checkpoint already on disk; nothing is downloaded.

RobustBench's ``load_model`` fetches a missing checkpoint from Google Drive, or builds timm
hub entries with their hub weights. Here the file it would read is checked first, in
RobustBench's own layout (``model_dir/<dataset>/<threat model>/<name>.pt``), hub and ensemble
entries are refused, and its download function is replaced by an error for the duration of
the call, so a plan never reaches the network. The network keeps the normalisation
RobustBench builds into it: its input is a [0, 1] image.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from torch import nn

from aisafety.errors import ConfigError, UnknownNameError

INSTALL = (
    "pip install --no-deps robustbench==1.1.1 timm==1.0.9 huggingface_hub safetensors pandas "
    "python-dateutil tzdata geotorch torchdiffeq gdown beautifulsoup4 soupsieve "
    "'setuptools<81', with the autoattack package it imports and a torchvision built for "
    "your torch (docs/own-model.md; its plain pip install replaces a CPU torch by a CUDA one)"
)
INPUT_SHAPES = {"cifar10": (3, 32, 32), "cifar100": (3, 32, 32), "imagenet": (3, 224, 224)}
CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet": 1000}


def checkpoint_file(model_dir: Path, name: str, dataset: str, threat_model: str) -> Path:
    """The file RobustBench's ``load_model`` reads for a single network."""
    return Path(model_dir) / dataset / threat_model.replace("_3d", "") / f"{name}.pt"


def fetch_command(model_dir: Path, name: str, dataset: str, threat_model: str) -> str:
    return (
        'python -c "from robustbench.utils import load_model; load_model('
        f"'{name}', model_dir='{model_dir}', dataset='{dataset}', "
        f"threat_model='{threat_model}')\""
    )


def _robustbench(model: str) -> tuple[Any, Any]:
    """``robustbench.utils`` and its model table, or an error saying how to install them."""
    try:
        utils = importlib.import_module("robustbench.utils")
        zoo = importlib.import_module("robustbench.model_zoo")
    except Exception as exc:  # noqa: BLE001 - a torchvision that does not fit torch raises RuntimeError
        raise ConfigError(
            f"model {model!r}: source: robustbench needs the robustbench package, which "
            f"cannot be imported here ({type(exc).__name__}: {str(exc)[:200]}); install it "
            f"by: {INSTALL}"
        ) from None
    return utils, zoo.model_dicts


def _entry(table: Any, name: str, dataset: str, threat_model: str) -> dict[str, Any]:
    """RobustBench's record of the network: its constructor and where its weights live."""
    threats = {k.value: v for k, v in table[_enum(table, dataset)].items()}
    threat = threat_model.replace("_3d", "")
    if threat not in threats:
        raise UnknownNameError(f"RobustBench {dataset} threat model", threat, set(threats))
    if name not in threats[threat]:
        raise UnknownNameError(f"RobustBench {dataset} {threat} model", name, set(threats[threat]))
    return threats[threat][name]


def _enum(table: Any, dataset: str) -> Any:
    return next(key for key in table if key.value == dataset)


@contextmanager
def _no_download(utils: Any, model: str) -> Iterator[None]:
    """Any download RobustBench would still attempt fails, naming the model."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise ConfigError(
            f"model {model!r}: RobustBench tried to download a file; this platform never "
            "downloads models: put the checkpoint in model_dir first"
        )

    with mock.patch.object(utils, "download_gdrive_new", refuse):
        yield


def load_robustbench(
    name: str, model_dir: Path, dataset: str, threat_model: str, model: str
) -> tuple[nn.Module, Path]:
    """The network in eval mode, and the checkpoint file it was built from."""
    file = checkpoint_file(model_dir, name, dataset, threat_model)
    if not file.is_file():
        raise ConfigError(
            f"model {model!r}: the RobustBench checkpoint must be at {file} (RobustBench's "
            "layout model_dir/<dataset>/<threat model>/<name>.pt) and is not; nothing is "
            "downloaded here: fetch it on a machine with network access by "
            f"{fetch_command(model_dir, name, dataset, threat_model)} and copy it there"
        )
    utils, table = _robustbench(model)  # only once the file is there: it never downloads
    entry = _entry(table, name, dataset, threat_model)
    threat = threat_model.replace("_3d", "")
    on_hub = utils.timm.is_model(f"{name.lower().replace('-', '_')}_{dataset}_{threat}".lower())
    if on_hub or isinstance(entry.get("gdrive_id"), list):
        kind = "a timm hub model" if on_hub else "an ensemble"
        raise ConfigError(
            f"model {model!r}: RobustBench's {name!r} is {kind}, which source: robustbench "
            "does not load (only single networks with one checkpoint file); build it with "
            "source: python and a state dict path"
        )
    if entry.get("gdrive_id") is None:  # e.g. ImageNet 'Standard_R50': torchvision's weights
        raise ConfigError(
            f"model {model!r}: RobustBench's {name!r} has no checkpoint of its own (its "
            "weights come from torchvision's hub); load it with source: python instead"
        )
    with _no_download(utils, model):
        network = utils.load_model(
            name, model_dir=str(model_dir), dataset=dataset, threat_model=threat_model
        )
    return network.eval(), file
