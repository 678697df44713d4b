"""A float64 property verified against a float32 graph is narrowed outward
(``Property.to``): box ends away from the box, offsets down, spec rows exactly or not at all;
counterexamples are checked against the property before the narrowing."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.falsify import replay
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.property import Property, rounded_down, rounded_up
from aisafety.verification.registry import make_verifier

F64 = torch.float64
# above the midpoint of 1 and 1 + 2^-23: float32's nearest is 1 + 2^-23, inside [L, ...]
L = 1 + 2.0**-24 + 2.0**-40


def one_dim(lower: float, upper: float, offset: float) -> Property:
    box = torch.tensor([[lower]], dtype=F64), torch.tensor([[upper]], dtype=F64)
    return Property(*box, torch.ones(1, 1, 1, dtype=F64), torch.tensor([[offset]], dtype=F64))


def scaled(weight: float, dtype: torch.dtype) -> nn.Module:
    net = nn.Linear(1, 1)
    with torch.no_grad():
        net.weight.fill_(weight)
        net.bias.zero_()
    return net.to(dtype)


def test_the_narrowed_box_holds_every_point_of_the_original_and_offsets_go_down():
    g = torch.Generator().manual_seed(0)
    scale = 10.0 ** torch.randint(-6, 6, (4000,), generator=g)
    lower = torch.randn(4000, generator=g, dtype=F64) * scale
    upper = lower + torch.rand(4000, generator=g, dtype=F64) * scale
    offset = torch.randn(4000, generator=g, dtype=F64) * scale
    spec = torch.ones(4000, 1, 1, dtype=F64)
    prop = Property(lower[:, None], upper[:, None], spec, offset[:, None])
    narrow = prop.to(torch.float32)
    assert narrow.lower.dtype == narrow.offset.dtype == torch.float32
    assert (narrow.lower.double() <= prop.lower).all() and (
        narrow.upper.double() >= prop.upper
    ).all()
    assert (narrow.offset.double() <= prop.offset).all()
    nearest = prop.lower.float().double()
    assert (nearest > prop.lower).sum() > 1000  # to nearest shrank the box on many samples
    # each end is the nearest float32 on its side: one float32 step away at most
    for wide, narrowed, toward in ((prop.lower, narrow.lower, torch.inf),
                                   (prop.upper, narrow.upper, -torch.inf)):  # fmt: skip
        step = torch.nextafter(narrowed, torch.full_like(narrowed, toward)).double()
        assert ((step - wide) * (1 if toward > 0 else -1) > 0).all()
    assert narrow.original is prop and narrow[3:5].original.lower.dtype == F64


def test_a_point_of_the_original_box_lies_in_the_narrowed_one():
    """0.1's nearest float32 is above it: to nearest the box [0.1, 0.2] lost the point 0.1."""
    prop = one_dim(0.1, 0.2, 0.0)
    narrow = prop.to(torch.float32)
    assert Fraction(float(narrow.lower)) <= Fraction(0.1) <= Fraction(float(narrow.upper))
    assert Fraction(float(prop.lower.float())) > Fraction(0.1)  # what to nearest gave


def test_rounding_helpers_keep_infinities_nan_and_exact_values():
    t = torch.tensor([0.5, 1e39, -1e39, 1e-50, -1e-50, float("nan"), torch.inf], dtype=F64)
    down, up = rounded_down(t, torch.float32), rounded_up(t, torch.float32)
    assert down[0] == up[0] == 0.5
    assert down[1] == torch.finfo(torch.float32).max and up[1] == torch.inf
    assert down[2] == -torch.inf and up[2] == -torch.finfo(torch.float32).max
    assert down[3] == 0 and up[3] > 0 and down[4] < 0 and up[4] == 0
    assert down[5].isnan() and up[5].isnan() and down[6] == up[6] == torch.inf


def test_added_down_narrows_a_wider_offset_down():
    bound = torch.zeros(3, dtype=torch.float32)
    offset = torch.tensor([0.1, -0.1, 1 / 3], dtype=F64)
    total = added_down(bound, offset)
    assert total.dtype == torch.float32 and (total.double() <= offset).all()


def test_a_float32_graph_does_not_certify_what_the_original_box_breaks(monkeypatch):
    """f = 3x on [L, 2], row f + d with d = -(3 + 2^-22): at x = L the row is
    3 L + d = -2^-24 + 3 * 2^-40 < 0. To nearest, L became 1 + 2^-23 and the exact minimum
    over that box, 3 + 3 * 2^-23, is above -d: a wrong certificate."""
    graph = build_graph(scaled(3.0, torch.float32), (1,), dtype=torch.float32)
    prop = one_dim(L, 2.0, -(3 + 2.0**-22))
    assert Fraction(3) * Fraction(L) + Fraction(float(prop.offset)) < 0
    verifier = make_verifier(default_registry(), "crown")
    seen = []

    def exact_minimum(graph, prop):  # 3 x is exact in float64 for a float32 x
        seen.append(prop)
        return 3 * prop.lower.double(), None

    monkeypatch.setattr(verifier, "lower_bounds", exact_minimum)
    result = verifier.verify(graph, prop)
    # since session 16 ``verify`` bounds a float32 graph as its float64 copy (only float64
    # passes carry rounding margins, tests/test_float32_graphs.py): the box is the given one
    assert seen and seen[0].lower.dtype == torch.float64 and float(seen[0].lower) == L
    assert result.verdicts[0].value != "certified"
    assert float(result.margins[0]) <= 0


def test_a_counterexample_outside_the_original_box_is_not_replayed():
    """The narrowed box reaches 1 (below L) and its offset -(1 + 2^-23) is below the
    original -(1 + 2^-30): x = 1 breaks the narrowed row but is not in the original box,
    where every row is above 0."""
    prop = one_dim(L, 2.0, -(1 + 2.0**-30))
    narrow = prop.to(torch.float32)
    assert float(narrow.lower) == 1.0
    model = scaled(1.0, torch.float32)
    candidate = torch.ones(1, 1, dtype=torch.float32)
    assert not bool(replay(model, narrow, candidate)[0])
    broken = one_dim(L, 2.0, -2.0).to(torch.float32)  # every point breaks it: replayed
    assert bool(replay(model, broken, candidate)[0])


def test_spec_rows_that_do_not_narrow_exactly_are_refused():
    prop = one_dim(0.0, 1.0, 0.0)
    prop.spec = torch.full((1, 1, 1), 0.1, dtype=F64)
    with pytest.raises(VerificationError, match="float64 graph"):
        prop.to(torch.float32)
    exact = one_dim(0.0, 1.0, 0.0)
    assert exact.to(torch.float32).spec.dtype == torch.float32  # +-1 rows narrow exactly
