"""A proved margin stays a lower bound once stored in float32 (``result.stored_margins``).

Verifiers bound in float64 and store margins in float32; a cast rounds to nearest, so
about half of the stored bounds sat up to half a float32 ulp (3e-8 relative) above what
was proved, and above the exact minimum on a linear net, where CROWN is exact up to
float64 rounding. The exact minimum is computed with ``fractions.Fraction``."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import Property
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import VANISHED, Verdict, stored_margins, stored_verdicts

SPEC = [[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]]


def linear_case(n: int = 24):
    """A float64 4 -> 3 linear net, ``n`` boxes and two rows with offsets that certify."""
    g = torch.Generator().manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.randn(3, 4, generator=g, dtype=torch.float64))
        net[0].bias.copy_(torch.randn(3, generator=g, dtype=torch.float64))
    x = torch.rand(n, 4, generator=g, dtype=torch.float64)
    spec = torch.tensor(SPEC, dtype=torch.float64).expand(n, 2, 3)
    offset = 10 + torch.rand(n, 2, generator=g, dtype=torch.float64)
    return net, Property(x - 0.05, x + 0.05, spec, offset)


def exact_margin(net: nn.Sequential, prop: Property, s: int) -> Fraction:
    """min over rows and the box of ``C (W x + b) + d``, in rational arithmetic."""
    w = [[Fraction(v) for v in row] for row in net[0].weight.tolist()]
    b = [Fraction(v) for v in net[0].bias.tolist()]
    lo, hi = prop.lower[s].tolist(), prop.upper[s].tolist()
    values = []
    for row, d in zip(SPEC, prop.offset[s].tolist(), strict=True):
        c = [Fraction(v) for v in row]
        r = [sum(c[k] * w[k][j] for k in range(3)) for j in range(4)]
        const = Fraction(d) + sum(c[k] * b[k] for k in range(3))
        ends = zip(r, lo, hi, strict=True)
        values.append(const + sum(min(ri * Fraction(a), ri * Fraction(z)) for ri, a, z in ends))
    return min(values)


@pytest.mark.parametrize("verifier", ["crown", "complete"])
def test_a_stored_margin_is_never_above_the_exact_minimum(verifier):
    net, prop = linear_case()
    graph = build_graph(net, (4,), "linear", dtype=torch.float64)
    checker = make_verifier(default_registry(), verifier, {"timeout": 60.0, "clock": "cpu"})
    result = checker.verify(graph, prop)
    assert result.verdicts == [Verdict.CERTIFIED] * len(prop)
    above = [s for s in range(len(prop))
             if Fraction(float(result.margins[s])) > exact_margin(net, prop, s)]  # fmt: skip
    assert above == []
    assert result.margins.dtype == torch.float32


def test_bounds_round_down_and_a_falsified_value_is_only_cast():
    wide = torch.tensor([0.1, -0.1, 1e300, -torch.inf, 0.1], dtype=torch.float64)
    verdicts = [Verdict.CERTIFIED, Verdict.UNKNOWN, Verdict.TIMEOUT, Verdict.TIMEOUT,
                Verdict.FALSIFIED]  # fmt: skip
    stored = stored_margins(wide, verdicts)
    assert bool((stored[:4].double() <= wide[:4]).all())
    assert float(stored[0]) == float(torch.nextafter(torch.tensor(0.1).float(), torch.tensor(0.0)))
    assert float(stored[1]) == float(torch.tensor(-0.1).float())  # already below: kept
    assert float(stored[2]) == float(torch.finfo(torch.float32).max)
    assert float(stored[4]) == float(torch.tensor(0.1).float())  # nearest, above 0.1


def vanishing_case() -> tuple[nn.Sequential, Property]:
    """y_0 = x on boxes [m, 2m]: the exact margin is m, 1e-46 (below float32's smallest
    subnormal, 1.4e-45), 1e-44 (a subnormal) and 0.5."""
    net = nn.Sequential(nn.Linear(1, 2)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0], [0.0]], dtype=torch.float64))
        net[0].bias.zero_()
    low = torch.tensor([[1e-46], [1e-44], [0.5]], dtype=torch.float64)
    spec = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64).expand(3, 1, 2)
    return net, Property(low, 2 * low, spec, torch.zeros(3, 1, dtype=torch.float64))


@pytest.mark.parametrize("verifier", ["ibp", "crown", "complete", "bab"])
def test_a_stored_row_is_certified_only_where_its_stored_margin_is_positive(verifier):
    """A proved margin below 1.4e-45 rounds down to 0 in float32: stored as certified with
    margin 0 the row would contradict itself, so the sample is unknown, saying why."""
    net, prop = vanishing_case()
    graph = build_graph(net, (1,), "linear", dtype=torch.float64)
    checker = make_verifier(default_registry(), verifier, {"timeout": 10.0, "clock": "cpu"})
    result = checker.verify(graph, prop)
    assert result.verdicts == [Verdict.UNKNOWN, Verdict.CERTIFIED, Verdict.CERTIFIED]
    assert result.notes[0] == VANISHED
    assert result.margins[0] == 0  # still a lower bound of the exact 1e-46
    assert 0 < float(result.margins[1]) <= 1e-44
    assert result.certified.tolist() == (result.margins > 0).tolist()


def test_only_a_certified_margin_that_vanished_changes_its_verdict():
    stored = torch.tensor([0.0, 0.0, 1e-45, -1.0, 0.0])
    verdicts = [Verdict.CERTIFIED, Verdict.FALSIFIED, Verdict.CERTIFIED, Verdict.UNKNOWN,
                Verdict.TIMEOUT]  # fmt: skip
    notes = ["", "", "", "bounds too loose", "timeout"]
    assert stored_verdicts(stored, verdicts, notes) == (
        [Verdict.UNKNOWN, Verdict.FALSIFIED, Verdict.CERTIFIED, Verdict.UNKNOWN, Verdict.TIMEOUT],
        [VANISHED, "", "", "bounds too loose", "timeout"],
    )
