"""Every verifier on the one-atom VNN-LIB route attacks first (#33, session 21).

``crown`` and ``ibp`` do not attack in their own ``verify``; on that route they answered
``unknown`` on violated properties that ``alpha-crown`` answers ``sat`` (mnistfc 256x6
``prop_1_0.05``, 9.8 of 10 s unused). The net here is a bump on [0, 1]:
``Y_0 = 1 - 8 relu(0.25 - |x - 0.7|)``, ``Y_1 = 0``, and the property's one atom
``Y_1 >= Y_0`` holds only where |x - 0.7| < 0.125 (at 0.7, ``Y_0 = -1``). On the box
[0, 1] the centre (``Y_0 = 0.6``) and both corners (1) are safe, and a linear bound's
minimising point is a corner, so before the attack neither verifier replayed a point that
breaks it; box-PGD from the centre does. On [0, 0.4] the bump is 0, ``Y_0 = 1``: ``unsat``,
as before, with the bound's margin.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from aisafety.plugins import default_registry
from aisafety.verification.vnncomp import verify_instance

onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

PEAK = 0.7


def bump_net(path) -> str:
    """x (1, 1) -> [relu(x - 0.7), relu(0.7 - x)] -> relu(0.25 - both) -> [1 - 8 b, 0]."""
    layers = [
        (np.array([[1.0], [-1.0]]), np.array([-PEAK, PEAK])),
        (np.array([[-1.0, -1.0]]), np.array([0.25])),
        (np.array([[-8.0], [0.0]]), np.array([1.0, 0.0])),
    ]
    inits, nodes, x = [], [], "x"
    for k, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"W{k}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{k}")]  # fmt: skip
        nodes.append(helper.make_node("Gemm", [x, f"W{k}", f"b{k}"], [f"z{k}"], transB=1))
        x = f"z{k}"
        if k < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"h{k}"]))
            x = f"h{k}"
    graph = helper.make_graph(
        nodes, "bump", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 2])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def atom_spec(path, low: float, high: float) -> str:
    """The box [low, high] and the one atom Y_1 >= Y_0."""
    path.write_text(
        "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
        f"(assert (>= X_0 {low}))\n(assert (<= X_0 {high}))\n(assert (>= Y_1 Y_0))\n"
    )
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bump")
    net = bump_net(folder / "bump.onnx")
    return (
        net,
        atom_spec(folder / "violated.vnnlib", 0, 1),
        atom_spec(folder / "safe.vnnlib", 0, 0.4),
    )


@pytest.mark.parametrize("verifier", ["crown", "ibp"])
def test_a_bound_only_verifier_answers_sat_with_a_point_that_replays(files, verifier):
    net, violated, _ = files
    result = verify_instance(default_registry(), net, violated, verifier, 10.0, {"clock": "cpu"})
    assert result.status == "sat", (verifier, result)
    (x,) = [float(v) for v in re.findall(r"\(X_0 ([^)]+)\)", result.counterexample)]
    ys = [float(v) for v in re.findall(r"\(Y_\d+ ([^)]+)\)", result.counterexample)]
    assert np.float32(x) == x and 0 <= x <= 1  # a float32 inside the box
    # replayed here, outside the platform: onnxruntime on the file, the atom in float64
    session = ort.InferenceSession(net)
    y = session.run(None, {"x": np.array([[x]], np.float32)})[0][0].astype(np.float64)
    assert ys == y.tolist() and y[1] >= y[0]
    assert result.margin == pytest.approx(y[0] - y[1]) and result.margin <= 0
    assert abs(x - PEAK) < 0.125  # only the bump breaks it


@pytest.mark.parametrize("verifier", ["crown", "ibp"])
def test_an_unsat_instance_stays_unsat_with_the_bounds_margin(files, verifier):
    net, _, safe = files
    result = verify_instance(default_registry(), net, safe, verifier, 10.0, {"clock": "cpu"})
    # Y_0 - Y_1 = 1 on the whole box: both bounds are exact there (every ReLU is stable),
    # less their float64 rounding margins (6e-8 here)
    assert result.status == "unsat" and result.counterexample == ""
    assert 1 - 1e-6 < result.margin <= 1
