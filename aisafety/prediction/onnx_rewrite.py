"""Rewrites of an ONNX graph, before conversion, into the forms onnx2torch and batches need.

Each rewrite leaves what the graph computes unchanged (for the batch sizes it ran on before);
``onnx_model.load_onnx`` still compares the converted module with onnxruntime on the file
as shipped, so a rewrite that did not hold would be refused there, not trusted.

* ``Identity`` nodes are bypassed. torch's legacy exporter (opsets 9-17) writes them for
  de-duplicated weights (two BatchNorms with equal parameters share one initializer, the
  other name is an ``Identity`` of it); onnx2torch then looks the weight up by the
  Identity's name (a bare ``KeyError: 'onnx::Conv_93'``) or has no ``Identity`` converter
  at opset 19+.
* A batch of 1 hard-coded in a ``Reshape`` (VNN-COMP graphs, legacy exports with a fixed
  input shape) becomes -1 (or 0, "keep the input's", where another axis already is -1),
  when the graph's input has a fixed batch of 1: the graph then runs on batches.
* ``allowzero=1`` is dropped from a ``Reshape`` whose constant shape has no 0 (where it
  changes nothing); torch's dynamo exporter writes it, onnx2torch refuses it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np


def bypass_identities(model: Any) -> int:
    """Remove ``Identity`` nodes, wiring their consumers to the Identity's input."""
    graph = model.graph
    outputs = {value.name for value in graph.output}
    removed = 0
    for node in list(graph.node):
        if node.op_type != "Identity" or node.output[0] in outputs:
            continue
        source, alias = node.input[0], node.output[0]
        for consumer in graph.node:
            for i, name in enumerate(consumer.input):
                if name == alias:
                    consumer.input[i] = source
        graph.node.remove(node)
        removed += 1
    return removed


def free_batch_in_reshapes(model: Any, numpy_helper: Any) -> int:
    """Replace a leading 1 in constant ``Reshape`` shapes by -1 (or 0) in a batch-1 graph."""
    graph = model.graph
    dims = graph.input[0].type.tensor_type.shape.dim if graph.input else []
    if not len(dims) or not dims[0].HasField("dim_value") or dims[0].dim_value != 1:
        return 0
    tensors = _constant_protos(graph)
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    changed = 0
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        proto = tensors.get(node.input[1])
        if proto is None or users.get(node.input[1], 0) != 1:
            continue  # computed at run time (follows the batch), or shared: left alone
        shape = numpy_helper.to_array(proto).astype(np.int64)
        if shape.ndim != 1 or len(shape) < 2 or shape[0] != 1:
            continue
        shape[0] = 0 if (shape[1:] == -1).any() else -1
        proto.CopyFrom(numpy_helper.from_array(shape, proto.name))
        changed += 1
    return changed


def _constant_protos(graph: Any) -> dict[str, Any]:
    """The TensorProto of each initializer and ``Constant`` output, by name (editable)."""
    protos = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    protos[node.output[0]] = attribute.t
    return protos


def drop_idle_allowzero(model: Any, numpy_helper: Any) -> int:
    """``allowzero=1`` on a Reshape whose constant shape has no 0 means nothing: drop it.

    torch's dynamo exporter sets it on every Reshape; onnx2torch refuses it outright.
    """
    constants = _constants(model.graph, numpy_helper)
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        shape = constants.get(node.input[1])
        if shape is None or (shape == 0).any():
            continue
        for attribute in node.attribute:
            if attribute.name == "allowzero" and attribute.i == 1:
                attribute.i = 0
                changed += 1
    return changed


def _constants(graph: Any, numpy_helper: Any) -> dict[str, np.ndarray]:
    """Initializers and ``Constant`` node outputs by name, as arrays."""
    return {name: numpy_helper.to_array(p) for name, p in _constant_protos(graph).items()}


def batchnorm_input_shapes(model: Any, onnx: Any, ort: Any) -> int:
    """Record the shapes of BatchNormalization inputs that shape inference left unknown.

    onnx2torch picks its BatchNorm module by the input's rank; graphs computing their
    shapes at run time (the ViTs' Shape -> Gather -> Concat -> Reshape) leave it unknown to
    ``onnx.shape_inference``. We run the graph once on zeros and read the shapes off.
    """
    graph = model.graph
    known = {v.name for v in graph.value_info if len(v.type.tensor_type.shape.dim)}
    wanted = sorted({n.input[0] for n in graph.node
                     if n.op_type == "BatchNormalization" and n.input[0] not in known})  # fmt: skip
    if not wanted:
        return 0
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in wanted:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    dims = graph.input[0].type.tensor_type.shape.dim
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(wanted, {graph.input[0].name: np.zeros(shape, np.float32)})
    for name, value in zip(wanted, values, strict=True):
        graph.value_info.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(value.shape))
        )
    return len(wanted)


def rewrite(data: bytes, onnx: Any, ort: Any = None) -> bytes:
    """The graph with the rewrites applied (serialised); ``ort`` (onnxruntime) where shapes
    must be measured."""
    model = onnx.load_from_string(data)
    bypass_identities(model)
    free_batch_in_reshapes(model, onnx.numpy_helper)
    drop_idle_allowzero(model, onnx.numpy_helper)
    # intermediate shapes: onnx2torch's BatchNorm picks its module by the input's rank;
    # inference is a help, not a requirement
    with contextlib.suppress(Exception):
        model = onnx.shape_inference.infer_shapes(model)
    if ort is not None:
        batchnorm_input_shapes(model, onnx, ort)
    return model.SerializeToString()
