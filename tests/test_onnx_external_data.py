"""ONNX weights kept beside the graph (external data) are read in wherever the graph keeps a
tensor: initializers, node attributes, and attributes inside subgraphs (If/Loop bodies), using
only onnx's public functions, so an onnx release that renames its private tensor walker does
not break loading."""

from __future__ import annotations

import numpy as np
import pytest

from aisafety.prediction.onnx_model import read_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper = onnx.helper
numpy_helper = onnx.numpy_helper


def _constant(name: str, values: np.ndarray) -> object:
    """A Constant node: its value is a tensor attribute, not an initializer."""
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(values, name))


def _branch(name: str, values: np.ndarray) -> object:
    out = helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 3])
    return helper.make_graph([_constant(name, values)], f"{name}_graph", [], [out])


def _loop_body() -> object:
    """A Loop body adding a constant (a tensor attribute of the body) to its carried value."""
    f32, b = onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL
    inputs = [
        helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
        helper.make_tensor_value_info("c_in", b, []),
        helper.make_tensor_value_info("v_in", f32, [1, 3]),
    ]
    outputs = [
        helper.make_tensor_value_info("c_out", b, []),
        helper.make_tensor_value_info("v_out", f32, [1, 3]),
    ]
    nodes = [
        _constant("step", np.full((1, 3), 100.0, np.float32)),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Add", ["v_in", "step"], ["v_out"]),
    ]
    return helper.make_graph(nodes, "body", inputs, outputs)


def _model() -> object:
    """y = x W + If(true: [1, 2, 3], else: [-1, -2, -3]) + 2 x 100 (a Loop of two steps)."""
    f32 = onnx.TensorProto.FLOAT
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    initializers = [
        numpy_helper.from_array(weight, "W"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.array(2, np.int64), "trips"),
        numpy_helper.from_array(np.zeros((1, 3), np.float32), "start"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node(
            "If",
            ["cond"],
            ["branch"],
            then_branch=_branch("then_out", np.array([[1, 2, 3]], np.float32)),
            else_branch=_branch("else_out", np.array([[-1, -2, -3]], np.float32)),
        ),
        helper.make_node("Loop", ["trips", "", "start"], ["looped"], body=_loop_body()),
        helper.make_node("Add", ["xw", "branch"], ["partial"]),
        helper.make_node("Add", ["partial", "looped"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "external",
        [helper.make_tensor_value_info("x", f32, [1, 4])],
        [helper.make_tensor_value_info("y", f32, [1, 3])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _save_external(tmp_path) -> object:
    """The model saved with every tensor, subgraph attributes included, in ``model.onnx.data``."""
    path = tmp_path / "model.onnx"
    onnx.save_model(
        _model(),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
        convert_attribute=True,
    )
    return path


def _run(blob: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_weights_in_subgraph_attributes_are_read_in_without_onnxs_private_walker(
    tmp_path, monkeypatch
):
    path = _save_external(tmp_path)
    saved = onnx.load(str(path), load_external_data=False)
    then_value = saved.graph.node[1].attribute[0].g.node[0].attribute[0].t
    assert onnx.external_data_helper.uses_external_data(then_value)  # the case is real
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    expected = x @ weight + np.array([[1, 2, 3]], np.float32) + 200.0
    assert np.allclose(_run(onnx.load(str(path)).SerializeToString(), x), expected)  # onnx's own

    walkers = [n for n in vars(onnx.external_data_helper) if n.startswith("_get")]
    assert "_get_all_tensors" in walkers or not walkers
    for name in walkers:  # a later onnx without them
        monkeypatch.delattr(onnx.external_data_helper, name)
    blob = read_onnx(path, path.name)
    (tmp_path / "model.onnx.data").unlink()  # everything must be in the blob now
    assert np.allclose(_run(blob, x), expected, atol=1e-6)


def test_a_graph_without_external_data_is_returned_as_read(tmp_path, monkeypatch):
    path = tmp_path / "inline.onnx"
    onnx.save_model(_model(), str(path))
    for name in [n for n in vars(onnx.external_data_helper) if n.startswith("_get")]:
        monkeypatch.delattr(onnx.external_data_helper, name)
    assert read_onnx(path, path.name) == path.read_bytes()


def test_the_walk_finds_the_tensors_onnxs_own_walker_finds():
    """Peer check, while this onnx still has its private walker: the same tensors, in a model
    with If/Loop subgraphs, a made-up node holding a list of graphs, and a local function."""
    from aisafety.prediction.onnx_tensors import all_tensors

    own = getattr(onnx.external_data_helper, "_get_all_tensors", None)
    if own is None:
        pytest.skip("this onnx has no private walker to compare with")
    model = _model()
    listed = helper.make_node("Custom", [], ["z"], domain="made.up")
    listed.attribute.append(
        helper.make_attribute("bodies", [_branch("a", np.ones((1, 3), np.float32))] * 2)
    )
    function_node = _constant("k", np.full((1, 3), 7.0, np.float32))
    model.graph.node.append(listed)
    model.functions.append(helper.make_function("made.up", "F", [], ["k"], [function_node], []))
    ours = sorted(t.SerializeToString() for t in all_tensors(model))
    assert len(ours) == 10
    assert ours == sorted(t.SerializeToString() for t in own(model))
