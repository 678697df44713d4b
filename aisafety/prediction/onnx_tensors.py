"""Every tensor an ONNX model keeps, wherever the graph keeps it.

External weights (``model.onnx.data``) may back any tensor: a graph's initializers, a node's
tensor attributes (``Constant``'s ``value``), and both of these inside subgraphs (``If``
branches, ``Loop``/``Scan`` bodies) and model-local functions. onnx walks them with a private
helper (``external_data_helper._get_all_tensors``) that a release may rename or drop, so the
walk is our own, over the public protobuf fields only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def all_tensors(model: Any) -> Iterator[Any]:
    """The ``TensorProto``s of ``model`` (an ``onnx.ModelProto``), subgraphs included."""
    yield from graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def graph_tensors(graph: Any) -> Iterator[Any]:
    """A graph's initializers and its nodes' tensor attributes, subgraphs included."""
    yield from graph.initializer
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[Any]) -> Iterator[Any]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from graph_tensors(attribute.g)
            for graph in attribute.graphs:
                yield from graph_tensors(graph)
