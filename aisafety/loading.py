"""Turn specs into live objects: a predictor for a ModelSpec, tensors for a DatasetSpec."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch

from aisafety.database.architectures import build
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import list_models, load_zoo_model, sha256_bytes
from aisafety.errors import ConfigError
from aisafety.interfaces import DatasetSpec, DefenseSpec, ModelSpec
from aisafety.plugins import Registry
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for but no CUDA GPU is visible; use 'cpu'")
    return torch.device(device)


def load_model(spec: ModelSpec, device: torch.device) -> tuple[Predictor, str]:
    """The predictor and a fingerprint of its weights (the sha256 of the checkpoint)."""
    if spec.source == "zoo":
        predictor = load_zoo_model(spec.name, device)
        return predictor, list_models()[spec.name][0].sha256
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"model {spec.name!r}: checkpoint {str(path)!r} does not exist")
    data = path.read_bytes()
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    module = build(spec.architecture)
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(
            f"model {spec.name!r}: {path} does not fit architecture {spec.architecture!r}: {exc}"
        ) from None
    predictor = TorchPredictor(
        module,
        spec.input_shape,
        spec.num_classes,
        name=spec.name,
        mean=spec.mean,
        std=spec.std,
        device=device,
    )
    return predictor, sha256_bytes(data)


def apply_defenses(
    predictor: Predictor, defenses: tuple[DefenseSpec, ...], registry: Registry
) -> Predictor:
    for spec in defenses:
        predictor = registry.create("defense", spec.name, spec.config, predictor)
    return predictor


def load_data(spec: DatasetSpec, registry: Registry) -> LoadedDataset:
    source = registry.get("dataset", spec.name)()
    data = source.load(spec.path, spec.split)
    return data.balanced_subset(spec.limit, spec.seed)


def fingerprint(data: LoadedDataset) -> str:
    """sha256 of the evaluated images and labels: identical data, identical rows."""
    digest = hashlib.sha256(data.x.numpy().tobytes())
    digest.update(data.y.numpy().tobytes())
    return digest.hexdigest()
