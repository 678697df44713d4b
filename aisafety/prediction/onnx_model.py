"""ONNX models: onnxruntime for scores, a checked conversion to PyTorch for gradients.

``OnnxRuntimePredictor`` runs the graph as it is (scores and labels only): it maps the
platform's (N, C, H, W) batches onto whatever input layout the graph declares (e.g. the
VNN-COMP ``[1, 784, 1]``) and copes with graphs exported with a fixed batch dimension.

``load_onnx(path, gradients=True)`` converts the graph with onnx2torch (after the rewrites
of ``onnx_rewrite.py``, with the converters ``onnx_converters.py`` adds) and checks, at load
time, that the PyTorch module computes what onnxruntime computes on the file as shipped
before any attack trusts its gradients.

A graph taking channels-last images (Keras/TF converters: ``[N, H, W, C]``) is loaded with
``layout="nhwc"``: the platform still feeds (N, C, H, W) images in [0, 1], and the
predictor transposes them (``ChannelsLast``) after normalising.

onnxruntime, onnx and onnx2torch are optional (``install_command()``: the ``onnx`` extra, and
onnx2torch without its dependencies) and are only imported when an ONNX model is loaded.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aisafety.errors import AISafetyError, CapabilityError, ConfigError
from aisafety.files import MAX_MODEL_BYTES, read_regular_file, regular_file
from aisafety.interfaces import Capability
from aisafety.prediction import onnx_converters, onnx_rewrite, onnx_tensors
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor, check_normalisation


class OnnxConversionError(AISafetyError):
    """The ONNX graph could not be turned into a PyTorch module that computes the same."""


ONNX2TORCH = "onnx2torch==1.5.15"


def install_command() -> str:
    """A command that installs ONNX support without touching the installed torch.

    onnx2torch's metadata requires torchvision; resolved by pip, that takes the newest
    torchvision and with it a newer torch (from PyPI: a CUDA build of several GB, even over
    a CPU torch). It is pure Python and needs torchvision only for detection operators
    (``_onnx2torch`` stands in for it), so it is installed without its dependencies; the
    ``onnx`` extra brings the ones it uses (onnx, numpy).
    """
    return f"pip install 'aisafety[onnx]' && pip install --no-deps '{ONNX2TORCH}'"


def import_optional(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"loading ONNX models needs the package {package!r} ({exc}); install it, keeping "
            f"your torch {torch.__version__}, by: {install_command()}"
        ) from None


def _onnx2torch() -> Any:
    """Import onnx2torch even where torchvision is absent or unusable.

    onnx2torch imports torchvision at package import time, only to convert the detection
    operators NonMaxSuppression and RoiAlign. Installing torchvision from PyPI drags in a
    CUDA build of torch, so where it cannot be imported a stand-in module is put in place
    for the duration of the import: classifiers convert normally, and a graph that really
    uses those operators fails with a message saying torchvision is needed.
    """
    try:
        return importlib.import_module("onnx2torch")
    except ImportError as exc:
        if not (exc.name or "").startswith("torchvision"):
            import_optional("onnx2torch", "onnx2torch")  # raises the install hint
            raise
    except RuntimeError:  # a torchvision build that does not fit the installed torch
        pass
    for name in [m for m in sys.modules if m.split(".")[0] in {"onnx2torch", "torchvision"}]:
        del sys.modules[name]

    def missing(attribute: str) -> Any:
        def unavailable(*_args: Any, **_kwargs: Any) -> Any:
            raise OnnxConversionError(
                f"this ONNX graph uses torchvision.ops.{attribute} (a detection operator); "
                "install a torchvision build matching your torch to convert it"
            )

        return unavailable

    stub = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    ops.__getattr__ = missing  # type: ignore[method-assign]
    stub.ops = ops  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = stub, ops
    try:
        return importlib.import_module("onnx2torch")
    finally:  # nobody else may mistake the stand-in for torchvision
        for name in ("torchvision", "torchvision.ops"):
            sys.modules.pop(name, None)


LAYOUTS = ("nchw", "nhwc")


def _read(model: str | Path | bytes) -> tuple[bytes, str]:
    if isinstance(model, bytes):
        return model, "onnx-model"
    path = regular_file(model, "ONNX model", MAX_MODEL_BYTES)  # by stat, before reading
    return read_onnx(path, path.name), path.name


def read_onnx(path: Path, name: str) -> bytes:
    """The file's bytes, with weights kept beside it (``external data``, as torch's dynamo
    exporter writes them: ``model.onnx.data``) read in, so the graph travels as one blob."""
    if not path.is_file():
        raise ConfigError(f"model {name!r}: ONNX file {str(path)!r} does not exist")
    data = read_regular_file(path, f"model {name!r}: ONNX file", MAX_MODEL_BYTES)
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        return data
    helper = onnx.external_data_helper
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf's DecodeError, and whatever a newer onnx raises
        raise ConfigError(
            f"model {name!r}: {str(path)!r} is not an ONNX model ({type(exc).__name__}: "
            f"{str(exc)[:200]}); export one with torch.onnx.export(model, example, path)"
        ) from None
    external = [t for t in onnx_tensors.all_tensors(model) if helper.uses_external_data(t)]
    if not external:  # the bytes as shipped, not a re-serialisation
        return data
    try:
        for tensor in external:
            helper.load_external_data_for_tensor(tensor, str(path.parent))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model {name!r}: {path.name} keeps its weights in a separate file that cannot be "
            f"read ({exc}); keep the .data file the exporter wrote beside it"
        ) from None
    return model.SerializeToString()


def _relax_batch(data: bytes) -> bytes | None:
    """The graph with a symbolic batch dimension on its inputs and outputs, if onnx is here."""
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        return None
    model = onnx.load_from_string(data)
    onnx_rewrite.bypass_identities(model)
    onnx_rewrite.free_batch_in_reshapes(model, onnx.numpy_helper)
    initializers = {init.name for init in model.graph.initializer}
    for value in [*model.graph.input, *model.graph.output]:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims):
            dims[0].dim_param = "batch"  # clears the fixed dim_value (a protobuf oneof)
    del model.graph.value_info[:]  # intermediate shapes are inferred again
    return model.SerializeToString()


class OnnxRuntimePredictor(Predictor):
    """An ONNX graph run by onnxruntime: scores and labels, no gradients.

    ``input_shape`` is the (C, H, W) the platform feeds; it is read from the graph when the
    graph takes 4-D images (``[N, H, W, C]`` ones with ``layout="nhwc"``), and must be given
    otherwise (e.g. ``(1, 28, 28)`` for a graph
    taking ``[1, 784, 1]``). A graph exported with a fixed batch dimension is run with its
    batch dimension made symbolic when onnxruntime accepts that and gives the same numbers
    on a probe, and in chunks of the fixed size otherwise.
    """

    engine = "an ONNX Runtime model (onnxruntime runs its graph, not PyTorch)"

    def __init__(
        self,
        model: str | Path | bytes,
        input_shape: Sequence[int] | None = None,
        num_classes: int | None = None,
        *,
        name: str | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        batch_size: int = 1024,
        providers: Sequence[str] | None = None,
        relax_batch: bool = True,
        layout: str = "nchw",
    ):
        ort = import_optional("onnxruntime", "onnxruntime")
        data, default_name = _read(model)
        self.name = name or default_name
        if layout not in LAYOUTS:
            raise ConfigError(f"model {self.name!r}: layout is one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self._ort = ort
        self._providers = list(providers or ["CPUExecutionProvider"])
        self.session = self._session(data)
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ConfigError(
                f"ONNX model {self.name!r} has {len(inputs)} inputs "
                f"({', '.join(i.name for i in inputs)}); only single-input classifiers "
                "are supported"
            )
        graph_input = inputs[0]
        if graph_input.type != "tensor(float)":
            raise ConfigError(
                f"ONNX model {self.name!r}: input {graph_input.name!r} is {graph_input.type}; "
                "only float32 inputs are supported"
            )
        self.input_name = graph_input.name
        self.graph_shape = list(graph_input.shape)
        self.input_shape, self.feed_shape = self._shapes(input_shape)  # type: ignore[assignment]
        self.capabilities = frozenset({Capability.SCORES, Capability.LABELS})
        self.device = torch.device("cpu")
        channels = self.input_shape[0]
        self._mean = np.asarray(mean or [0.0] * channels, np.float32).reshape(1, -1, 1, 1)
        self._std = np.asarray(std or [1.0] * channels, np.float32).reshape(1, -1, 1, 1)
        check_normalisation(self._mean.ravel().tolist(), self._std.ravel().tolist())
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0, got {batch_size}")
        self.batch_size = batch_size
        fixed = self.graph_shape[0] if isinstance(self.graph_shape[0], int) else None
        self.fixed_batch = fixed if fixed and fixed > 0 else None
        if self.fixed_batch is not None and relax_batch:
            self._try_relaxed(data)
        self.num_classes = int(num_classes) if num_classes else self._probe_classes()

    def require(self, capability: Capability, user: str) -> None:
        """The refusal names the way to gradients on this very file: ``gradients: true``."""
        try:
            super().require(capability, user)
        except CapabilityError as exc:
            if capability is not Capability.GRADIENTS:
                raise
            raise CapabilityError(
                f"{exc} For this ONNX file set gradients: true in the plan's model (e.g. "
                f"{{name: {self.name}, source: onnx, path: ..., gradients: true}}): the graph "
                "is converted to PyTorch by onnx2torch and checked against onnxruntime "
                "(docs/prediction.md)."
            ) from None

    def _session(self, data: bytes) -> Any:
        try:
            return self._ort.InferenceSession(
                data, self._session_options(), providers=self._providers
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ConfigError(f"onnxruntime cannot load ONNX model {self.name!r}: {exc}") from None

    def _shapes(self, given: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The platform's (C, H, W) and the per-sample shape the graph is fed."""
        sample = self.graph_shape[1:]
        concrete = all(isinstance(d, int) and d > 0 for d in sample)
        if given is not None:
            shape = tuple(int(s) for s in given)
            if len(shape) != 3:
                raise ConfigError(f"input_shape is (C, H, W), got {tuple(given)}")
        elif concrete and len(sample) == 3:
            self._check_layout(sample)
            shape = tuple(sample) if self.layout == "nchw" else (sample[2], sample[0], sample[1])
        else:
            raise ConfigError(
                f"ONNX model {self.name!r} takes input {self.input_name!r} of shape "
                f"{self.graph_shape}, which is not (N, C, H, W); give input_shape=(C, H, W), "
                "e.g. (1, 28, 28)"
            )
        if not concrete:
            if len(sample) != 3:
                raise ConfigError(
                    f"ONNX model {self.name!r}: cannot map (N, {', '.join(map(str, shape))}) "
                    f"onto the graph's input shape {self.graph_shape}"
                )
            return shape, shape
        if math.prod(sample) != math.prod(shape):
            raise ConfigError(
                f"ONNX model {self.name!r} takes {math.prod(sample)} values per sample "
                f"(input shape {self.graph_shape}), but input_shape {shape} has "
                f"{math.prod(shape)}; give the (C, H, W) the graph was trained on"
            )
        return shape, tuple(sample)

    def _check_layout(self, sample: Sequence[int]) -> None:
        """``layout: nhwc`` on a channels-first graph was read as H=3, W=32, C=32, and the
        first batch was refused with "takes (N, 32, 3, 32) ... resize the images"."""
        channels_first = sample[0] in (1, 3) and sample[2] not in (1, 3)
        if self.layout == "nhwc" and channels_first:
            raise ConfigError(
                f"ONNX model {self.name!r}: layout is nhwc, but the graph's input "
                f"{self.graph_shape} is channels-first (N, C, H, W); remove layout: nhwc"
            )

    def _try_relaxed(self, data: bytes) -> None:
        """Switch to a symbolic batch dimension if it gives the same numbers."""
        relaxed = _relax_batch(data)
        if relaxed is None:
            return
        try:
            session = self._ort.InferenceSession(
                relaxed, self._session_options(), providers=self._providers
            )
            probe = np.random.default_rng(0).random((3, *self.feed_shape), dtype=np.float32)
            batched = session.run(None, {self.input_name: probe})[0].reshape(3, -1)
            single = self._run_chunks(probe, self.session, self.fixed_batch)
        except Exception:  # the graph hard-codes its batch size somewhere: keep chunking
            return
        if batched.shape == single.shape and np.allclose(batched, single, rtol=1e-5, atol=1e-5):
            self.session, self.fixed_batch = session, None

    def _session_options(self) -> Any:
        options = self._ort.SessionOptions()
        options.log_severity_level = 3  # warnings about the relaxed shapes are expected
        # onnxruntime's worker threads otherwise spin after each run, starving the torch
        # code (attacks) that runs between two queries in the same process
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        return options

    def _probe_classes(self) -> int:
        dims = self.session.get_outputs()[0].shape
        if dims and isinstance(dims[-1], int) and dims[-1] > 1:
            return int(dims[-1])
        probe = np.zeros((1, *self.feed_shape), np.float32)
        return int(self._run_chunks(probe, self.session, self.fixed_batch).shape[1])

    def _run_chunks(self, x: np.ndarray, session: Any, fixed: int | None) -> np.ndarray:
        step = fixed or self.batch_size
        parts = []
        for start in range(0, len(x), step):
            chunk = x[start : start + step]
            real = len(chunk)
            if fixed is not None and real < fixed:  # pad a short last chunk to the fixed size
                pad = np.zeros((fixed - real, *chunk.shape[1:]), chunk.dtype)
                chunk = np.concatenate([chunk, pad])
            out = session.run(None, {self.input_name: np.ascontiguousarray(chunk)})[0]
            parts.append(np.asarray(out, np.float32).reshape(len(chunk), -1)[:real])
        if not parts:
            return np.zeros((0, getattr(self, "num_classes", 0)), np.float32)
        return np.concatenate(parts)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        array = x.detach().cpu().numpy()
        array = ((array - self._mean) / self._std).astype(np.float32, copy=False)
        if self.layout == "nhwc":
            array = array.transpose(0, 2, 3, 1)
        return self.run_network(array)

    def run_network(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The graph's logits on inputs in its own input space and layout (no [0, 1] check,
        no normalisation): VNN-LIB properties live there (``verification/vnncomp.py``)."""
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        array = np.ascontiguousarray(x, np.float32).reshape(len(x), *self.feed_shape)
        return torch.from_numpy(self._run_chunks(array, self.session, self.fixed_batch))


class GraphLayout(nn.Module):
    """Reshape (N, C, H, W) batches to the per-sample shape an ONNX graph takes."""

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape=(N, {', '.join(map(str, self.shape))})"


class ChannelsLast(nn.Module):
    """(N, C, H, W) -> (N, H, W, C), for graphs taking channels-last images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1)


