"""``lower_bounds`` called directly on a float32 graph (``verify`` bounds its float64 copy,
tests/test_float32_graphs.py). The bound-propagation verifiers bound the graph itself, with
no rounding margin (training's objective, docs/certification.md); ``k-relu``, ``lp-full``,
``refinezono``, ``bab`` and ``complete``, whose LP rows and searches are float64, refuse with
a ``VerificationError`` naming the verifier, the dtype and the fix. They raised torch's
dtype mismatch from deep inside (``mat1 and mat2 must have the same dtype``, ``scatter():
Expected self.dtype to be equal to src.dtype``) or, for ``bab`` on a ReLU net, bounded it
without a margin."""

from __future__ import annotations

import pytest
import torch
from verifier_fuzz import random_case

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError
from aisafety.verification.registry import make_verifier

REGISTRY = default_registry()
FLOAT64_ONLY = ("k-relu", "lp-full", "refinezono", "bab", "complete")
# float32 fuzz cases: a dense ReLU net, a convolutional one, a sigmoid/tanh net (where
# ``bab``'s S-shape search failed)
SEEDS = (1002, 1003, 1011)


@pytest.fixture(scope="module")
def cases():
    built = [random_case(seed) for seed in SEEDS]
    assert all(case.graph.dtype == torch.float32 for case in built)
    return built


def takes(name: str, graph) -> bool:
    """Whether the verifier takes the graph's ops (its ``check``; DeepZ refuses sigmoid)."""
    try:
        REGISTRY.get("verifier", name)().check(graph)
    except VerificationError:
        return False
    return True


def direct(name: str, graph, prop):
    verifier = make_verifier(REGISTRY, name, {"timeout": 2.0, "clock": "cpu"})
    with torch.no_grad():
        return verifier.lower_bounds(graph, prop)


@pytest.mark.parametrize("name", FLOAT64_ONLY)
def test_a_float64_only_verifier_refuses_a_float32_graph_and_names_the_fix(name, cases):
    ran = 0
    for case in filter(lambda case: takes(name, case.graph), cases):
        ran += 1
        with pytest.raises(VerificationError) as refused:
            direct(name, case.graph, case.prop.to(torch.float32))
        message = str(refused.value)
        assert f"{name!r}" in message and "torch.float32" in message
        assert "verify" in message and "in_dtype(torch.float64)" in message
    assert ran


@pytest.mark.parametrize("name", FLOAT64_ONLY)
def test_the_fix_named_works(name, cases):
    """The float64 copy, as the message says (and as ``verify`` does), is bounded."""
    case = cases[0]
    bounds, _ = direct(name, case.graph.in_dtype(torch.float64), case.prop)
    assert bounds.shape == case.prop.offset.shape and not bounds.isnan().any()


@pytest.mark.parametrize("name", REGISTRY.names("verifier"))
def test_no_verifier_raises_a_raw_dtype_error_on_a_float32_graph(name, cases):
    """Every registered verifier bounds a float32 graph directly or refuses it by name."""
    for case in filter(lambda case: takes(name, case.graph), cases):
        try:
            bounds, _ = direct(name, case.graph, case.prop.to(torch.float32))
        except VerificationError as refused:
            assert name in FLOAT64_ONLY, str(refused)
            continue
        assert name not in FLOAT64_ONLY
        assert bounds.shape == case.prop.offset.shape
