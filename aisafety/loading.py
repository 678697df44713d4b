"""Turn specs into live objects: a predictor for a ModelSpec, tensors for a DatasetSpec."""

from __future__ import annotations

import hashlib
import warnings

import torch

from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import list_models, load_zoo_model, sha256_bytes
from aisafety.errors import AISafetyError, ConfigError, NormalisedTwiceWarning, UnknownNameError
from aisafety.files import MAX_MODEL_BYTES, intact_archive, read_regular_file, regular_file
from aisafety.interfaces import DatasetSpec, DefenseSpec, ModelSpec
from aisafety.plugins import Registry, default_registry
from aisafety.prediction.base import Predictor
from aisafety.prediction.outputs import classes_of, model_raised
from aisafety.prediction.own_normalisation import given_normalisation, twice_message
from aisafety.prediction.python_factory import build_module, resolve_factory
from aisafety.prediction.state_dict import load_into, read_state_dict
from aisafety.prediction.torch_module import TorchPredictor, module_fingerprint, weight_dtype


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device 'cuda' was asked for but {_no_cuda_cause()}")
    return torch.device(device)


def _no_cuda_cause() -> str:
    """Why torch sees no GPU, and the setting to change: a CPU-only build of torch (the
    usual case on a laptop) needs another install, not a driver."""
    setting = "set device: cpu (or auto: the GPU where torch sees one) in the plan, or --device cpu"
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
            f"{setting}, or install a CUDA build of torch (README.md, Install)"
        )
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU (driver, "
        f"CUDA_VISIBLE_DEVICES); {setting}"
    )


def _model_path(spec: ModelSpec):
    """The model file, checked by stat before anything reads it (``files.regular_file``)."""
    return regular_file(spec.path, f"model {spec.name!r}: file", MAX_MODEL_BYTES)


def _read_model_file(spec: ModelSpec) -> bytes:
    """The file's bytes; a zip archive (checkpoint, torch.export) only if its CRCs match."""
    data = read_regular_file(spec.path, f"model {spec.name!r}: file", MAX_MODEL_BYTES)
    intact_archive(data, f"model {spec.name!r}: file {str(spec.path)!r}")
    return data


