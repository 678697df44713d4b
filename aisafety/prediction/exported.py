"""Predictor for a ``torch.export`` archive (``.pt2``, ``torch.export.save``): gradients,
activations and, where its ops are boundable, verification.

An exported program carries its own graph, so no architecture has to be named. Logits and
activations run through ``torch.export.unflatten``, which rebuilds the module hierarchy
(``block.conv1``, ...) so forward hooks see the same layers as in the original module; the
verifier bounds the flat ATen graph (``ExportedProgram.module()``). A program exported with a
fixed batch size (the default of ``torch.export.export`` on one example) is run in chunks of
that size; it cannot be bounded (the verifier traces a batch of two).
"""

from __future__ import annotations

import importlib
import io
import logging
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from aisafety.errors import ConfigError
from aisafety.prediction.fixed_batch import fixed_batches, run_fixed
from aisafety.prediction.torch_module import TorchPredictor


def load_exported(data: bytes, model: str) -> torch.export.ExportedProgram:
    try:
        with warnings.catch_warnings(), _export_log_kept() as logged:
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecations
            return torch.export.load(io.BytesIO(data))
    except Exception as exc:  # a zip that is not an export archive, a newer format, ...
        cause = logged[0] if logged else exc  # torch logs the real error, raises another
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        first = first.split(". ")[0][:300]  # miniz's advice on corrupted files misleads here
        if "CUDA" in first and not torch.cuda.is_available():
            raise ConfigError(
                f"model {model!r} was exported on a CUDA device ({first}), and "
                "torch.export.load has no map_location: export it again from the "
                "module on the CPU, torch.export.save(torch.export.export(model.cpu(), "
                "(example.cpu(),)), 'model.pt2'), or save its state_dict() for source: python"
            ) from None
        saved = " it is a torch.save file (a state dict?);" if _torch_saved(data) else ""
        raise ConfigError(
            f"model {model!r} is not a torch.export archive ({first});{saved} save one with "
            "torch.export.save(torch.export.export(model, (example,)), 'model.pt2'), or load "
            "a state dict with source: python"
        ) from None


@contextmanager
def _export_log_kept() -> Iterator[list[BaseException]]:
    """The errors torch.export logs while loading, kept instead of printed: its own stderr
    handler printed a traceback, then torch raised 'check the warnings above'."""
    logger, kept = logging.getLogger("torch.export"), []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                kept.append(record.exc_info[1])

    handlers, logger.handlers = logger.handlers, [Keep()]
    try:
        yield kept
    finally:
        logger.handlers = handlers


def _torch_saved(data: bytes) -> bool:
    """A zip written by ``torch.save``: its one folder holds ``data.pkl``."""
    try:
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except zipfile.BadZipFile:
        return False
    return any(name.endswith("/data.pkl") for name in names)


def exported_input(program: torch.export.ExportedProgram, model: str) -> tuple[int | None, tuple]:
    """The batch size the program is fixed to (None: dynamic) and its per-sample shape."""
    user = set(program.graph_signature.user_inputs)
    shapes = [
        n.meta["val"].shape
        for n in program.graph.nodes
        if n.op == "placeholder" and n.name in user and "val" in n.meta
    ]
    if len(shapes) != 1:
        raise ConfigError(
            f"model {model!r}: the exported program takes {len(shapes)} tensor inputs; an image "
            "classifier takes one batch of images"
        )
    batch, rest = shapes[0][0], tuple(shapes[0][1:])
    return (int(batch) if isinstance(batch, int) else None), rest


def _mark_layer_types(unflat: nn.Module, program: torch.export.ExportedProgram) -> None:
    """Give each rebuilt layer the torch.nn class it was exported from (``original_type``),
    read from the graph's ``nn_module_stack``, so that coverage and feature metrics find the
    ReLUs and the Linear head as in the original module. Only ``torch.*`` classes are
    resolved: no user code is imported for this."""
    modules = dict(unflat.named_modules())
    for node in program.graph.nodes:
        for path, type_name in node.meta.get("nn_module_stack", {}).values():
            cls = _torch_class(type_name) if isinstance(type_name, str) else type_name
            if path in modules and isinstance(cls, type):
                modules[path].original_type = cls


def _torch_class(qualified: str) -> type | None:
    module_name, _, name = qualified.rpartition(".")
    if module_name.split(".")[0] != "torch":
        return None
    try:
        return getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None


class _Fixed(nn.Module):
    """An exported graph module: its train/eval mode is fixed at export (torch refuses
    ``.eval()`` on it), so switching the mode of a container around it leaves it alone."""

    def __init__(self, graph: nn.Module):
        super().__init__()
        self.graph = graph

    def train(self, mode: bool = True) -> _Fixed:
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.graph(x)


class ExportedPredictor(TorchPredictor):
    """A ``torch.export`` program behind the ``nn.Module`` predictor (normalisation in front)."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        input_shape: Sequence[int],
        num_classes: int,
        *,
        name: str = "exported-model",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device: str | torch.device = "cpu",
    ):
        self.batch, sample = exported_input(program, name)
        if tuple(int(s) for s in sample) != tuple(input_shape):
            raise ConfigError(
                f"model {name!r} was exported for inputs of shape {tuple(sample)}, but "
                f"input_shape is {tuple(input_shape)}; give the shape it was exported with"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            unflat = torch.export.unflatten(program)
        _mark_layer_types(unflat, program)
        super().__init__(
            unflat, input_shape, num_classes, name=name, mean=mean, std=std, device=device
        )
        self.bound_network = nn.Sequential(self.network[0], _Fixed(program.module()))
        if self.batch is not None:
            self.unavailable = {
                "bounds": (
                    f"it was exported with a fixed batch size of {self.batch}, and the "
                    "verifier runs a batch of two; export it with a dynamic batch "
                    "(dynamic_shapes={'x': {0: torch.export.Dim('batch')}}) or load it "
                    "with source: python"
                )
            }

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        if self.batch is None:
            return self.network(x)
        return run_fixed(self.network, x, self.batch)

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        if self.batch is None:
            return super().features(x, layers)
        chunks = fixed_batches(x, self.batch)
        parts = [(TorchPredictor.features(self, chunk, layers), real) for chunk, real in chunks]
        return {layer: torch.cat([p[layer][:real] for p, real in parts]) for layer in layers}
