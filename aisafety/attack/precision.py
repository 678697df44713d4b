"""Reduced precision for the model passes inside an attack (the ``precision`` option).

An attack's search may run the model under ``torch.autocast`` in bf16 or fp16 where the
hardware does that faster than fp32; its own arithmetic (steps, projections, losses on the
logits) stays fp32. The base class hands ``perturb`` a ``ReducedPrecision`` view of the
predictor and re-evaluates the final candidates with the fp32 predictor, so a success is
always an fp32 success (see ``aisafety.attack.base``).

``fp32`` (the default): no autocast. ``auto``: the fastest reduced precision this device
has (``fast_precisions``), else fp32. ``bf16`` / ``fp16``: that precision; a ``ConfigError``
on a device that has no fast unit for it (there it would run slower than fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import torch

from aisafety.errors import ConfigError
from aisafety.interfaces import Precision
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import weight_dtype
from aisafety.prediction.view import PredictorView

PRECISIONS: tuple[str, ...] = get_args(Precision)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _cpu_flags() -> dict[str, Any]:
    """The CPU's features as torch's cpuinfo reports them ({} where torch cannot say)."""
    try:
        return dict(torch._C._cpu._get_cpu_capability())
    except (AttributeError, RuntimeError):  # a torch without the (private) query
        return {}


def kernel_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU flags the operating system reports (Linux ``/proc/cpuinfo``; empty elsewhere):
    a second opinion on ``_cpu_flags``, which the bench and the tests print and compare."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def fast_precisions(device: torch.device) -> tuple[str, ...]:
    """Reduced precisions ``device`` computes faster than fp32, best first.

    CPU: bf16 with AVX512-BF16 or AMX-BF16 (Intel Cooper Lake / Sapphire Rapids and later,
    AMD Zen 4 and later); without them oneDNN emulates bf16, 4-8x slower than fp32 on the
    project's AMD EPYC (Zen 3; ``bench/precision.py``). CUDA: bf16 from compute capability
    8.0 (Ampere), fp16 from 7.0 (tensor cores). Nothing on other devices.
    """
    if device.type == "cpu":
        flags = _cpu_flags()
        return ("bf16",) if flags.get("avx512_bf16") or flags.get("amx_bf16") else ()
    if device.type == "cuda" and torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability(device)
        return ("bf16", "fp16") if major >= 8 else ("fp16",) if major >= 7 else ()
    return ()


def search_layout(device: torch.device, dtype: torch.dtype | None) -> torch.memory_format:
    """The memory layout of the network in a search at ``dtype`` on ``device`` (None: fp32).

    Channels-last for bf16 on the CPU, the default layout everywhere else. Measured
    (``bench/cpu_speed.py``, docs/scale.md; forward + backward passes against fp32 in the
    default layout, one thread, AMD EPYC with AVX512-BF16, no AMX): bf16 alone 0.46-0.78x,
    bf16 channels-last 0.36-0.49x on ``mnist-cnn``, WRN-28-10 and ResNet-50; the issue's CPU
    with AMX: 0.48x alone, 0.28x channels-last (``mnist-cnn``). fp32 channels-last was
    0.78-0.95x, but its logits move by rounding (oneDNN sums in another order), and fp32
    results stay bit for bit what they were. On a GPU channels-last lowered the bf16 floor
    of the WRN (0.95x) and raised ResNet-50's (1.16x, NVIDIA H200, docs/gpu.md): no rule
    there. The view that applies it is ``aisafety.attack.layout``.
    """
    if device.type == "cpu" and dtype is torch.bfloat16:
        return torch.channels_last
    return torch.contiguous_format


def _device_words(device: torch.device) -> str:
    if device.type == "cpu":
        name = _cpu_flags().get("cpu_name") or "CPU"
        return f"this CPU ({name}) has neither AVX512-BF16 nor AMX-BF16"
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        return f"this GPU ({name}) has compute capability {major}.{minor}"
    return f"device {device.type!r} has no fast reduced precision here"


def compute_dtype(precision: str, device: torch.device, owner: str) -> torch.dtype | None:
    """The autocast dtype ``precision`` means on ``device`` (None: fp32), or a ConfigError
    naming ``owner`` when ``device`` has no fast unit for the precision asked for."""
    if precision == "fp32":
        return None
    fast = fast_precisions(device)
    if precision == "auto":
        return DTYPES[fast[0]] if fast else None
    if precision not in DTYPES:
        raise ConfigError(f"{owner}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision not in fast:
        needs = {
            "bf16": "a CPU with AVX512-BF16 or AMX, or a CUDA GPU of compute capability 8.0+",
            "fp16": "a CUDA GPU of compute capability 7.0+",
        }[precision]
        raise ConfigError(
            f"{owner}: precision {precision!r} needs {needs}; {_device_words(device)}, "
            f"where {precision} would run slower than fp32. Use precision: auto (the fastest "
            "precision the device has, fp32 here) or precision: fp32"
        )
    return DTYPES[precision]


def _runner(predictor: Predictor) -> Predictor:
    """The predictor under input defenses and views (their ``inner``) that runs the model:
    the first with a ``network`` module (a PyTorch network), else the innermost."""
    while not isinstance(getattr(predictor, "network", None), torch.nn.Module):
        inner = getattr(predictor, "inner", None)
        if inner is None:
            return predictor
        predictor = inner
    return predictor


def _unreduced(predictor: Predictor, precision: str) -> str | None:
    """Why autocast would not run ``predictor``'s passes in ``precision`` (None: it would)."""
    runner = _runner(predictor)
    network = getattr(runner, "network", None)
    if not isinstance(network, torch.nn.Module):
        kind = runner.engine or (
            f"a predictor of class {type(runner).__name__}, with no PyTorch network"
        )
        return (
            f"which reaches PyTorch code only: model {predictor.name!r} is {kind}, so the "
            f"search would run in fp32, not {precision}. Use precision: fp32 or auto (fp32 "
            "for this model), or load the model as PyTorch code (source: python, export or "
            f"torchscript, or onnx with gradients: true) for a {precision} search"
        )
    if weight_dtype(network) is torch.float64:
        return (
            f"which leaves float64 layers in float64: model {predictor.name!r} computes in "
            f"float64, so the search would run in float64, not {precision}. Use precision: "
            "fp32 or auto (the model's own float64), or give the model in float32 "
            f"(module.float()) for a {precision} search"
        )
    return None


