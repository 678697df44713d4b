"""IBP through sigmoid and tanh holds the exact range in float64.

``[f(l), f(u)]`` computed by ``torch.sigmoid``/``torch.tanh`` rounds (neither is correctly
rounded: up to 1.99 and 0.75 ulps measured), so an end can lie inside the exact range, and
saturates: ``sigmoid(40)`` is 1.0, above the exact 1 - 4e-18. The reference is Python's
``decimal`` at 60 digits (its ``exp`` is correctly rounded); the exact ends are compared
with the box's as exact rationals."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
import torch

from aisafety.verification.ibp_rounding import FUNCTION_ULPS
from aisafety.verification.ops import Activation
from aisafety.verification.relaxations import RELU, SIGMOID, TANH


def exact(name: str, x: float) -> Decimal:
    """sigmoid or tanh of ``x`` to 60 digits (a series near 0, where e^2x - 1 cancels)."""
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)
        if name == "sigmoid":
            return 1 / (1 + (-d).exp())
        if abs(x) < 1e-6:
            return d - d**3 / 3 + 2 * d**5 / 15 - 17 * d**7 / 315
        e = (2 * d).exp()
        return (e - 1) / (e + 1)


def ends() -> torch.Tensor:
    """Pre-activation ends at every scale, saturation and underflow included (sorted pairs)."""
    g = torch.Generator().manual_seed(0)
    scales = (1e-9, 1e-3, 0.3, 3.0, 12.0, 40.0)
    x = torch.cat([torch.randn(300, generator=g, dtype=torch.float64) * s for s in scales])
    x = torch.cat([x, torch.tensor([19.0, 36.0, 40.0, -36.0, 700.0, -710.0, -745.0, 0.0])])
    pairs = torch.stack([x, x.flip(0)], 1)
    return pairs.sort(1).values


def _activation(relaxation) -> Activation:
    fn = torch.relu if relaxation is RELU else relaxation.fn
    return Activation("act", [0], (1,), fn=fn, relaxation=relaxation)


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_the_box_of_an_s_shape_holds_its_exact_range(relaxation):
    pairs = ends()
    lo, hi = _activation(relaxation).interval((pairs[:, :1], pairs[:, 1:]))
    inside = [
        (a, b) for a, b, y_lo, y_hi in zip(*pairs.T.tolist(), lo.flatten().tolist(),
                                           hi.flatten().tolist(), strict=True)
        if Decimal(y_lo) > exact(relaxation.name, a) or Decimal(y_hi) < exact(relaxation.name, b)
    ]  # fmt: skip
    assert inside == []


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_the_widening_is_a_few_hundred_ulps(relaxation):
    x = ends()
    lo, hi = _activation(relaxation).interval((x[:, :1], x[:, 1:]))
    y_lo, y_hi = relaxation.fn(x[:, :1]), relaxation.fn(x[:, 1:])
    tiny = torch.finfo(torch.float64).tiny
    room = (FUNCTION_ULPS + 1) * 2.0**-52
    assert bool(((y_lo - lo) <= room * y_lo.abs() + 2 * tiny).all())
    assert bool(((hi - y_hi) <= room * y_hi.abs() + 2 * tiny).all())
    assert bool((lo < y_lo).all()) and bool((hi > y_hi).all())


def test_relu_and_float32_boxes_are_not_widened():
    x = ends()
    box = (x[:, :1], x[:, 1:])
    lo, hi = _activation(RELU).interval(box)
    assert torch.equal(lo, torch.relu(box[0])) and torch.equal(hi, torch.relu(box[1]))
    lo, hi = _activation(SIGMOID).interval((box[0].float(), box[1].float()))
    assert torch.equal(lo, torch.sigmoid(box[0].float()))
    assert torch.equal(hi, torch.sigmoid(box[1].float()))
