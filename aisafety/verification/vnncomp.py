"""One VNN-COMP instance (ONNX network + VNN-LIB property) -> sat / unsat / timeout / unknown.

The network is converted with onnx2torch for the bounds (checked against onnxruntime at
load time) and counterexamples are replayed through onnxruntime itself, the network as
shipped. ``sat`` comes with the counterexample in VNN-COMP's format:
``((X_0 v) ... (Y_0 v) ...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from aisafety.errors import ConfigError
from aisafety.prediction.onnx_model import OnnxRuntimePredictor, load_onnx
from aisafety.verification.graph import build_graph
from aisafety.verification.registry import PluginRegistry, make_verifier
from aisafety.verification.result import Verdict
from aisafety.verification.vnnlib import read_vnnlib


@dataclass
class InstanceResult:
    status: str  # sat / unsat / timeout / unknown
    seconds: float
    margin: float
    counterexample: str = ""
    how: str = ""  # the engine that answered (``complete``: milp or bab)


def verify_instance(
    registry: PluginRegistry,
    network: str | Path,
    spec: str | Path,
    verifier: str = "complete",
    timeout: float = 60.0,
    config: dict | None = None,
) -> InstanceResult:
    """Verify one instance with the named verifier under a time limit in seconds (and
    ``config``: other fields of the verifier's config, e.g. its clock)."""
    reference = _runtime(network)
    shape = reference.input_shape
    predictor = load_onnx(network, gradients=True, input_shape=shape)
    graph = build_graph(predictor.network.cpu(), shape, Path(network).name)
    checker = make_verifier(registry, verifier, {**(config or {}), "timeout": timeout})
    checker.check(graph)  # before reading the property or any work
    engine = getattr(checker, "engine", None)
    prop = read_vnnlib(spec, math.prod(shape), reference.num_classes)
    prop.lower, prop.upper = prop.lower.reshape(1, *shape), prop.upper.reshape(1, *shape)
    result = checker.verify(graph, prop, reference.logits)
    verdict, note = result.verdicts[0], result.notes[0] if result.notes else ""
    seconds, margin = float(result.seconds[0]), float(result.margins[0])
    how = engine(graph) if engine is not None else verifier
    if verdict is Verdict.CERTIFIED:
        return InstanceResult("unsat", seconds, margin, how=how)
    if verdict is Verdict.FALSIFIED:
        x = result.counterexamples[:1]
        y = reference.logits(x)[0]
        lines = [f"(X_{i} {v!r})" for i, v in enumerate(x.flatten().tolist())]
        lines += [f"(Y_{j} {v!r})" for j, v in enumerate(y.tolist())]
        return InstanceResult("sat", seconds, margin, "(" + "\n ".join(lines) + ")", how)
    timed_out = verdict is Verdict.TIMEOUT or note == "timeout"
    return InstanceResult("timeout" if timed_out else "unknown", seconds, margin, how=how)


def _runtime(network: str | Path) -> OnnxRuntimePredictor:
    """onnxruntime's predictor; a graph taking flat vectors gets a (1, 1, n) layout."""
    try:
        return OnnxRuntimePredictor(network)
    except ConfigError:  # not (N, C, H, W), or no onnxruntime (then this says so, exit 2)
        from aisafety.prediction.onnx_model import _import

        ort = _import("onnxruntime", "onnxruntime")
        dims = ort.InferenceSession(str(network)).get_inputs()[0].shape
        size = math.prod(d for d in dims[1:] if isinstance(d, int) and d > 0)
        return OnnxRuntimePredictor(network, input_shape=(1, 1, size))


def verify_report(
    registry: PluginRegistry, network: str, spec: str, verifier: str, timeout: float
) -> str:
    """What ``aisafety verify`` prints: the status (and counterexample) as VNN-COMP, then a
    comment line with the time and the margin bound."""
    result = verify_instance(registry, network, spec, verifier, timeout)
    lines = [result.status]
    if result.counterexample:
        lines.append(result.counterexample)
    engine = f" ({result.how})" if result.how != verifier else ""
    lines.append(f"# {verifier}{engine}: {result.seconds:.2f} s, margin bound {result.margin:.4g}")
    return "\n".join(lines)
