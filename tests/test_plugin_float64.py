"""A plugin verifier gets float64 graphs and boxes only, without calling ``require_float64``
itself: the routes that hand a graph and a property to any verifier's ``lower_bounds``
(``Verifier.verify``'s batches, the VNN-COMP disjuncts' first pass) check them, naming the
verifier. Before session 19 only the built-ins checked (each in its own ``lower_bounds``),
so a plugin handed a float32 graph bounded it without float64's rounding margins."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from aisafety.plugin import BoundGraph, Property, Verifier, hookimpl
from aisafety.plugins import build_registry
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.vnncomp import verify_disjuncts


class DtypeRecorder(Verifier):
    """A plugin verifier as docs/plugins.md's hook list shows one, without the dtype check:
    it records the dtypes it gets and proves nothing (-inf: sound on any box)."""

    name = "dtype-recorder"
    description = "records the dtypes its lower_bounds is handed (a test plugin)"
    handed: ClassVar[list[tuple[torch.dtype, ...]]] = []  # graph, lower, upper, spec

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.handed.append((graph.dtype, prop.lower.dtype, prop.upper.dtype, prop.spec.dtype))
        return torch.full(prop.offset.shape, -torch.inf, dtype=prop.lower.dtype), None


def _registry():
    plugin = types.ModuleType("dtype_plugin")
    plugin.aisafety_verifiers = hookimpl(lambda: [DtypeRecorder])
    registry = build_registry(extra_plugins=[("dtype-plugin", plugin)])
    assert "dtype-recorder" in registry.names("verifier"), registry.failures
    return registry


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


def _graph(dtype: torch.dtype) -> BoundGraph:
    return build_graph(_net(), (1, 1, 2), "two-class", dtype=dtype)


def _property() -> Property:
    lower = torch.full((1, 1, 1, 2), 0.4, dtype=torch.float64)
    spec = torch.tensor([[[1.0, -1.0]]], dtype=torch.float64)
    return Property(lower, lower + 0.1, spec, torch.zeros(1, 1, dtype=torch.float64))


@pytest.fixture(autouse=True)
def _fresh_record():
    DtypeRecorder.handed.clear()
    yield
    DtypeRecorder.handed.clear()


def _verifier():
    return _registry().create("verifier", "dtype-recorder", {"timeout": 5.0, "clock": "cpu"})


def test_verify_hands_a_plugin_the_float64_copy_of_a_float32_graph():
    result = _verifier().verify(_graph(torch.float32), _property())
    assert DtypeRecorder.handed == [(torch.float64,) * 4]
    assert not result.certified.any()  # -inf proves nothing


def test_a_verify_route_that_kept_a_float32_graph_is_refused_naming_the_plugin(monkeypatch):
    """Were ``verify``'s widening lost (here: ``in_dtype`` made to return the graph as is),
    the plugin would bound the float32 graph; the batch's check refuses it first."""
    monkeypatch.setattr(BoundGraph, "in_dtype", lambda graph, dtype: graph)
    with pytest.raises(VerificationError, match=r"verifier 'dtype-recorder'.*torch\.float32"):
        _verifier().verify(_graph(torch.float32), _property())
    assert DtypeRecorder.handed == []  # refused before its lower_bounds ran


@dataclass
class _Net:
    """Stands for ``vnncomp.Network``: the bound graph and the replay."""

    graph: BoundGraph
    module: nn.Module

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.reshape(len(x), 1, 1, 2).float()).double()


# one disjunct of two atoms (c . y + d <= 0), neither reachable: the conjunction route
IMPOSSIBLE = [[(torch.tensor([1.0, -1.0], dtype=torch.float64), 100.0),
               (torch.tensor([-1.0, 1.0], dtype=torch.float64), 100.0)]]  # fmt: skip


def _disjuncts(dtype: torch.dtype):
    prop = _property()
    net = _Net(_graph(dtype), _net())
    settings = {"timeout": 5.0, "clock": "cpu"}
    return verify_disjuncts(
        _registry(), net, prop.lower, prop.upper, IMPOSSIBLE, "dtype-recorder", settings
    )


def test_the_vnncomp_first_pass_hands_a_plugin_float64_and_refuses_a_float32_graph():
    """``verify_disjuncts`` (public: the fuzz hands it networks that are not ONNX files)
    bounded a conjunction's atoms by a direct ``lower_bounds`` on the graph it was given."""
    assert _disjuncts(torch.float64).status == "unknown"  # -inf proves no atom
    assert DtypeRecorder.handed and all(
        seen == (torch.float64,) * 4 for seen in DtypeRecorder.handed
    )
    DtypeRecorder.handed.clear()
    with pytest.raises(VerificationError, match=r"verifier 'dtype-recorder'.*torch\.float32"):
        _disjuncts(torch.float32)
    assert DtypeRecorder.handed == []