class OnnxTorchPredictor(TorchPredictor):
    """An ONNX graph converted to PyTorch (gradients, activations), checked against onnxruntime."""

    source: str = ""
    max_difference: float = 0.0


def convert_onnx(model: str | Path | bytes, name: str | None = None) -> nn.Module:
    """The graph as a ``torch.fx.GraphModule`` (onnx2torch); taking the graph's own layout."""
    data, default_name = _read(model)
    name = name or default_name
    onnx = import_optional("onnx", "onnx")
    converter = _onnx2torch()
    onnx_converters.register()
    try:
        rewritten = onnx_rewrite.rewrite(data, onnx, import_optional("onnxruntime", "onnxruntime"))
        return converter.convert(onnx.load_from_string(rewritten))
    except Exception as exc:  # unsupported operator or opset
        detail = f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc)
        raise OnnxConversionError(
            f"ONNX model {name!r} cannot be converted to PyTorch by onnx2torch ({detail}). "
            "Load it with gradients: false (scores only) and use score- or decision-based "
            "attacks, or report the operator (docs/prediction.md)"
        ) from None


def load_onnx(
    model: str | Path | bytes,
    gradients: bool = False,
    *,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    name: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str | torch.device = "cpu",
    layout: str = "nchw",
    tolerance: float = 1e-5,
    probe_size: int = 16,
    seed: int = 0,
) -> Predictor:
    """An ONNX model as a predictor.

    Without ``gradients`` it is run by onnxruntime (scores and labels). With ``gradients``
    the graph is converted to PyTorch, and the conversion is accepted only if its logits
    equal onnxruntime's within ``tolerance`` (absolute, scaled by the logits' magnitude when
    that exceeds 1) on a probe batch of random, all-black and all-white images.
    """
    data, default_name = _read(model)
    name = name or default_name
    reference = OnnxRuntimePredictor(
        data, input_shape, num_classes, name=name, mean=mean, std=std, layout=layout
    )
    if not gradients:
        return reference
    layers = [ChannelsLast()] if layout == "nhwc" else []
    layers += [GraphLayout(reference.feed_shape), convert_onnx(data, name)]
    module = nn.Sequential(*layers)
    predictor = OnnxTorchPredictor(
        module,
        reference.input_shape,
        reference.num_classes,
        name=name,
        mean=mean,
        std=std,
        device=device,
    )
    generator = torch.Generator().manual_seed(seed)
    probe = torch.cat(
        [
            torch.rand((probe_size, *reference.input_shape), generator=generator),
            torch.zeros((1, *reference.input_shape)),
            torch.ones((1, *reference.input_shape)),
        ]
    )
    expected = reference.logits(probe)
    try:
        with torch.inference_mode():
            got = predictor.logits(probe.to(predictor.device)).cpu()
    except Exception as exc:
        raise OnnxConversionError(
            f"ONNX model {name!r}: the PyTorch conversion fails on a batch of "
            f"{len(probe)} images ({type(exc).__name__}: {exc}); the graph may hard-code its "
            "batch size somewhere other than a constant Reshape. Load it with gradients: false "
            "(scores only)"
        ) from None
    if got.shape != expected.shape:
        raise OnnxConversionError(
            f"ONNX model {name!r}: the PyTorch conversion gives outputs of shape "
            f"{tuple(got.shape)}, onnxruntime {tuple(expected.shape)}; load it with "
            "gradients=False (scores only)"
        )
    difference = float((got - expected).abs().max())
    allowed = tolerance * max(1.0, float(expected.abs().max()))
    if not difference <= allowed:
        raise OnnxConversionError(
            f"ONNX model {name!r}: the PyTorch conversion differs from onnxruntime by "
            f"{difference:.3g} (> {allowed:.3g}) on a probe batch, so its gradients cannot be "
            "trusted; load it with gradients=False (scores only) or report the operator "
            "onnx2torch gets wrong"
        )
    predictor.source = "" if isinstance(model, bytes) else str(model)
    predictor.max_difference = difference
    return predictor
