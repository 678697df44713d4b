"""Predictor for a TorchScript archive (``torch.jit.save``): gradients, scores and labels.

A scripted or traced module carries its own code, so no architecture has to be named. Its
internal layers are not addressable by forward hooks: a loaded archive's submodules refuse
them (``register_forward_hook is not supported on ScriptModules``), and on a module traced in
this process they register but never fire (torch 2.13, checked in tests/test_own_model.py).
So activations are not offered, nor verification (its code is one opaque ``forward`` call
that torch.fx cannot trace into); ``unavailable`` names the sources that give both.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from aisafety.errors import AISafetyWarning, ConfigError
from aisafety.files import MAX_MODEL_BYTES, intact_archive, regular_file
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor
from aisafety.prediction.fixed_batch import run_fixed
from aisafety.prediction.outputs import classes_of, model_raised
from aisafety.prediction.own_normalisation import normalised_twice
from aisafety.prediction.torch_module import Normalize


def _jit_load(
    source: str | Path | bytes, device: torch.device, file: str | None = None
) -> torch.jit.ScriptModule:
    """``torch.jit.load`` with a clear error; its deprecation warning is not the user's fault.
    ``file``: where bytes were read from, named in the error."""
    if isinstance(source, bytes):
        target: io.BytesIO | str = io.BytesIO(source)
        label = f"TorchScript model {file!r}" if file else "TorchScript archive"
        intact_archive(source, label if file else "the TorchScript archive")
    else:
        path = regular_file(source, "TorchScript model", MAX_MODEL_BYTES)
        target, label = str(path), str(path)
        intact_archive(path, f"TorchScript model {label!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(target, map_location=device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"{label} is not a TorchScript archive ({exc}); save models with "
            "torch.jit.save(torch.jit.script(model), path), or load a state dict as a checkpoint"
        ) from None


UNAVAILABLE = {
    "activations": (
        "a TorchScript archive's layers cannot be hooked (its submodules refuse forward "
        "hooks); load the model with source: python (its module, optionally with a state "
        "dict) or source: export (a torch.export .pt2 archive) for activations"
    ),
    "bounds": (
        "a TorchScript archive cannot be bounded (its code is one opaque call that torch.fx "
        "cannot trace into); load it with source: python, export or onnx for verification"
    ),
}


# PyTorch's inference fast paths of nn.TransformerEncoderLayer and nn.MultiheadAttention
# (eval mode, autograd off): a trace under torch.no_grad() records them, with no derivative
NO_DERIVATIVE = ("aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention")


def inference_only_ops(script: torch.jit.ScriptModule) -> list[str]:
    """The fast-path operators at the top level of the archive's graph, where a trace puts
    them; a scripted module keeps them in a branch it leaves when gradients are on."""
    try:
        nodes = script.inlined_graph.nodes()
    except (AttributeError, RuntimeError):
        return []
    return sorted({node.kind() for node in nodes if node.kind() in NO_DERIVATIVE})


def no_gradients(ops: list[str]) -> str:
    """Why an archive with ``ops`` gives no gradients, and the ways on."""
    return (
        f"its graph holds {', '.join(ops)}, PyTorch's inference fast path of "
        "nn.TransformerEncoderLayer / nn.MultiheadAttention, which has no derivative "
        "(torch.jit.trace under torch.no_grad() records it); trace the model again with "
        "gradients on (no torch.no_grad() around torch.jit.trace), or load it with source: "
        "python or export; score-based attacks (square-linf) run on it as it is."
    )


class TorchScriptPredictor(Predictor):
    """A TorchScript module with optional mean/std normalisation in front of it.

    ``file``: the file an archive given as bytes was read from (a plan's ``path``: the
    loader reads the file once, for its fingerprint too), named in warnings and errors."""

    def __init__(
        self,
        model: str | Path | bytes | torch.jit.ScriptModule,
        input_shape: Sequence[int],
        num_classes: int | None = None,
        *,
        name: str | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device: str | torch.device = "cpu",
        file: str | Path | None = None,
    ):
        self.device = torch.device(device)
        if not isinstance(model, bytes | torch.jit.ScriptModule):
            file = model
        self.file = str(file) if file is not None else None
        if isinstance(model, torch.jit.ScriptModule):
            script = model.to(self.device)
        else:
            script = _jit_load(model, self.device, self.file)
        self.name = name or (Path(self.file).name if self.file else "torchscript-model")
        self.input_shape = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
        if len(self.input_shape) != 3:
            raise ConfigError(f"input_shape is (C, H, W), got {tuple(input_shape)}")
        channels = self.input_shape[0]
        self.script = script.eval()
        self.normalised_twice = normalised_twice(self.script, mean, std)
        self.network = nn.Sequential(
            Normalize(mean or [0.0] * channels, std or [1.0] * channels), self.script
        ).to(self.device)
        self.shared = isinstance(model, torch.jit.ScriptModule)  # the caller's live module
        if not self.shared:
            for p in self.network.parameters():
                p.requires_grad_(False)
        self.capabilities = frozenset({Capability.LABELS, Capability.SCORES, Capability.GRADIENTS})
        self.unavailable = UNAVAILABLE
        if fast := inference_only_ops(self.script):  # refused before any work, not mid-attack
            self.capabilities -= {Capability.GRADIENTS}
            self.unavailable = {**UNAVAILABLE, "gradients": no_gradients(fast)}
        self.batch: int | None = None  # the one batch size a traced archive runs at
        probed = self._probe()  # also with num_classes given: it learns the batch
        self.num_classes = int(num_classes) if num_classes else classes_of(self.name, probed)

    def _probe(self) -> torch.Tensor:
        """The outputs for two images, or for one where only one runs: an archive traced
        on one image with its batch size turned into a constant, run image by image."""
        try:
            return self._zeros_forward(2)
        except Exception as exc:  # torch.jit.Error, or whatever the archive's code raises
            try:
                out, self.batch = self._zeros_forward(1), 1
            except Exception:
                raise self._refusal(exc) from None
            warnings.warn(self._one_by_one(), AISafetyWarning, stacklevel=3)
            return out

    def _one_by_one(self) -> str:
        """Why the run is slower than the archive need be: right, but one image per pass."""
        archive = f"TorchScript archive {self.file!r}" if self.file else "the TorchScript archive"
        return (
            f"model {self.name!r}: {archive} runs on one image but not on two (traced on one "
            "image with its batch size turned into a constant), so it runs one image per "
            "forward pass: its results are right but slow; script it (torch.jit.script), "
            "trace it again on one image with a dynamic batch (x.flatten(1) or "
            "x.reshape(x.shape[0], -1), not int(x.shape[0])), or export it with torch.export "
            "(source: export)"
        )

    def _zeros_forward(self, n: int) -> torch.Tensor:
        with torch.inference_mode():
            return self.network(torch.zeros((n, *self.input_shape), device=self.device))

    def _refusal(self, exc: Exception) -> ConfigError:
        """Neither one image nor two run: the shape is wrong, or the archive was traced with
        a fixed batch above one, which it does not record (its input is a bare Tensor)."""
        fix = (
            "check input_shape; if it was traced with torch.jit.trace on a batch of N > 1 "
            "and runs only at that N (a batch size became a constant), script it "
            "(torch.jit.script), trace it again on a batch of one or with the batch read "
            "from x.shape[0], or export it with torch.export (source: export runs a fixed "
            "batch at its own size)"
        )
        return model_raised(self.name, exc, f"on input_shape {self.input_shape}", fix)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        with frozen(self.network) if self.shared else nullcontext():
            if self.batch is None:
                return self.network(x)
            return run_fixed(self.network, x, self.batch)


@contextmanager
def frozen(network: nn.Module) -> Iterator[None]:
    """Parameters off autograd's graph during one forward pass, then as they were.

    A live module (``torch.jit.trace(net, x)``) shares its parameters with the caller's
    ``net``: frozen for good, the net's next ``loss.backward()`` failed (session 21). Frozen
    only while the graph is recorded, the attacks' gradients still leave the weights out."""
    wanted = [(p, p.requires_grad) for p in network.parameters()]
    for parameter, _ in wanted:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in wanted:
            parameter.requires_grad_(flag)


def load_torchscript(
    path: str | Path | bytes,
    input_shape: Sequence[int] = (1, 28, 28),
    num_classes: int | None = None,
    **kwargs,
) -> TorchScriptPredictor:
    """Shorthand for ``TorchScriptPredictor(path, input_shape, num_classes, **kwargs)``."""
    return TorchScriptPredictor(path, input_shape, num_classes, **kwargs)