def autocast_applies(precision: str, predictor: Predictor, owner: str) -> bool:
    """Whether autocast would change ``predictor``'s passes: not for a model run outside
    PyTorch (ONNX Runtime, a server; ``Predictor.engine``), nor for a float64 network, whose
    ops autocast leaves in float64 (it casts only float32, float16 and bfloat16). ``auto``
    then means the model's own precision (no view: the fp32 search exactly); ``bf16``/``fp16``
    asked for by name are a ConfigError naming ``owner``, the model, why and the fix, as on a
    device without them: the search would not run in the precision its label says."""
    why = _unreduced(predictor, precision)
    if why is None:
        return True
    if precision == "auto":
        return False
    raise ConfigError(
        f"{owner}: precision {precision!r} runs the model's passes under torch.autocast, {why}"
    )


class ReducedPrecision(PredictorView):
    """``inner`` with its forward passes under autocast to ``dtype``; logits come back as
    fp32 tensors (holding the reduced-precision values), so an attack's arithmetic, losses
    and gradients (with respect to the fp32 input) keep their dtypes."""

    def __init__(self, inner: Predictor, dtype: torch.dtype):
        super().__init__(inner)
        self.dtype = dtype

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.dtype):
            scores = self.inner._logits(x)
        return scores.float()

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        with torch.autocast(self.device.type, dtype=self.dtype):
            found = self.inner.features(x, layers)
        return {name: value.float() for name, value in found.items()}
