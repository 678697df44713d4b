"""The orderings the literature proves, row by row on small ReLU nets: CROWN <= alpha-CROWN;
CROWN, Fast-Lin, DeepPoly, WK, CROWN-IBP <= LP-Full <= K-ReLU; Op-Norm <= FastLip <= RecurJac;
SDPVerify <= LMIVerify (more constraints); DeepZ <= RefineZono (by construction: it keeps
DeepZ's bound where higher); every incomplete bound <= the exact MILP optimum. Fast-Lin <=
CROWN is no theorem (both are feasible points of LP-Full's dual, neither dominates): it
fails on a sample here, as the docs say."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.graph import build_graph
from aisafety.verification.milp import encode, minimise_row
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier

INCOMPLETE = ["ibp", "crown-ibp", "fast-lin", "crown", "deeppoly", "wk", "deepz", "refinezono",
              "alpha-crown", "lp-full", "op-norm", "fastlip", "recurjac", "k-relu", "sdpverify",
              "lmiverify"]  # fmt: skip
PROVED = [("crown", "alpha-crown"), ("ibp", "crown"), ("ibp", "crown-ibp"), ("crown", "lp-full"),
          ("fast-lin", "lp-full"), ("deeppoly", "lp-full"), ("crown-ibp", "lp-full"),
          ("wk", "lp-full"), ("op-norm", "fastlip"), ("deepz", "refinezono"),
          ("fastlip", "recurjac"), ("lp-full", "k-relu"),
          ("sdpverify", "lmiverify")]  # fmt: skip
SLACK = 1e-4  # LP-Full's optima are moved outwards by up to 1e-5 (1 + |v|)


def steep_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 12),
                        nn.ReLU(), nn.Linear(12, 3))  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)
    return net.eval()


@pytest.fixture(scope="module", params=[(2, 0.05), (2, 0.1), (7, 0.1)], ids=str)
def case(request):
    seed, eps = request.param
    net = steep_net(seed)
    graph = build_graph(net, (1, 4, 4), "steep")
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        prop = robustness_property(x, net(x).argmax(1), eps, 3)
    found = {}
    for name in INCOMPLETE:
        with torch.no_grad():
            found[name] = make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]
    return graph, prop, found


@pytest.mark.parametrize("looser, tighter", PROVED)
def test_a_proved_ordering_holds_on_every_row(case, looser, tighter):
    _, _, found = case
    gap = found[looser] - found[tighter]
    assert (gap <= SLACK * (1 + found[tighter].abs())).all(), gap.max()


def test_every_incomplete_bound_is_below_the_exact_milp_optimum(case):
    graph, prop, found = case
    boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    for s in range(len(prop)):
        enc = encode(graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes])
        for k, row in enumerate(prop.spec[s].numpy()):
            exact, value, _ = minimise_row(enc, row, 0.0, 30.0)
            assert exact == pytest.approx(value, abs=1e-6)
            for name, bound in found.items():
                assert bound[s, k] <= exact + 1e-6, (name, s, k)


def test_fast_lin_is_not_always_below_crown():
    """Not a theorem, and not true here: one row where Fast-Lin's parallel lower line
    beats CROWN's adaptive one (the SoK tables show both directions)."""
    net = steep_net(2)
    graph = build_graph(net, (1, 4, 4), "steep")
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        prop = robustness_property(x, net(x).argmax(1), 0.1, 3)
        fast_lin, crown = (
            make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]
            for name in ("fast-lin", "crown")
        )
    assert (fast_lin > crown + 1e-6).any() and (crown > fast_lin + 1e-6).any()
