"""What onnx2torch 1.5 lacks for classifiers exported today, registered into its registry.

onnx2torch converts an operator by its ONNX ``since_version``; graphs exported today use
versions it has no converter for, although the computation is one it already has:

* opset 18 moved the ``axes`` of ``ReduceMean``/``ReduceMax``/... from an attribute to a
  second input (torch's dynamo exporter writes opset 18: ``AdaptiveAvgPool2d`` becomes
  ``ReduceMean``); we read the constant axes and build onnx2torch's static-axes module;
* ``Slice`` of opset 1-9 (attributes ``starts``/``ends``/``axes``; the VNN-COMP 2023 ViTs):
  onnx2torch's version-9 converter fails on attribute lists (``'list' object has no
  attribute 'detach'``) and is never found for version 1; ``StaticSlice`` replaces it.

* ``Gelu`` (opset 20): torch's exporter writes ``nn.GELU`` (a ViT's MLP) as this one
  operator from opset 20, its default today, and onnx2torch has no converter (opset 17
  writes it as ``Erf`` arithmetic, which converts); ``nn.GELU`` with the node's
  ``approximate`` (``none`` or ``tanh``) computes it;

* operators whose newer versions (opsets 18-22) only widen the tensor types they accept
  (``Reshape`` 19/21, ``Conv`` 22, ...) take the converter of the newest version onnx2torch
  has: for float32 classifiers the computation is the same.

Registration is idempotent, so loading many models registers each converter once. Every
conversion is still checked against onnxruntime at load time (``onnx_model.load_onnx``).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

REDUCTIONS = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


# operator -> versions whose change is only in the types accepted (onnx/docs/Changelog.md)
TYPE_ONLY = {
    "Reshape": (19, 21), "Flatten": (21,), "Transpose": (21,), "Squeeze": (21,),
    "Unsqueeze": (21,), "Shape": (19, 21), "Constant": (19, 21), "Cast": (19, 21),
    "Conv": (22,), "MaxPool": (22,), "AveragePool": (22,), "GlobalAveragePool": (22,),
    "GlobalMaxPool": (22,), "Dropout": (22,), "Equal": (19,), "Size": (19, 21),
    "ConstantOfShape": (20, 21), "Gemm": (13,), "Relu": (14,),
}  # fmt: skip


def register() -> None:
    """Add the missing converters to onnx2torch's registry (once); onnx2torch is imported."""
    registry = importlib.import_module("onnx2torch.node_converters.registry")
    known = registry._CONVERTER_REGISTRY
    description = registry.OperationDescription
    for operation in REDUCTIONS:
        key = description(domain="", operation_type=operation, version=18)
        if key not in known:
            known[key] = _reduce_with_axes_input
    for operation, versions in TYPE_ONLY.items():
        older = sorted(
            (k.version for k in known if k.operation_type == operation and k.domain == ""),
        )
        for version in versions:
            key = description(domain="", operation_type=operation, version=version)
            below = [v for v in older if v < version]
            if key not in known and below:
                known[key] = known[description(domain="", operation_type=operation,
                                               version=below[-1])]  # fmt: skip
    gelu = description(domain="", operation_type="Gelu", version=20)
    if gelu not in known:
        known[gelu] = _gelu
    for version in (1, 9):  # replaces onnx2torch's broken version-9 converter
        known[description(domain="", operation_type="Slice", version=version)] = _static_slice


class StaticSlice(nn.Module):
    """ONNX Slice of opsets 1-9: ``starts``/``ends``/``axes`` attributes, step 1.

    Python slicing clamps out-of-range and counts negative indices from the end, which is
    what the ONNX operator specifies for these versions.
    """

    def __init__(self, starts: list[int], ends: list[int], axes: list[int] | None):
        super().__init__()
        self.bounds = list(zip(axes or range(len(starts)), starts, ends, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = [slice(None)] * x.dim()
        for axis, start, end in self.bounds:
            index[axis] = slice(start, end)
        return x[tuple(index)]


def _static_slice(node: Any, graph: Any) -> Any:
    common = importlib.import_module("onnx2torch.utils.common")
    attributes = node.attributes
    axes = attributes.get("axes")
    module = StaticSlice(
        [int(v) for v in attributes["starts"]],
        [int(v) for v in attributes["ends"]],
        None if axes is None else [int(v) for v in axes],
    )
    return common.OperationConverterResult(
        torch_module=module, onnx_mapping=common.onnx_mapping_from_node(node)
    )


def _gelu(node: Any, graph: Any) -> Any:
    """ONNX Gelu (opset 20) as ``nn.GELU``, whose ``approximate`` takes the same values."""
    common = importlib.import_module("onnx2torch.utils.common")
    approximate = node.attributes.get("approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate not in ("none", "tanh"):
        raise NotImplementedError(f"Gelu with approximate={approximate!r}")
    return common.OperationConverterResult(
        torch_module=nn.GELU(approximate=approximate),
        onnx_mapping=common.onnx_mapping_from_node(node),
    )


def _reduce_with_axes_input(node: Any, graph: Any) -> Any:
    """Opset-18 reduction: axes from the (constant) second input, as onnx2torch's static form."""
    reduce = importlib.import_module("onnx2torch.node_converters.reduce")
    common = importlib.import_module("onnx2torch.utils.common")
    attributes = node.attributes
    axes = None
    if len(node.input_values) > 1 and node.input_values[1]:
        try:
            axes = [int(a) for a in common.get_const_value(node.input_values[1], graph).tolist()]
        except KeyError:
            raise NotImplementedError(
                f"{node.operation_type} with axes computed at run time (not a constant)"
            ) from None
    if not axes and attributes.get("noop_with_empty_axes", 0):
        raise NotImplementedError(f"{node.operation_type} with noop_with_empty_axes=1")
    module = reduce.OnnxReduceStaticAxes(
        operation_type=node.operation_type, axes=axes, keepdims=attributes.get("keepdims", 1)
    )
    mapping = common.OnnxMapping(inputs=node.input_values[:1], outputs=node.output_values)
    return common.OperationConverterResult(torch_module=module, onnx_mapping=mapping)
