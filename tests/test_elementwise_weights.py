"""An elementwise affine op's scale and shift (BatchNorm in eval mode, normalisation, a
constant's multiply or add) are read off the network by evaluating it at 0 and 1. Read in
a float32 network's own dtype, ``f(0)`` and ``f(1) - f(0)`` round to the spacing of ``f``'s
values: the graph then bounded another network, and certified properties the network
violates (found by the verifier fuzzing, testkit/verifier_fuzz.py, seeds 9 and 17)."""

from __future__ import annotations

import torch
from torch import nn

from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import CrownVerifier
from aisafety.verification.property import Property


def batchnorm(mean: torch.Tensor, var: torch.Tensor, weight, bias) -> nn.BatchNorm1d:
    norm = nn.BatchNorm1d(len(mean)).eval()
    with torch.no_grad():
        for buffer, value in zip((norm.running_mean, norm.running_var, norm.weight, norm.bias),
                                 (mean, var, weight, bias), strict=True):  # fmt: skip
            buffer.copy_(torch.as_tensor(value))
    return norm


def exact(norm: nn.BatchNorm1d) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and shift in float64 from the float32 statistics."""
    stats = {k: v.double() for k, v in norm.state_dict().items() if v.is_floating_point()}
    scale = stats["weight"] / torch.sqrt(stats["running_var"] + norm.eps)
    return scale, stats["bias"] - stats["running_mean"] * scale


def test_a_float32_batchnorm_is_read_in_float64():
    """Within float64's rounding, not float32's (the error was ~1e-4 here)."""
    torch.manual_seed(0)
    norm = batchnorm(torch.randn(4) * 1e3, torch.rand(4) + 0.1, torch.randn(4), torch.randn(4))
    graph = build_graph(nn.Sequential(norm), (4,), "bn", dtype=torch.float64)
    (op,) = [op for op in graph.ops if op.kind == "elementwise"]
    scale, shift = exact(norm)
    # f(1) - f(0) in float64 rounds to a few ulps of f's values; float32's ulp is 2^29 x
    size = shift.abs() + (norm.running_mean.double() * scale).abs() + 1
    assert ((op.scale - scale).abs() <= 2**-48 * size).all()
    assert ((op.shift - shift).abs() <= 2**-48 * size).all()


def crown_at_the_point(norm: nn.BatchNorm1d, dtype: torch.dtype):
    """CROWN on the point 0.9 with the row ``f(x) - f(0.9) - 0.004`` (violated there)."""
    graph = build_graph(nn.Sequential(norm), (1,), "bn", dtype=dtype)
    scale, shift = exact(norm)
    x = torch.tensor([[0.9]], dtype=torch.float64)
    value = float(scale * 0.9 + shift)
    prop = Property(x, x, torch.ones(1, 1, 1, dtype=torch.float64),
                    torch.tensor([[-(value + 0.004)]], dtype=torch.float64))  # fmt: skip
    return CrownVerifier({"clock": "cpu"}).verify(graph, prop)


def test_crown_does_not_certify_what_the_network_violates():
    """BatchNorm with mean -1e7, scale ~0.1: f(x) ~ 999995.015 + 0.1 x. Read in float32 the
    graph held scale 0.125 and shift 999995.0, 0.0076 above f at x = 0.9, so CROWN
    certified ``f(x) >= f(0.9) + 0.004`` on the point 0.9."""
    norm = batchnorm(torch.tensor([-1e7]), torch.tensor([1.0]), [0.1], [0.0])
    result = crown_at_the_point(norm, torch.float64)
    assert not result.certified.any()
    assert result.margins.double().item() <= -0.004 + 1e-9
