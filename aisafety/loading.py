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


def _read_model_file(spec: ModelSpec) -> bytes:
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"model {spec.name!r}: file {str(path)!r} does not exist")
    return path.read_bytes()


def normalisation(spec: ModelSpec) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The plan's input domain as the predictor's (x - mean) / std on [0, 1] images.

    The network takes ``(x * scale - mean) / std``, which is ``(x - mean / scale) /
    (std / scale)``: one normalisation, so the bound graph sees it as any other.
    """
    if spec.scale == 1.0:
        return spec.mean, spec.std
    mean = tuple(m / spec.scale for m in (spec.mean or (0.0,)))
    std = tuple(s / spec.scale for s in (spec.std or (1.0,)))
    return mean, std


def load_model(spec: ModelSpec, device: torch.device) -> tuple[Predictor, str]:
    """The predictor and a fingerprint of what it computes (the sha256 of its file)."""
    if spec.source == "zoo":
        return load_zoo_model(spec.name, device), list_models()[spec.name][0].sha256
    if spec.source == "remote":
        from aisafety.prediction.remote import RemotePredictor

        settings = {
            k: getattr(spec, k) for k in ("timeout", "retries") if getattr(spec, k) is not None
        }
        predictor = RemotePredictor(
            spec.url, spec.name, spec.input_shape, spec.num_classes, name=spec.name, **settings
        )
        return predictor, sha256_bytes(f"{spec.url}|{spec.name}".encode())
    data = _read_model_file(spec)
    mean, std = normalisation(spec)
    if spec.source == "onnx":
        from aisafety.prediction.onnx_model import load_onnx, read_onnx

        data = read_onnx(Path(spec.path).expanduser(), spec.name)  # with external weights

        predictor = load_onnx(
            data, spec.gradients, input_shape=spec.input_shape, num_classes=spec.num_classes,
            name=spec.name, mean=mean, std=std, device=device, layout=spec.layout,
        )  # fmt: skip
    elif spec.source == "torchscript":
        from aisafety.prediction.torchscript import TorchScriptPredictor

        predictor = TorchScriptPredictor(
            data, spec.input_shape, spec.num_classes,
            name=spec.name, mean=mean, std=std, device=device,
        )  # fmt: skip
    else:
        predictor = _load_checkpoint(spec, data, device)
    return predictor, sha256_bytes(data)


def _load_checkpoint(spec: ModelSpec, data: bytes, device: torch.device) -> Predictor:
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"model {spec.name!r}: {spec.path} is not a loadable PyTorch checkpoint "
            f"({first_line}); save one with torch.save(model.state_dict(), path)"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(
            f"model {spec.name!r}: {spec.path} holds a {type(state).__name__}, not a state "
            "dict; save one with torch.save(model.state_dict(), path)"
        )
    module = build(spec.architecture)
    try:
        module.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"model {spec.name!r}: {spec.path} does not fit architecture "
            f"{spec.architecture!r}: {exc}"
        ) from None
    num_classes = spec.num_classes
    if num_classes is None:  # one forward pass tells the number of outputs
        try:
            with torch.no_grad():
                num_classes = module.eval()(torch.zeros(1, *spec.input_shape)).shape[1]
        except (RuntimeError, IndexError) as exc:
            raise ConfigError(
                f"model {spec.name!r}: architecture {spec.architecture!r} does not run on "
                f"input_shape {spec.input_shape} ({exc}); check input_shape"
            ) from None
    mean, std = normalisation(spec)
    return TorchPredictor(
        module, spec.input_shape, num_classes, name=spec.name, mean=mean, std=std, device=device
    )


def apply_defenses(
    predictor: Predictor, defenses: tuple[DefenseSpec, ...], registry: Registry
) -> Predictor:
    for spec in defenses:
        inner = predictor.name
        predictor = registry.create("defense", spec.name, spec.config, predictor)
        predictor.name = f"{inner}+{spec.label}"  # its settings too: BPDA or not, 2 or 4 bits
    return predictor


def load_data(spec: DatasetSpec, registry: Registry) -> LoadedDataset:
    source = registry.get("dataset", spec.name)()
    data = source.load(spec.path, spec.split)
    if spec.sampling == "uniform":
        return data.uniform_subset(spec.limit, spec.seed)
    return data.balanced_subset(spec.limit, spec.seed)


def fingerprint(data: LoadedDataset) -> str:
    """sha256 of the evaluated images and labels: identical data, identical rows."""
    digest = hashlib.sha256(data.x.numpy().tobytes())
    digest.update(data.y.numpy().tobytes())
    return digest.hexdigest()
