"""A float32 graph (``build_graph(..., dtype=torch.float32)``, the Python API) is verified
as its float64 copy: only float64 boxes and passes carry rounding margins
(``ibp_rounding.py``), so bounds computed in float32 could sit above the network's values.
Before, ``verify`` bounded the float32 graph itself: found by the verifier fuzzing
(testkit/verifier_fuzz.py; seed 32: DeepZ, the Lipschitz verifiers and RefineZono 1.3e-4
above a value the network takes, certified; seed 21: IBP and every CROWN-family verifier
7.5e-9 above, certified). The float64 copy is of the network given: a weight that float32
rounds (BatchNorm's scale and shift, a float64 network's weights) is kept as it was (seed
9: every verifier 9.2e-5 above a value with the rounded BatchNorm)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from verifier_fuzz import random_case, reference

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.registry import make_verifier
from tests.test_elementwise_weights import batchnorm, crown_at_the_point

REGISTRY = default_registry()


@pytest.fixture(scope="module")
def cases():
    built = [random_case(seed) for seed in (21, 32)]
    assert all(case.graph.dtype == torch.float32 for case in built)
    return [(case, reference(case)) for case in built]


@pytest.mark.parametrize("name", ["ibp", "crown", "deepz", "op-norm", "fastlip"])
def test_a_float32_graphs_margins_are_below_its_values(name, cases):
    verifier = make_verifier(REGISTRY, name, {"clock": "cpu"})
    ran = 0
    for case, ref in cases:
        try:
            verifier.check(case.graph)
        except VerificationError:
            continue  # DeepZ and the Lipschitz bounds take seed 32's ReLU net only
        ran += 1
        result = verifier.verify(case.graph, case.prop, case.model)
        bounded = ~result.falsified
        lowest = ref.lowest.amin(1)
        over = (result.margins.double() - lowest - 1e-12 * (1 + lowest.abs()))[bounded]
        assert (over <= 0).all(), f"{name} seed {case.seed}: margin above a value by {over.max()}"
        assert not (result.certified & (lowest <= 0)).any()
    assert ran


def test_the_float32_graph_itself_is_kept():
    """Its float64 copy is made once and the caller's graph stays float32."""
    case = random_case(21)
    verifier = make_verifier(REGISTRY, "ibp", {"clock": "cpu"})
    verifier.verify(case.graph, case.prop)
    assert case.graph.dtype == torch.float32
    assert all(op.weight.dtype == torch.float32 for op in case.graph.ops if op.kind == "dense")


def _tensors(graph) -> list[torch.Tensor]:
    return [v for op in graph.ops for v in vars(op).values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("source", ["batchnorm", "float64 net"])
def test_the_float64_copy_is_the_network_given(source):
    """Bit for bit the float64 graph's weights, not the float32 graph's widened."""
    torch.manual_seed(0)
    if source == "batchnorm":
        net = nn.Sequential(nn.Linear(3, 4), batchnorm(torch.randn(4) * 1e3, torch.rand(4) + 0.1,
                                                       torch.randn(4), torch.randn(4)))  # fmt: skip
    else:
        net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
        with torch.no_grad():  # weights float32 does not hold
            for parameter in net.parameters():
                parameter.div_(3)
    narrow = build_graph(net.eval(), (3,), source, dtype=torch.float32)
    wide = build_graph(net.eval(), (3,), source, dtype=torch.float64)
    assert all(t.dtype == torch.float32 for t in _tensors(narrow))
    copied = _tensors(narrow.in_dtype(torch.float64))
    assert all(torch.equal(a, b) for a, b in zip(copied, _tensors(wide), strict=True))
    assert not all(torch.equal(a.double(), b) for a, b in zip(_tensors(narrow), copied,
                                                              strict=True))  # fmt: skip


def test_crown_on_a_float32_batchnorm_graph_does_not_certify_a_violation():
    """f(x) = 999995.0549 + 0.0999995 x; float32 rounds the shift up to 999995.0625, 0.0076
    above f: the float32 graph certified ``f(x) >= f(0.9) + 0.004`` at the point 0.9."""
    norm = batchnorm(torch.tensor([-1e7]), torch.tensor([1.0]), [0.1], [0.04])
    result = crown_at_the_point(norm, torch.float32)
    assert not result.certified.any()
    assert result.margins.double().item() <= -0.004 + 1e-9
