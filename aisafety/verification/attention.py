"""Find why a transformer cannot be bounded, before the first op the graph builder refuses.

Attention multiplies two values computed from the input (queries by keys, then the softmax
weights by values). Every verifier here bounds the same graph (``graph.build_graph``), whose
ops are linear in one bounded value or elementwise activations; a product of two bounded
values needs a bilinear relaxation, and softmax its own, which no op has. Without this
check a ViT exported to ONNX fails at its first shape computation (``OnnxShape``), which
says nothing about the real obstacle.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

aten = torch.ops.aten
MATMULS = {torch.matmul, operator.matmul, torch.bmm, torch.einsum, aten.matmul.default,
           aten.bmm.default, F.scaled_dot_product_attention}  # fmt: skip
SOFTMAXES = {F.softmax, torch.softmax, aten.softmax.int, aten._softmax.default}
# torch's attention modules: traced as one call each (their forwards branch on their inputs,
# which torch.fx cannot trace), so the graph builder names them here as attention
ATTENTION_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
                     nn.TransformerDecoderLayer, nn.TransformerDecoder, nn.Transformer)  # fmt: skip
_ATTENTION_NAMES = {cls.__name__ for cls in ATTENTION_MODULES}


def _kind(node: fx.Node, modules: dict[str, nn.Module]) -> Any:
    return type(modules[node.target]).__name__ if node.op == "call_module" else node.target


def _is_shape(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """A shape query: its value is the same for every input of a given shape."""
    kind = _kind(node, modules)
    if node.op == "call_method":
        return node.target in ("size", "dim")
    return kind == "OnnxShape" or (kind is getattr and node.args[1:] == ("shape",))


def _is_product(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    kind = _kind(node, modules)
    return (
        kind == "OnnxMatMul"
        or kind in _ATTENTION_NAMES
        or (node.op == "call_function" and kind in MATMULS)
    )


def _is_softmax(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    kind = _kind(node, modules)
    if node.op == "call_method":
        return node.target == "softmax"
    return (isinstance(kind, str) and kind.startswith(("OnnxSoftmax", "Softmax"))) or (
        node.op == "call_function" and kind in SOFTMAXES
    )


def product_of_inputs(graph: fx.Graph, modules: dict[str, nn.Module]) -> fx.Node | None:
    """The first node multiplying two values that both depend on the input, if any."""
    computed: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            computed.add(node)
            continue
        if _is_shape(node, modules):
            continue
        depends = [n for n in node.all_input_nodes if n in computed]
        if not depends:
            continue
        computed.add(node)
        operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
        if _is_product(node, modules) and (
            _kind(node, modules) in _ATTENTION_NAMES
            or (len(operands) == 2 and all(a in computed for a in operands))
        ):
            return node
    return None


def attention_message(
    node: fx.Node, graph: fx.Graph, modules: dict[str, nn.Module], model: str
) -> str:
    """Which node, why no verifier here bounds it, and what does."""
    kind = _kind(node, modules)
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    operands = " and ".join(a.name for a in node.args[:2] if isinstance(a, fx.Node))
    softmax = [n.name for n in graph.nodes if _is_softmax(n, modules)]
    also = f"; it also has {len(softmax)} softmax node(s) ({softmax[0]}, ...)" if softmax else ""
    return (
        f"model {model!r} cannot be bounded: node {node.name!r} ({kind}) multiplies two values "
        f"computed from the input ({operands or 'its inputs'}), as a transformer's attention "
        f"does{also}. No verifier here (ibp, crown, alpha-crown, deeppoly, deepz, the LP, "
        "complete and bab ones included) bounds a product of two bounded values or a "
        "softmax: they take products by constants only. certified-accuracy and verify "
        "cannot run on this model; its "
        "attacks, clean and activation metrics do. Bilinear and softmax relaxations (as in "
        "auto_LiRPA's CROWN, which VNN-COMP 2023's ViT benchmark used) would be needed"
    )
