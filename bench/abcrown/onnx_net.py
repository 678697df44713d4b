"""An ONNX graph run as a torch module, for alpha-beta-CROWN on this machine (measurement only).

alpha-beta-CROWN loads ONNX through its fork of onnx2pytorch, which is not on the package
index here, and the index's onnx2pytorch imports torchvision (only CUDA builds reachable).
This builder reads the graph with ``onnx`` and ``numpy`` only and replays it node by node
with torch functions auto_LiRPA traces, for the operators of the VNN-COMP 2021 mnistfc,
eran, cifar10_resnet and marabou-cifar10 nets. It is alpha-beta-CROWN's
``model.onnx_loader`` (``Customized("onnx_net.py", "load")`` in ``bench/abcrown/*.yaml``);
our verifiers never use it. The harness checks its outputs against onnxruntime on the
instance's box centre before verifying (``load``).
"""

from __future__ import annotations

import gzip
import os

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxNet(torch.nn.Module):
    """The nodes of one ONNX graph, in order; initializers become parameters or buffers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        graph = model.graph
        self.nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in graph.node]
        self.consts: dict[str, str] = {}
        for i, init in enumerate(graph.initializer):
            array = torch.from_numpy(numpy_helper.to_array(init).copy())
            slot = f"w{i}"
            if array.dtype.is_floating_point and array.dim() >= 1:
                self.register_parameter(
                    slot, torch.nn.Parameter(array.float(), requires_grad=False)
                )
            else:
                self.register_buffer(slot, array)
            self.consts[init.name] = slot
        inits = set(self.consts)
        self.input_name = next(i.name for i in graph.input if i.name not in inits)
        self.output_name = graph.output[0].name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {name: getattr(self, slot) for name, slot in self.consts.items()}
        values[self.input_name] = x
        for op, inputs, outputs, attrs in self.nodes:
            args = [values[i] for i in inputs if i]
            values[outputs[0]] = _run(op, args, attrs)
        return values[self.output_name]


def _gemm(args: list, attrs: dict) -> torch.Tensor:
    a, b = args[0], args[1]
    if attrs.get("transA", 0):
        a = a.t()
    if attrs.get("transB", 0):
        out = F.linear(a, b) * attrs.get("alpha", 1.0)
    else:
        out = a.matmul(b) * attrs.get("alpha", 1.0)
    if len(args) > 2:
        out = out + args[2] * attrs.get("beta", 1.0)
    return out


def _conv(args: list, attrs: dict) -> torch.Tensor:
    pads = attrs.get("pads", [0, 0, 0, 0])
    assert pads[:2] == pads[2:], f"asymmetric padding {pads}"
    return F.conv2d(
        args[0],
        args[1],
        args[2] if len(args) > 2 else None,
        stride=attrs.get("strides", [1, 1]),
        padding=pads[:2],
        dilation=attrs.get("dilations", [1, 1]),
        groups=attrs.get("group", 1),
    )


def _run(op: str, args: list, attrs: dict) -> torch.Tensor:
    if op == "Gemm":
        return _gemm(args, attrs)
    if op == "Conv":
        return _conv(args, attrs)
    if op == "Relu":
        return F.relu(args[0])
    if op == "Sigmoid":
        return torch.sigmoid(args[0])
    if op == "Add":
        return args[0] + args[1]
    if op == "Sub":
        return args[0] - args[1]
    if op == "Div":
        return args[0] / args[1]
    if op == "MatMul":
        return args[0].matmul(args[1])
    if op == "Flatten":
        return torch.flatten(args[0], attrs.get("axis", 1))
    if op == "Reshape":
        shape = [int(s) for s in args[1].tolist()]
        return args[0].reshape(args[0].shape[0], *shape[1:])
    if op == "Transpose":
        return args[0].permute(*attrs["perm"])
    if op == "Constant":
        return torch.from_numpy(numpy_helper.to_array(attrs["value"]).copy())
    raise NotImplementedError(f"ONNX operator {op} is not in bench/abcrown/onnx_net.py")


def read_onnx(path: str) -> onnx.ModelProto:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return onnx.load(f)


def input_shape(model: onnx.ModelProto, net: OnnxNet) -> tuple[int, ...]:
    """The input's shape without the batch dimension (``[1, 784, 1]`` mnistfc: 784 as 1x28x28)."""
    dims = next(i for i in model.graph.input if i.name == net.input_name)
    dims = [d.dim_value for d in dims.type.tensor_type.shape.dim][1:]
    return (1, 28, 28) if dims == [784, 1] else tuple(dims)


def check_against_onnxruntime(path: str, net: OnnxNet, x: torch.Tensor) -> float:
    """Largest absolute difference to onnxruntime's output at ``x`` (shape of the ONNX input)."""
    import onnxruntime as ort

    model = read_onnx(path)
    session = ort.InferenceSession(model.SerializeToString())
    first = next(i for i in model.graph.input if i.name == net.input_name)
    dims = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
    feed = x.reshape(dims).numpy().astype(np.float32)
    ours = net(x.reshape(1, *input_shape(model, net))).detach().numpy()
    theirs = session.run(None, {net.input_name: feed})[0]
    return float(np.abs(ours.reshape(-1) - theirs.reshape(-1)).max())


def load(file_root: str, onnx_path: str, vnnlib_path: str):
    """alpha-beta-CROWN's ``onnx_loader`` signature: (model, shape with batch -1, vnnlib)."""
    import arguments  # alpha-beta-CROWN's, on sys.path when it calls us
    from loading import joint_optimization_with_onnx_and_vnnlib
    from read_vnnlib import read_vnnlib

    path = os.path.join(file_root, onnx_path)
    vnnlib = read_vnnlib(os.path.join(file_root, vnnlib_path))
    model = read_onnx(path)
    net = OnnxNet(model).eval()
    shape = (-1, *input_shape(model, net))
    centre = torch.tensor(vnnlib[0][0], dtype=torch.float32).mean(1)
    error = check_against_onnxruntime(path, net, centre)
    print(f"onnx_net: {onnx_path} input {shape}, max |ours - onnxruntime| {error:.2e}")
    assert error < 1e-4, f"onnx_net differs from onnxruntime by {error} on {onnx_path}"
    flags = arguments.Config["model"]["onnx_vnnlib_joint_optimization_flags"]
    net, vnnlib = joint_optimization_with_onnx_and_vnnlib(net, shape, vnnlib, flags)
    return net, shape, vnnlib
