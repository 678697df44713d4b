"""Turn a predictor's network (normalisation included) into a graph of boundable ops.

The network is traced with ``torch.fx`` (containers such as ``nn.Sequential`` and the
``GraphModule`` onnx2torch builds are inlined; leaf modules stay calls) and run once on an
example batch. Every node that depends on the input must map onto an op of ``ops.py``;
nodes that do not (constants, shapes, ONNX ``Constant``) are evaluated once and folded in.
An op we cannot bound is a ``VerificationError`` naming it and the model, raised here,
before any bound is computed.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import weight_dtype
from aisafety.randomness import generator
from aisafety.verification import ops
from aisafety.verification.attention import (
    ATTENTION_MODULES,
    attention_message,
    product_of_inputs,
)
from aisafety.verification.inplace import OUT_OF_PLACE, out_of_place
from aisafety.verification.relaxations import RELU, SIGMOID, TANH

EXAMPLE_SEED = 0  # the tracing example's draw: the same graph whatever the global state

SUPPORTED = (
    "Linear/Gemm, Conv2d, ReLU, Sigmoid, Tanh, MaxPool2d (the bound-propagation, LP and MILP "
    "verifiers), "
    "Flatten/Reshape/View, the predictor's "
    "normalisation, BatchNorm (eval), AvgPool2d, AdaptiveAvgPool2d, GlobalAveragePool, "
    "Transpose of the per-sample axes, Add/Sub/Mul/Div by a constant, Add of two branches (as "
    "modules, torch functions or torch.export's ATen ops)"
)


class VerificationError(ConfigError):
    """The model or the property cannot be verified as asked; the message says why."""


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if isinstance(m, ATTENTION_MODULES):  # one call, named as attention (attention.py)
            return True
        return not isinstance(m, nn.Sequential | fx.GraphModule) and not list(m.children())


@dataclass
class BoundGraph:
    """Ops in topological order; node 0 is the input, ``ops[-1]`` the output (logits)."""

    ops: list[ops.Op]
    model: str
    dtype: torch.dtype = torch.float64
    _copies: dict[torch.dtype, BoundGraph] = field(default_factory=dict, repr=False)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.ops[0].out_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = [x]
        for op in self.ops[1:]:
            values.append(op.forward(*(values[i] for i in op.inputs)))
        return values[-1]

    def to(self, dtype: torch.dtype) -> BoundGraph:
        """This graph in ``dtype``, in place. Where that rounds a weight (a float64
        network's, BatchNorm's or a normalisation's float64 scale), the float64 graph as it
        was is kept for ``in_dtype(float64)``: ``verify`` bounds that one (only float64
        carries rounding margins), the network given, not its rounded copy."""
        wide = None
        if dtype != torch.float64 and self._rounded_by(dtype):
            ops_copy = [copy.copy(op) for op in self.ops]
            wide = BoundGraph(ops_copy, self.model, self.dtype).to(torch.float64)
        self.dtype = dtype
        self._copies.clear()
        for op in self.ops:
            op.to(dtype)
        if wide is not None:
            self._copies[torch.float64] = wide
        return self

    def _rounded_by(self, dtype: torch.dtype) -> bool:
        """Whether some stored value changes when cast to ``dtype``."""
        return any(
            isinstance(v, torch.Tensor) and v.is_floating_point()
            and v.dtype.itemsize > dtype.itemsize
            and not torch.equal(v.detach().to(dtype).to(v.dtype), v.detach())
            for op in self.ops for v in vars(op).values()
        )  # fmt: skip

    def detach(self) -> BoundGraph:
        """This graph with every stored tensor that requires grad replaced by its detached
        view (same storage, same in-place version counter: ``memo.py`` still sees updates);
        its kept copies too."""
        for graph in (self, *self._copies.values()):
            for op in graph.ops:
                for key, value in vars(op).items():
                    if isinstance(value, torch.Tensor) and value.requires_grad:
                        setattr(op, key, value.detach())
        return self

    def in_dtype(self, dtype: torch.dtype) -> BoundGraph:
        """This graph with its weights in ``dtype`` (itself when it is already): a copy,
        made once, for work whose result is re-checked in the graph's own dtype."""
        if dtype == self.dtype:
            return self
        if dtype not in self._copies:
            ops_copy = [copy.copy(op) for op in self.ops]
            self._copies[dtype] = BoundGraph(ops_copy, self.model, self.dtype).to(dtype)
        return self._copies[dtype]

    def require(self, kinds: set[str], method: str) -> None:
        """Raise before any work if an op is not boundable by ``method``."""
        for op in self.ops:
            if op.kind not in kinds:
                raise VerificationError(
                    f"{method} cannot bound {op.kind} node {op.name!r} of model {self.model!r}; "
                    f"it supports {SUPPORTED}; use the 'crown', 'alpha-crown', 'lp-full' or "
                    "'bab' verifier (they bound max-pooling), or strided convolutions instead "
                    "of max-pooling (e.g. the 'mnist-cnn-strided' architecture)"
                )

    @property
    def relu_only(self) -> bool:
        return all(op.relaxation is RELU for op in self.ops if op.kind == "activation")

    def require_sequential(self, verifier: str, relu: bool = True, use: str = "'crown'") -> None:
        """A VerificationError unless every op reads only the op before it (no residual
        additions), all activations ReLU with ``relu``, and the last op affine: the shape the
        verifiers written for feed-forward networks (WK, DeepZ, the Lipschitz bounds) take."""
        chained = all(op.inputs == [i] for i, op in enumerate(self.ops[1:]))
        if chained and self.ops[-1].kind != "activation" and (self.relu_only or not relu):
            return
        needs = "a sequential ReLU network" if relu else "a sequential network"
        raise VerificationError(
            f"verifier {verifier!r} needs {needs} (no residual additions, an affine last layer"
            f"{', no sigmoid or tanh' if relu else ''}); model {self.model!r} is not one (use "
            f"{use}, which bounds it)"
        )


def _unsupported(node: fx.Node, what: str, model: str) -> VerificationError:
    return VerificationError(
        f"verification cannot bound {what} (traced node {node.name!r}) of model {model!r}; "
        f"supported: {SUPPORTED}"
    )


def build_graph(
    network: nn.Module,
    input_shape: Sequence[int],
    model: str = "model",
    dtype=torch.float64,
    trainable: bool = False,
) -> BoundGraph:
    """The bound graph of ``network`` for per-sample inputs of ``input_shape``.

    Its weights are plain tensors (detached; the network's own parameters are untouched),
    so no bound carries an autograd graph back to them; ``trainable`` keeps the network's
    parameters in a graph of their dtype, for bounds that training differentiates
    (``margins.py``)."""
    _check_dtype(network, model)
    was_training = network.training
    network.eval()  # BatchNorm and dropout as at inference; restored below
    try:
        graph = _build(network, input_shape, model, dtype)
    finally:
        network.train(was_training)
    return graph if trainable else graph.detach()


def _check_dtype(network: nn.Module, model: str) -> None:
    """Half-precision networks are refused: every bound here is of the network computed in
    exact arithmetic (float32 passes carry rounding margins for float32 only), and a float16
    or bfloat16 network's own rounding (2^-11 or 2^-8 of each value, per op) would fall
    outside it: its certificate could be wrong."""
    dtype = weight_dtype(network)
    if dtype in (torch.float16, torch.bfloat16):
        raise VerificationError(
            f"model {model!r} has {dtype} weights; verification bounds networks in float32 "
            f"or float64 and would not cover {dtype}'s rounding. Verify a float32 copy "
            "(module.float()); its verdicts hold for that copy, not the half-precision model"
        )


def _build(network: nn.Module, input_shape: Sequence[int], model: str, dtype) -> BoundGraph:
    try:
        traced = fx.GraphModule(network, _Tracer().trace(network))
    except Exception as exc:  # data-dependent control flow and the like
        raise VerificationError(
            f"model {model!r} cannot be traced by torch.fx ({type(exc).__name__}: {exc}); "
            f"verification needs a traceable network of {SUPPORTED}"
        ) from None
    modules = dict(traced.named_modules())
    product = product_of_inputs(traced.graph, modules)
    if product is not None:  # attention: name it, not the first op that would fail
        raise VerificationError(attention_message(product, traced.graph, modules, model))
    # its own generator: drawn from torch's global one, building a graph moved the user's
    # later unseeded draws; any values in [0, 1) trace it and check it (``_check``)
    example = torch.rand(
        2, *input_shape, generator=generator(EXAMPLE_SEED), dtype=weight_dtype(network)
    )
    values: dict[fx.Node, Any] = {}
    index: dict[fx.Node, int] = {}  # traced node -> op index, for input-dependent nodes
    graph_ops: list[ops.Op] = []
    order = {node: i for i, node in enumerate(traced.graph.nodes)}
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            if graph_ops:
                raise VerificationError(f"model {model!r} takes more than one input")
            values[node] = example
            index[node] = 0
            graph_ops.append(ops.Input("input", [], tuple(input_shape)))
            continue
        if node.op == "output":
            result = node.args[0]
            if not isinstance(result, fx.Node) or result not in index:
                raise _unsupported(node, "an output that is not one tensor", model)
            output = index[result]
            break
        args = fx.node.map_arg(node.args, lambda n: values[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: values[n])
        target = modules[node.target] if node.op == "call_module" else node.target
        if target in OUT_OF_PLACE:  # torch.export's relu_, add_: read as relu, add
            target = out_of_place(node, order)
            if target is None:
                raise _unsupported(node, f"{node.target} writing a value read after it", model)
        if node.op == "get_attr":
            values[node] = _attr(traced, node.target)
            continue
        try:
            if node.op == "call_method":
                values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                values[node] = target(*args, **kwargs)
        except Exception as exc:  # wrong input shape for this network, most often
            raise VerificationError(
                f"model {model!r} fails on inputs of shape {tuple(input_shape)} at node "
                f"{node.name!r} ({type(exc).__name__}: {exc}); give the input shape it takes"
            ) from None
        if values[node] is None and not node.users:
            continue  # a check that returns nothing (torch.export's guards)
        traced_inputs = [n for n in node.all_input_nodes if n in index]
        if not traced_inputs:
            continue  # a constant: folded into the ops that use it
        if _is_shape_query(node, target):  # x.size(0) in x.view(x.size(0), -1)
            if not _sizes_reshape_only(node, modules):
                raise _unsupported(node, "a shape used other than as a reshape's size", model)
            continue  # a reshape op keeps per-sample shapes: the batch size is not read
        op = _make_op(node, target, args, values, traced_inputs, index, model)
        if op is None:  # identity (dropout, eval-mode no-ops)
            index[node] = index[traced_inputs[0]]
            continue
        index[node] = len(graph_ops)
        graph_ops.append(op)
    graph = BoundGraph(graph_ops[: output + 1], model).to(dtype)
    _check(graph, network, example, model)
    return graph


def shape_of(value: torch.Tensor) -> tuple[int, ...]:
    return tuple(value.shape[1:])


def _attr(module: nn.Module, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _check(graph: BoundGraph, network: nn.Module, example: torch.Tensor, model: str) -> None:
    """The graph must compute what the network computes (catches a mis-read op)."""
    with torch.no_grad():
        expected = network(example).to(graph.dtype)
        got = graph.forward(example.to(graph.dtype))
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-3, atol=1e-4):
        raise VerificationError(
            f"the bound graph of model {model!r} does not reproduce the network's outputs "
            f"(max difference {float((got - expected).abs().max()):.3g}); please report the "
            "model's layers"
        )


ELEMENTWISE = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg}
TORCH_BINARY = {torch.add: operator.add, torch.sub: operator.sub, torch.mul: operator.mul,
                torch.div: operator.truediv, torch.true_divide: operator.truediv}  # fmt: skip
RESHAPES = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous"}
# The ATen ops a torch.export program (``ExportedProgram.module()``) is made of, mapped to
# the torch functions above; each is the same computation (checked by ``_check``).
aten = torch.ops.aten
ATEN_BINARY = {aten.add.Tensor: operator.add, aten.sub.Tensor: operator.sub,
               aten.mul.Tensor: operator.mul, aten.div.Tensor: operator.truediv}  # fmt: skip
ATEN_RESHAPES = {aten.flatten.using_ints, aten.view.default, aten.reshape.default,
                 aten.squeeze.dim, aten.unsqueeze.default, aten.contiguous.default}  # fmt: skip
ATEN_ACTIVATIONS = {aten.relu.default: (torch.relu, RELU),
                    aten.sigmoid.default: (torch.sigmoid, SIGMOID),
                    aten.tanh.default: (torch.tanh, TANH)}  # fmt: skip


def _make_op(node, target, args, values, traced_inputs, index, model) -> ops.Op | None:
    """The op for one input-dependent node, or None for an identity."""
    out = values[node]
    if not isinstance(out, torch.Tensor):
        raise _unsupported(node, f"{_describe(node, target)} returning {type(out).__name__}", model)
    first = traced_inputs[0]
    inputs, in_shape, out_shape = [index[first]], shape_of(values[first]), shape_of(out)
    name = node.name
    if out.shape[0] != values[first].shape[0]:
        raise _unsupported(node, f"{_describe(node, target)} mixing samples of a batch", model)
    if isinstance(target, nn.Dropout | nn.Identity):
        return None
    if isinstance(target, nn.Linear):
        bias = target.bias if target.bias is not None else torch.zeros(target.out_features)
        return _dense(name, inputs, in_shape, out_shape, target.weight, bias, node, model)
    if target is aten.conv2d.default and len(in_shape) == 3:
        return _aten_conv(name, inputs, out_shape, args, in_shape)
    if isinstance(target, nn.Conv2d) and target.padding_mode == "zeros" and len(in_shape) == 3:
        bias = target.bias if target.bias is not None else torch.zeros(target.out_channels)
        return ops.Conv(name, inputs, out_shape, weight=target.weight, bias=bias,
                        stride=target.stride, padding=target.padding, dilation=target.dilation,
                        groups=target.groups, in_shape=in_shape)  # fmt: skip
    activation = _activation(target)
    if activation is not None:
        fn, relaxation = activation
        return ops.Activation(name, inputs, out_shape, fn=fn, relaxation=relaxation)
    if isinstance(target, nn.MaxPool2d) or target in (F.max_pool2d, aten.max_pool2d.default):
        fn = target if isinstance(target, nn.Module) else _bind(target, args, kwargs=node.kwargs)
        return ops.MaxPool(name, inputs, out_shape, fn=fn, in_shape=in_shape,
                           **_pool_settings(target, args, node.kwargs))  # fmt: skip
    if (
        isinstance(target, nn.AvgPool2d | nn.AdaptiveAvgPool2d)
        or target
        in (
            F.avg_pool2d,
            F.adaptive_avg_pool2d,
            aten.avg_pool2d.default,
            aten.adaptive_avg_pool2d.default,
        )
        or type(target).__name__ in ONNX_AVERAGES
    ):
        fn = target if isinstance(target, nn.Module) else _bind(target, args, kwargs=node.kwargs)
        return ops.PositiveLinear(name, inputs, out_shape, fn=fn, in_shape=in_shape)
    if _is_mean_or_sum(target, len(in_shape) + 1):
        return ops.PositiveLinear(name, inputs, out_shape, fn=target, in_shape=in_shape)
    if _is_permutation(node, target, args):
        fn = target if isinstance(target, nn.Module) else _bind(target, args, kwargs=node.kwargs)
        return ops.PositiveLinear(name, inputs, out_shape, fn=fn, in_shape=in_shape,
                                  permutation=True)  # fmt: skip
    if type(target).__name__ == "OnnxBatchNorm" and len(traced_inputs) == 1:
        return _elementwise(node, target, args, inputs, first, out_shape, model)
    if _is_reshape(node, target) or isinstance(target, nn.Flatten | nn.Unflatten):
        if values[first].numel() != out.numel():
            raise _unsupported(node, "a reshape that changes the number of values", model)
        return ops.Reshape(name, inputs, out_shape, in_shape=in_shape)
    if target is aten.batch_norm.default and not args[5]:  # args[5]: training
        return _elementwise(node, target, args, inputs, first, out_shape, model)
    if isinstance(target, nn.BatchNorm1d | nn.BatchNorm2d) or _is_elementwise(target):
        if len(traced_inputs) == 2 and _binary(target) is operator.add:
            return ops.Add(name, [index[n] for n in traced_inputs], out_shape)
        if len(traced_inputs) == 2 and _binary(target) is operator.sub:
            raise _unsupported(node, "the difference of two branches", model)
        if len(traced_inputs) != 1 or in_shape != out_shape:
            raise _unsupported(node, f"{_describe(node, target)} of two traced values", model)
        return _elementwise(node, target, args, inputs, first, out_shape, model)
    if target in (F.linear, aten.linear.default):
        weight, bias = args[1], args[2] if len(args) > 2 else node.kwargs.get("bias")
        return _dense(name, inputs, in_shape, out_shape, weight, bias, node, model)
    if type(target).__name__ == "OnnxMatMul" and len(traced_inputs) == 1:
        if node.args[0] is not first or not isinstance(args[1], torch.Tensor):
            raise _unsupported(node, "matmul of a constant by a traced value", model)
        if args[1].dim() != 2:
            raise _unsupported(node, "matmul by a non-matrix", model)
        return _dense(name, inputs, in_shape, out_shape, args[1].T, None, node, model)
    if (
        target in (torch.matmul, operator.matmul)
        and len(traced_inputs) == 1
        and node.args[0] is first
    ):
        weight = args[1]
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise _unsupported(node, "matmul by a non-matrix", model)
        return _dense(name, inputs, in_shape, out_shape, weight.T, None, node, model)
    raise _unsupported(node, _describe(node, target), model)


def _describe(node: fx.Node, target: Any) -> str:
    if isinstance(target, nn.Module):
        return f"module {type(target).__name__}"
    return f"{node.op} {getattr(target, '__name__', target)}"


def _dense(name, inputs, in_shape, out_shape, weight, bias, node, model) -> ops.Dense:
    if len(in_shape) != 1:
        raise _unsupported(node, f"a linear layer applied to a {len(in_shape) + 1}-D input", model)
    bias = torch.zeros(weight.shape[0]) if bias is None else bias  # build_graph detaches
    return ops.Dense(name, inputs, out_shape, weight=weight, bias=bias)


def _aten_conv(name, inputs, out_shape, args, in_shape) -> ops.Conv:
    """``aten.conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)``."""
    weight = args[1]
    bias = args[2] if len(args) > 2 and args[2] is not None else torch.zeros(weight.shape[0])
    stride, padding, dilation, groups = (*args[3:], *((1,), (0,), (1,), 1)[len(args[3:]) :])
    return ops.Conv(name, inputs, out_shape, weight=weight, bias=bias,
                    stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                    groups=groups, in_shape=in_shape)  # fmt: skip


def _pair(value) -> tuple[int, int]:
    value = tuple(value) if isinstance(value, list | tuple) else (value,)
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _activation(target: Any):
    if target in ATEN_ACTIVATIONS:
        return ATEN_ACTIVATIONS[target]
    if isinstance(target, nn.ReLU) or target in (F.relu, torch.relu):
        return torch.relu, RELU
    if isinstance(target, nn.Sigmoid) or target in (torch.sigmoid, F.sigmoid):
        return torch.sigmoid, SIGMOID
    if isinstance(target, nn.Tanh) or target in (torch.tanh, F.tanh):
        return torch.tanh, TANH
    return None


def _pool_settings(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Kernel, stride, padding, dilation and ceil_mode of a max-pooling module or call
    (``F.max_pool2d`` and ATen's take them in that order; no stride means the kernel's)."""
    if isinstance(target, nn.MaxPool2d):
        given = [target.kernel_size, target.stride, target.padding, target.dilation]
        ceil = target.ceil_mode
    else:
        keys = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
        values = dict(zip(keys, args[1:], strict=False)) | dict(kwargs)
        given = [values.get(key) for key in keys[:4]]
        ceil = bool(values.get("ceil_mode", False))
    if given[1] is None or given[1] == []:
        given[1] = given[0]
    defaults = (None, None, 0, 1)
    pairs = [_pair(v if v is not None else d) for v, d in zip(given, defaults, strict=True)]
    return dict(zip(("kernel", "stride", "padding", "dilation"), pairs, strict=True)) | {
        "ceil_mode": ceil
    }


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    items = tuple(int(v) for v in value)
    return items * 2 if len(items) == 1 else items  # type: ignore[return-value]


def _bind(fn, args, kwargs):
    """``fn`` with every argument but the tensor fixed; ``fn`` a method's name for a
    ``call_method`` node (``x.permute(0, 2, 3, 1)``)."""
    rest, fixed = args[1:], dict(kwargs)
    if isinstance(fn, str):
        return lambda x: getattr(x, fn)(*rest, **fixed)
    return lambda x: fn(x, *rest, **fixed)


def _is_shape_query(node: fx.Node, target: Any) -> bool:
    if node.op == "call_method":
        return node.target == "size"
    return target is getattr and node.args[1:] == ("shape",)


def _sizes_reshape_only(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Every use of a shape query is a reshape's argument (possibly through ``size[i]``):
    its value, the batch size of the tracing example included, is then never computed on."""
    for user in node.users:
        target = modules.get(user.target) if user.op == "call_module" else user.target
        if target is operator.getitem and user.args[0] is node:
            if not _sizes_reshape_only(user, modules):
                return False
        elif not _is_reshape(user, target) or user.args[0] is node:
            return False
    return True


def _is_reshape(node: fx.Node, target: Any) -> bool:
    if node.op == "call_method":
        return node.target in RESHAPES
    if target in (torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze):
        return True
    if target in ATEN_RESHAPES:
        return True
    kind = type(target).__name__
    return kind in {
        "GraphLayout", "OnnxReshape", "OnnxFlatten", "OnnxSqueezeStaticAxes",
        "OnnxUnsqueezeStaticAxes",
    }  # fmt: skip


ONNX_AVERAGES = {"OnnxGlobalAveragePool", "OnnxGlobalAveragePoolWithKnownInputShape"}


def _is_mean_or_sum(target: Any, rank: int) -> bool:
    """onnx2torch's ReduceMean/ReduceSum over per-sample axes (torch's dynamo exporter writes
    ``AdaptiveAvgPool2d(1)`` as a ReduceMean over H and W)."""
    if type(target).__name__ != "OnnxReduceStaticAxes" or not target.axes:
        return False
    per_sample = all(int(a) % rank != 0 for a in target.axes)
    return target.operation_type in ("ReduceMean", "ReduceSum") and per_sample


def _is_permutation(node: fx.Node, target: Any, args: Any) -> bool:
    """A transpose of the per-sample axes (NHWC <-> NCHW); the batch axis stays first."""
    if type(target).__name__ == "ChannelsLast":
        return True
    if type(target).__name__ == "OnnxTranspose":
        perm = getattr(target, "perm", None)
        return perm is not None and len(perm) > 0 and int(perm[0]) == 0
    if node.op == "call_method" and node.target == "permute" or target is torch.permute:
        perm = args[1:] if node.op == "call_method" else args[1]
        perm = perm[0] if len(perm) == 1 and isinstance(perm[0], list | tuple) else perm
        return len(perm) > 0 and int(perm[0]) == 0
    return False


def _binary(target: Any) -> Any:
    if target in ELEMENTWISE:
        return target
    if target in TORCH_BINARY:
        return TORCH_BINARY[target]
    if target in ATEN_BINARY:
        return ATEN_BINARY[target]
    function = getattr(target, "math_op_function", None)  # onnx2torch Add/Sub/Mul/Div
    if function is not None:
        return TORCH_BINARY.get(function, operator.truediv if "div" in function.__name__ else None)
    return None


def _is_elementwise(target: Any) -> bool:
    return _binary(target) is not None or type(target).__name__ == "Normalize"


def _elementwise(node, target, args, inputs, first, out_shape, model) -> ops.Elementwise:
    """scale and shift of an elementwise affine map, read off by evaluating it at 0 and 1,
    in float64 whatever the network's dtype: in float32, ``f(0)`` and ``f(1) - f(0)`` round
    to the spacing of ``f``'s values (a BatchNorm of mean -1e7 and scale 0.1 was read as
    0.125), and the graph then bounded another network (docs/certification.md)."""
    target, args = _widened(target), tuple(_widened(a) for a in args)
    kwargs = {k: _widened(v) for k, v in node.kwargs.items()}
    if isinstance(target, nn.BatchNorm1d | nn.BatchNorm2d):
        if target.training or target.running_mean is None:
            raise _unsupported(node, "BatchNorm in training mode", model)
        fn = target
    elif type(target).__name__ == "OnnxBatchNorm":  # its statistics are arguments

        def fn(x, args=args):
            return target(x, *args[1:])
    elif type(target).__name__ == "Normalize":
        fn = target
    elif target is aten.batch_norm.default:
        fn = _bind(target, args, kwargs=kwargs)
    else:
        position = next(i for i, a in enumerate(node.args) if a is first)
        op = _binary(target)
        if op is operator.truediv and position == 1:
            raise _unsupported(node, "division by a traced value", model)

        def fn(x, args=args, position=position, op=op):
            call = list(args)
            call[position] = x
            return op(*call) if op is not operator.neg else -x

        constant = [a for i, a in enumerate(args) if i != position]
        if any(isinstance(c, torch.Tensor) and c.dim() > 0 and c.shape[0] > 1 and
               c.dim() == len(out_shape) + 1 for c in constant):  # fmt: skip
            raise _unsupported(node, "an elementwise op with a per-sample constant", model)
    with torch.no_grad():
        zero = fn(torch.zeros(1, *out_shape, dtype=torch.float64))
        one = fn(torch.ones(1, *out_shape, dtype=torch.float64))
    shift, scale = zero[0].detach().double(), (one - zero)[0].detach().double()
    terms = _batchnorm_terms(target, args, scale)
    if terms is None:
        return ops.Elementwise(node.name, inputs, out_shape, scale=scale, shift=shift)
    return ops.Elementwise(node.name, inputs, out_shape, scale=scale, shift=shift,
                           roundings=BATCHNORM_ROUNDINGS, terms=terms)  # fmt: skip


# an eval BatchNorm in float32: 1/sqrt(var + eps), times the weight, the mean times that,
# the bias minus it, then x times the scale plus the shift (or (x - mean) * ... + bias):
# at most 6 roundings in a row on any path; 10 leaves room for another order
BATCHNORM_ROUNDINGS = 10


def _batchnorm_terms(target, args, scale: torch.Tensor) -> torch.Tensor | None:
    """|bias| + |scale * mean| of an eval BatchNorm (float64, ``scale``'s shape), the
    constant terms its float32 evaluation rounds (their folded sum, the shift, can cancel);
    None for any other elementwise map."""
    if isinstance(target, nn.BatchNorm1d | nn.BatchNorm2d):
        bias, mean = target.bias, target.running_mean
    elif target is aten.batch_norm.default or type(target).__name__ == "OnnxBatchNorm":
        bias, mean = args[2], args[3]
    else:
        return None
    channel = (-1,) + (1,) * (scale.dim() - 1)
    mean = mean.detach().double().reshape(channel)
    bias = 0.0 if bias is None else bias.detach().double().abs().reshape(channel)
    return (bias + (scale * mean).abs()).expand_as(scale).clone()


def _widened(value: Any) -> Any:
    """``value`` in float64: a module as a float64 copy, a floating tensor cast, anything
    else (a Python number, an integer tensor, a node's other arguments) as it is."""
    if isinstance(value, nn.Module):
        return copy.deepcopy(value).double()
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().double()
    return value
