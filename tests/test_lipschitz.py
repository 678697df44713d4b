"""Op-Norm and FastLip against the exact largest gradient norm over the box (every
activation pattern the box reaches, each checked by an LP) and against sampled gradients;
exact on a linear layer; FastLip never looser than Op-Norm."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.lipschitz import jacobian_bound
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def tiny_net() -> nn.Sequential:
    torch.manual_seed(5)  # active ReLUs in the boxes below: the gradient is not 0
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(),
                         nn.Linear(4, 2)).eval()  # fmt: skip


def weights(net: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy())
            for m in net if isinstance(m, nn.Linear)]  # fmt: skip


def exact_largest_gradient(net, lower, upper, c) -> float:
    """max ||grad (c . f)||_1 over the box: over every pair of activation patterns (d1, d2)
    some point of the box has (z >= 0 where d = 1, z <= 0 where d = 0: an LP), the
    gradient W1^T D1 W2^T D2 W3^T c of that linear piece."""
    (w1, b1), (w2, b2), (w3, _) = weights(net)
    best = 0.0
    for d1 in itertools.product([0.0, 1.0], repeat=4):
        for d2 in itertools.product([0.0, 1.0], repeat=4):
            a1 = np.diag(d1) @ w1  # a1 = D1 (W1 x + b1)
            z2_w, z2_b = w2 @ a1, w2 @ (np.array(d1) * b1) + b2
            sign1, sign2 = 1 - 2 * np.array(d1), 1 - 2 * np.array(d2)  # -1 where d = 1
            a_ub = np.vstack([sign1[:, None] * w1, sign2[:, None] * z2_w])
            b_ub = np.concatenate([-sign1 * b1, -sign2 * z2_b])
            res = linprog(np.zeros(3), A_ub=a_ub, b_ub=b_ub,
                          bounds=list(zip(lower, upper, strict=True)), method="highs")  # fmt: skip
            if res.status == 0:
                grad = w1.T @ np.diag(d1) @ w2.T @ np.diag(d2) @ w3.T @ c
                best = max(best, float(np.abs(grad).sum()))
    return best


def sampled_largest_gradient(net, lower, upper, c, n=20_000) -> float:
    generator = torch.Generator().manual_seed(0)
    x = lower + (upper - lower) * torch.rand(n, 3, generator=generator, dtype=torch.float64)
    x = x.float().requires_grad_(True)
    (net(x) @ c.float()).sum().backward()
    return float(x.grad.abs().sum(1).max())


@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_lipschitz_constants_are_above_the_exact_and_sampled_largest_gradient(eps):
    net = tiny_net()
    graph = build_graph(net, (3,), "tiny")
    x = torch.tensor([[0.4, 0.5, 0.6], [0.5, 0.3, 0.5]])
    prop = robustness_property(x, net(x).argmax(1), eps, 2)  # no clipping: a uniform radius
    fastlip = jacobian_bound(graph, prop).flatten(2).sum(2)  # ||G||_1 per row
    value_bound = make_verifier(default_registry(), "op-norm").lower_bounds(graph, prop)[0]
    centre_rows = prop.rows(graph.forward(x.double()))
    op_norm = (centre_rows - value_bound) / eps
    for s in range(len(x)):
        lower, upper = prop.lower[s].numpy(), prop.upper[s].numpy()
        for k, c in enumerate(prop.spec[s].numpy()):
            exact = exact_largest_gradient(net, lower, upper, c)
            sampled = sampled_largest_gradient(
                net, prop.lower[s], prop.upper[s], torch.from_numpy(c)
            )
            assert 0 < sampled <= exact + 1e-5, (s, k)
            assert exact <= fastlip[s, k] + 1e-9 <= op_norm[s, k] + 2e-9, (s, k)


def test_on_a_linear_layer_both_bounds_are_the_exact_minimum():
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 3))
    graph = build_graph(net, (1, 2, 3), "linear")
    x = torch.rand(4, 1, 2, 3, generator=torch.Generator().manual_seed(2))
    prop = robustness_property(x, net(x).argmax(1), 0.1, 3)
    w = net[1].weight.detach().double()
    rows = prop.spec @ w  # (B, K, 6): the row's gradient
    corner = torch.where(
        rows > 0, prop.lower.flatten(1).unsqueeze(1), prop.upper.flatten(1).unsqueeze(1)
    )
    exact = (rows * corner).sum(2) + prop.spec @ net[1].bias.detach().double()
    fastlip = make_verifier(default_registry(), "fastlip").lower_bounds(graph, prop)[0]
    assert fastlip == pytest.approx(exact, abs=1e-12)
    # Op-Norm's is exact where the box is not clipped (a uniform radius)
    inside = ((x > 0.1) & (x < 0.9)).flatten(1).all(1)
    op_norm = make_verifier(default_registry(), "op-norm").lower_bounds(graph, prop)[0]
    assert op_norm[inside] == pytest.approx(exact[inside], abs=1e-12)
    assert (op_norm <= exact + 1e-12).all()


def test_lipschitz_verifiers_name_a_network_they_cannot_bound():
    smooth = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    with pytest.raises(VerificationError, match="'fastlip' needs a sequential ReLU.*'tanh'"):
        make_verifier(default_registry(), "fastlip").check(build_graph(smooth, (4,), "tanh"))
    make_verifier(default_registry(), "op-norm").check(build_graph(smooth, (4,), "tanh"))
