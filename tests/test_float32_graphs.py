"""A float32 graph (``build_graph(..., dtype=torch.float32)``, the Python API) is verified
as its float64 copy: only float64 boxes and passes carry rounding margins
(``ibp_rounding.py``), so bounds computed in float32 could sit above the network's values.
Before, ``verify`` bounded the float32 graph itself: found by the verifier fuzzing
(testkit/verifier_fuzz.py; seed 32: DeepZ, the Lipschitz verifiers and RefineZono 1.3e-4
above a value the network takes, certified; seed 21: IBP and every CROWN-family verifier
7.5e-9 above, certified)."""

from __future__ import annotations

import pytest
import torch
from verifier_fuzz import random_case, reference

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError
from aisafety.verification.registry import make_verifier

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