def normalisation(spec: ModelSpec) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The plan's input domain as the predictor's (x - mean) / std on [0, 1] images.

    The network takes ``(x * scale - mean) / std``, which is ``(x - mean / scale) /
    (std / scale)``: one normalisation, so the bound graph sees it as any other.
    """
    return scaled_normalisation(spec.mean, spec.std, spec.scale)


def scaled_normalisation(mean, std, scale: float) -> tuple:
    """``(x * scale - mean) / std`` as ``(x - mean') / std'`` (``normalisation``'s rule,
    shared with ``aisafety serve --scale``)."""
    if scale == 1.0:
        return mean, std
    return tuple(m / scale for m in (mean or (0.0,))), tuple(s / scale for s in (std or (1.0,)))


def load_model(
    spec: ModelSpec, device: torch.device, registry: Registry | None = None
) -> tuple[Predictor, str]:
    """The predictor and a fingerprint of what it computes (the sha256 of its file, or of
    a ``python`` model's code and weights)."""
    registry = registry or default_registry()
    if spec.source == "zoo":  # a zoo model, else a plugin's model entry of that name
        zoo = list_models()
        if spec.name not in zoo and spec.name in registry.classes["model"]:
            return load_model(registry.get("model", spec.name).model_spec(), device, registry)
        if spec.name not in zoo:
            raise UnknownNameError("zoo model", spec.name, {*zoo, *registry.classes["model"]})
        return load_zoo_model(spec.name, device), zoo[spec.name][0].sha256
    if spec.source == "remote":
        from aisafety.prediction.remote import RemotePredictor

        settings = {
            k: getattr(spec, k) for k in ("timeout", "retries") if getattr(spec, k) is not None
        }
        predictor = RemotePredictor(
            spec.url, spec.name, spec.input_shape, spec.num_classes, name=spec.name, **settings
        )
        return predictor, sha256_bytes(f"{spec.url}|{spec.name}".encode())
    if spec.scale != 1.0:  # every source below reads the domain as mean and std
        mean, std = normalisation(spec)
        spec = spec.model_copy(update={"mean": mean, "std": std, "scale": 1.0})
    if spec.source == "python":
        return _load_python(spec, device)
    if spec.source == "robustbench":
        return _load_robustbench(spec, device)
    if spec.source == "object":
        raise ConfigError(
            f"model {spec.name!r} was handed to aisafety.evaluate(model=...) in memory; a plan "
            "cannot load it again: pass the module again with model=, or describe it with "
            "source: python (docs/own-model.md)"
        )
    if spec.source == "onnx":
        from aisafety.prediction.onnx_model import load_onnx, read_onnx

        data = read_onnx(_model_path(spec), spec.name)  # with its external weights read in
        predictor = load_onnx(
            data, spec.gradients, input_shape=spec.input_shape, num_classes=spec.num_classes,
            name=spec.name, mean=spec.mean, std=spec.std, device=device, layout=spec.layout,
        )  # fmt: skip
        predictor.normalised_twice = onnx_normalised_twice(spec)
    elif spec.source == "torchscript":
        from aisafety.prediction.torchscript import TorchScriptPredictor

        data = _read_model_file(spec)
        predictor = TorchScriptPredictor(
            data, spec.input_shape, spec.num_classes,
            name=spec.name, mean=spec.mean, std=spec.std, device=device, file=spec.path,
        )  # fmt: skip
    elif spec.source == "export":
        data = _read_model_file(spec)
        predictor = _load_export(spec, data, device)
    else:
        data = _read_model_file(spec)
        predictor = _load_checkpoint(spec, data, device, registry)
    return predictor, sha256_bytes(data)


def onnx_normalised_twice(spec: ModelSpec) -> tuple[str, str] | None:
    """The plan's ``mean``/``std`` and the graph's own normalisation where both normalise:
    the graph's input goes first through ``Sub`` by a nonzero constant, then ``Div``/``Mul``
    (``graph_range``, what ``aisafety verify`` reads). The graph is read only then."""
    given = given_normalisation(spec.mean, spec.std)
    if given is None:
        return None
    from aisafety.verification.input_space import graph_range

    try:
        own = graph_range(_model_path(spec), 1)
    except Exception:  # noqa: BLE001 - a graph it cannot read: load_onnx ran it already
        return None
    return None if own is None else (given, f"ONNX graph: {own.source} pixels")


def warn_normalised_twice(predictor: Predictor) -> None:
    """The warning for a network fed inputs normalised twice (``normalised_twice``), where
    the run keeps it: the runner calls it on the loaded model and on one handed in."""
    if predictor.normalised_twice is not None:
        message = twice_message(predictor.name, predictor.normalised_twice)
        warnings.warn(message, NormalisedTwiceWarning, stacklevel=2)


def _load_checkpoint(
    spec: ModelSpec, data: bytes, device: torch.device, registry: Registry
) -> Predictor:
    """A state dict loaded into an architecture of the registry (the zoo's or a plugin's)."""
    try:
        record = registry.get("architecture", spec.architecture)
    except UnknownNameError as exc:
        hint = (
            f"; to load your own module, use source: python with factory: {spec.architecture!r}"
            if ":" in spec.architecture
            else "; these are the zoo's and plugins' (aisafety list architectures): for a "
            "network of your own or of a library, use source: python with its factory "
            "(e.g. factory: 'torchvision.models:resnet50'), this path and input_shape "
            "(docs/own-model.md)"
        )
        error = UnknownNameError(exc.kind, exc.name, exc.known)
        error.args = (error.args[0] + hint,)
        raise error from None
    module = build_module(record.factory, None, spec.name, f"architecture {record.name!r}")
    load_into(module, read_state_dict(data, spec.name, spec.path), spec.name, spec.path)
    spec = spec.model_copy(
        update={
            field: getattr(record, field)
            for field in ("input_shape", "num_classes", "mean", "std")
            if getattr(spec, field) is None
        }
    )
    return _module_predictor(spec, module, device)


def _load_python(spec: ModelSpec, device: torch.device) -> tuple[Predictor, str]:
    """The module ``factory(**kwargs)`` returns, with the state dict at ``path`` if given."""
    factory = resolve_factory(spec.factory, spec.python_path, spec.name)
    module = build_module(factory, spec.kwargs, spec.name, f"factory {spec.factory!r}")
    if spec.path is not None:
        data = _read_model_file(spec)
        load_into(module, read_state_dict(data, spec.name, spec.path), spec.name, spec.path)
    return _module_predictor(spec, module, device), module_fingerprint(module, spec.factory)


def _load_robustbench(spec: ModelSpec, device: torch.device) -> tuple[Predictor, str]:
    """A RobustBench network from its checkpoint in ``model_dir``, its normalisation inside."""
    from aisafety.prediction.robustbench_model import CLASSES, INPUT_SHAPES, load_robustbench

    module, file = load_robustbench(
        spec.name, spec.model_dir, spec.dataset, spec.threat_model, spec.name
    )
    shape, classes = INPUT_SHAPES[spec.dataset], CLASSES[spec.dataset]
    spec = spec.model_copy(update={"input_shape": shape, "num_classes": classes})
    weights = read_regular_file(file, f"model {spec.name!r}: file", MAX_MODEL_BYTES)
    digest = hashlib.sha256(weights)  # the weights, and which RobustBench entry built them
    digest.update(f"robustbench|{spec.name}|{spec.dataset}|{spec.threat_model}".encode())
    return _module_predictor(spec, module, device), digest.hexdigest()


def _load_export(spec: ModelSpec, data: bytes, device: torch.device) -> Predictor:
    from aisafety.prediction.exported import ExportedPredictor, exported_input, load_exported

    program = load_exported(data, spec.name)
    batch, _ = exported_input(program, spec.name)  # a fixed batch runs only at its own size
    num_classes = spec.num_classes or probe_classes(
        spec.name,
        program.module(),
        spec.input_shape,
        input_shape_fix(spec.input_shape),
        batch or 1,
    )  # eval at export
    return ExportedPredictor(
        program, spec.input_shape, num_classes,
        name=spec.name, mean=spec.mean, std=spec.std, device=device,
    )  # fmt: skip


def _module_predictor(spec: ModelSpec, module: torch.nn.Module, device) -> TorchPredictor:
    num_classes = spec.num_classes or _probe_classes(spec, module.eval())
    return TorchPredictor(
        module, spec.input_shape, num_classes,
        name=spec.name, mean=spec.mean, std=spec.std, device=device,
    )  # fmt: skip


def _probe_classes(spec: ModelSpec, module: torch.nn.Module) -> int:
    return probe_classes(spec.name, module, spec.input_shape, input_shape_fix(spec.input_shape))


def input_shape_fix(shape: tuple[int, ...]) -> str:
    """What to check when a module does not run on ``shape``: it is one image's (C, H, W),
    and a channels-last one (32, 32, 3) is written the other way round ([3, 32, 32])."""
    fix = (
        "check input_shape: one image's (C, H, W), channels first, as every module is fed (a "
        "module written for channels-last batches is wrapped to run net(x.permute(0, 2, 3, 1)))"
    )
    if len(shape) == 3 and shape[-1] in (1, 3) and shape[0] not in (1, 3):
        channels, height, width = shape[2], shape[0], shape[1]
        fix += f"; {tuple(shape)} reads as channels-last: write [{channels}, {height}, {width}]"
    return fix


def probe_classes(name: str, module: torch.nn.Module, shape, fix: str, batch: int = 1) -> int:
    """One forward pass on zero images tells the number of outputs; a module that does
    not run on ``shape`` is named with torch's first line and ``fix``, not a traceback.
    ``batch``: the size an exported program is fixed to (it refuses one image)."""
    try:
        with torch.no_grad():
            out = module(torch.zeros(batch, *shape, dtype=weight_dtype(module)))
    except AISafetyError:
        raise
    except Exception as exc:  # the user's forward can raise anything
        raise model_raised(name, exc, f"on input_shape {tuple(shape)}", fix) from None
    return classes_of(name, out)


def apply_defenses(
    predictor: Predictor, defenses: tuple[DefenseSpec, ...], registry: Registry
) -> Predictor:
    for spec in defenses:
        inner = predictor.name
        predictor = registry.create("defense", spec.name, spec.config, predictor)
        predictor.name = f"{inner}+{spec.label}"  # its settings too: BPDA or not, 2 or 4 bits
    return predictor


def load_data(spec: DatasetSpec, registry: Registry) -> LoadedDataset:
    """The plan's dataset, subset as its ``limit`` and ``sampling`` say."""
    return subset(load_whole_data(spec, registry), spec)


def load_whole_data(spec: DatasetSpec, registry: Registry) -> LoadedDataset:
    """The whole split the plan names, before its ``limit``: the labels are checked on it,
    since a small subset can miss the one label the model cannot predict."""
    source = registry.get("dataset", spec.name)()
    data = source.load(spec.path, spec.split)
    if len(data) == 0:
        where = f" at {spec.path}" if spec.path else ""
        raise ConfigError(
            f"dataset {spec.name!r} ({spec.split} split{where}) holds no samples; give a "
            "file or folder with at least one image"
        )
    return data


def subset(data: LoadedDataset, spec: DatasetSpec) -> LoadedDataset:
    """``data`` cut to the plan's ``limit`` by its ``sampling``."""
    if spec.sampling == "uniform":
        return data.uniform_subset(spec.limit, spec.seed)
    return data.balanced_subset(spec.limit, spec.seed)


def fingerprint(data: LoadedDataset) -> str:
    """sha256 of the evaluated images and labels: identical data, identical rows."""
    digest = hashlib.sha256(data.x.numpy().tobytes())
    digest.update(data.y.numpy().tobytes())
    return digest.hexdigest()


def predictor_fingerprint(predictor: Predictor) -> str:
    """sha256 of what an in-memory predictor computes: its network's code and weights, or
    for a predictor without one its class's code and its logits on a fixed random batch."""
    network = getattr(predictor, "network", None)
    if isinstance(network, torch.nn.Module):
        return module_fingerprint(network, type(predictor).__qualname__)
    probe = torch.rand((4, *predictor.input_shape), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = predictor.logits(probe).detach().cpu().double().numpy()
    return sha256_bytes(
        module_fingerprint(torch.nn.Module(), type(predictor).__qualname__).encode()
        + logits.tobytes()
    )
