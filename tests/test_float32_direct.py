"""``lower_bounds`` called directly with another dtype than float64 (``verify`` bounds the
graph's float64 copy on the property widened to float64, tests/test_float32_graphs.py).
Every registered verifier refuses a float32 graph, with a float32 or a float64 property,
and a float32 box on a float64 graph, with a ``VerificationError`` naming the verifier,
the dtypes and the fix; the fix bounds below every sampled value.

Before: ``k-relu``, ``lp-full``, ``refinezono``, ``bab`` and ``complete`` refused a float32
graph (session 17); the other verifiers bounded it with no rounding margin, above values
the network takes (1.7e-8 to 2.7e-6 on these cases), and every verifier raised torch's
``mat1 and mat2 must have the same dtype`` (or a convolution's) on a float64 property with
a float32 graph or a float32 box with a float64 graph."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from verifier_fuzz import random_case, reference

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError
from aisafety.verification.registry import make_verifier

REGISTRY = default_registry()
NAMES = REGISTRY.names("verifier")
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


def refused(name: str, graph, prop) -> str:
    with pytest.raises(VerificationError) as refusal:
        direct(name, graph, prop)
    message = str(refusal.value)
    assert f"{name!r}" in message and "torch.float32" in message and "verify" in message
    return message


@pytest.mark.parametrize("name", NAMES)
def test_every_verifier_refuses_a_float32_graph_and_names_the_fix(name, cases):
    """With a float32 property (no rounding margin) and a float64 one (torch's dtype error)."""
    ran = 0
    for case in filter(lambda case: takes(name, case.graph), cases):
        for dtype in (torch.float32, torch.float64):
            ran += 1
            message = refused(name, case.graph, case.prop.to(dtype))
            assert f"a torch.float32 graph and the property a {dtype} box" in message
            assert "in_dtype(torch.float64)" in message
    assert ran


@pytest.mark.parametrize("name", NAMES)
def test_every_verifier_refuses_a_float32_box_on_a_float64_graph(name, cases):
    ran = 0
    for case in filter(lambda case: takes(name, case.graph), cases):
        ran += 1
        graph = case.graph.in_dtype(torch.float64)
        message = refused(name, graph, case.prop.to(torch.float32))
        assert "prop.to(torch.float64)" in message
    assert ran


@pytest.mark.parametrize("name", NAMES)
def test_every_verifier_refuses_a_float32_spec_or_offset_on_a_float64_graph(name, cases):
    """Before (session 19): a float32 spec was torch's ``addmv ... must have the same
    dtype`` in 11 verifiers and taken silently by the 7 others; a float32 offset was taken
    by all. The property's every tensor is float64 as its box is."""
    ran = 0
    for case in filter(lambda case: takes(name, case.graph), cases):
        ran += 1
        graph, prop = case.graph.in_dtype(torch.float64), case.prop.to(torch.float64)
        for what in ("spec", "offset"):
            wrong = replace(prop, **{what: getattr(prop, what).float()})
            message = refused(name, graph, wrong)
            assert f"the property's {what} is torch.float32 on model " in message
            assert "torch.float64 graph" in message and "prop.to(torch.float64)" in message
    assert ran


@pytest.fixture(scope="module")
def references(cases):
    return [reference(case) for case in cases]


@pytest.mark.parametrize("name", NAMES)
def test_the_fix_named_bounds_below_every_sampled_value(name, cases, references):
    """The float64 copy on the float64 property, as the message says (and as ``verify``
    does): below the least value found at sampled points and by PGD (``verifier_fuzz``)."""
    ran = 0
    for case, ref in zip(cases, references, strict=True):
        if not takes(name, case.graph):
            continue
        ran += 1
        prop = case.prop.to(torch.float64)
        bounds, _ = direct(name, case.graph.in_dtype(torch.float64), prop)
        assert bounds.shape == prop.offset.shape and not bounds.isnan().any()
        assert (bounds + prop.offset <= ref.lowest + ref.tolerance).all()
    assert ran


# the verifiers with alpha-CROWN's root and boxes (``bounds_and_boxes``: vnncomp's joint
# search, ``complete``'s MILP engine and tests call it directly, not through lower_bounds)
ROOTED = [name for name in NAMES if hasattr(REGISTRY.get("verifier", name), "bounds_and_boxes")]


@pytest.mark.parametrize("name", ROOTED)
def test_bounds_and_boxes_refuses_a_float32_graph(name, cases):
    """Before (session 19) it bounded a float32 graph on a float32 property with no rounding
    margin and raised torch's dtype error on a float64 one; now the check every
    ``lower_bounds`` makes, with the same fix named."""
    assert {"alpha-crown", "bab", "complete"} <= set(ROOTED)
    ran = 0
    for case in filter(lambda case: takes(name, case.graph), cases):
        verifier = make_verifier(REGISTRY, name, {"timeout": 2.0, "clock": "cpu"})
        for dtype in (torch.float32, torch.float64):
            ran += 1
            with pytest.raises(VerificationError) as refusal, torch.no_grad():
                verifier.bounds_and_boxes(case.graph, case.prop.to(dtype))
            message = str(refusal.value)
            assert f"verifier {name!r}" in message
            assert f"a torch.float32 graph and the property a {dtype} box" in message
            assert "Call verify()" in message and "in_dtype(torch.float64)" in message
    assert ran
