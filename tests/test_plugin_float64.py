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


def _complete(graph: BoundGraph, prop: Property):
    """``complete`` on a net this small takes its MILP engine, whose batch skips the base's."""
    verifier = build_registry().create("verifier", "complete", {"timeout": 5.0, "clock": "cpu"})
    assert verifier.engine(graph) == "milp"
    return verifier.verify(graph, prop)


ROUTES = {
    "verify()": lambda: _verifier().verify(_graph(torch.float32), _property()),
    "verify_disjuncts()": lambda: _disjuncts(torch.float32),
    "complete's verify()": lambda: _complete(_graph(torch.float32), _property()),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_refusal_inside_a_route_names_the_route_not_the_fix_for_direct_calls(monkeypatch, route):
    """Raised inside ``verify`` (or ``verify_disjuncts``), "Call verify()" was untrue: the
    caller did; the message says the route lost its float64 copy (a defect to report).
    ``complete``'s MILP engine checked nothing (its batch replaces the base's)."""
    monkeypatch.setattr(BoundGraph, "in_dtype", lambda graph, dtype: graph)
    with pytest.raises(VerificationError) as refusal:
        ROUTES[route]()
    message = str(refusal.value)
    assert "Call verify()" not in message and "in_dtype(torch.float64)" not in message
    assert f"{route.split()[-1]} bounds the graph's float64 copy" in message
    assert "torch.float32 graph" in message and "please report it" in message
    assert DtypeRecorder.handed == []


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


def test_the_vnncomp_route_bounds_a_float32_graphs_float64_copy_as_verify_does():
    """``verify_disjuncts`` (public: the fuzz hands it networks that are not ONNX files)
    bounded a conjunction's atoms by a direct ``lower_bounds`` on the graph it was given,
    and (session 19) refused a float32 one where ``verify`` bounds its float64 copy. It
    now does as ``verify`` does: every graph the plugin is handed is float64."""
    for dtype in (torch.float64, torch.float32):
        assert _disjuncts(dtype).status == "unknown"  # -inf proves no atom
        assert DtypeRecorder.handed and all(
            seen == (torch.float64,) * 4 for seen in DtypeRecorder.handed
        )
        DtypeRecorder.handed.clear()


def _value(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor) -> float:
    """The least over 4,096 grid points and the corners of max over IMPOSSIBLE's atoms (in
    float64 on the float32 weights): no proved margin may exceed it."""
    grid = torch.linspace(0, 1, 64, dtype=torch.float64)
    a, b = torch.meshgrid(grid, grid, indexing="ij")
    t = torch.stack([a.flatten(), b.flatten()], 1)
    x = (lower.flatten() + t * (upper - lower).flatten()).reshape(-1, 1, 1, 2)
    with torch.no_grad():
        y = net.double()(x)
    rows = torch.stack([c @ y.T + d for c, d in IMPOSSIBLE[0]])
    return float(rows.amax(0).amin())


@pytest.mark.parametrize("verifier", ["crown", "bab"])
def test_a_float32_graph_on_the_vnncomp_route_gets_its_float64_copys_sound_answer(verifier):
    """The answer on a float32 graph is the float64 copy's (status and margin), below the
    property's value at every sampled point: sound, as ``verify``'s on the same graph."""
    prop, registry, settings = _property(), build_registry(), {"timeout": 5.0, "clock": "cpu"}
    answers = [
        verify_disjuncts(registry, _Net(_graph(dtype), _net()), prop.lower, prop.upper,
                         IMPOSSIBLE, verifier, settings)
        for dtype in (torch.float32, torch.float64)
    ]  # fmt: skip
    assert answers[0].status == answers[1].status == "unsat"
    assert answers[0].margin == answers[1].margin
    assert 0 < answers[0].margin <= _value(_net(), prop.lower, prop.upper) + 1e-9
