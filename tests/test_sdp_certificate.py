"""The SDP verifiers' certificate is a proof: the smallest eigenvalue is bounded by a shifted
Cholesky test (``psd_bound.py``), the certificate matrix's and the constraint matrices'
float64 errors are charged (``quadratic.certified_bound``, ``sdp_rounding.py``). References:
exact rational LDL^T, a constraint set with a known minimum, closed-form SDP optima and
exact rational products."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import lmi, sdp
from aisafety.verification.dense import affine_segments
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.psd_bound import gershgorin_below, smallest_eigenvalue_below
from aisafety.verification.quadratic import Qcqp, _sym, certified_bound
from aisafety.verification.registry import make_verifier
from aisafety.verification.sdp_rounding import affine_error, segment_errors

sys.path.insert(0, str(Path(__file__).parent))
from test_sdp import one_unit  # noqa: E402

pytest.importorskip("cvxpy")


def positive_definite(a: np.ndarray, shift: float) -> bool:
    """Whether ``a - shift I`` is positive definite, exactly: LDL^T in rationals without
    pivoting (every pivot > 0 iff positive definite)."""
    n = a.shape[0]
    m = [[Fraction(float(a[i, j])) - (Fraction(shift) if i == j else 0) for j in range(n)]
         for i in range(n)]  # fmt: skip
    for k in range(n):
        if m[k][k] <= 0:
            return False
        for i in range(k + 1, n):
            ratio = m[i][k] / m[k][k]
            for j in range(k + 1, n):
                m[i][j] -= ratio * m[k][j]
    return True


def spread_matrix(rng: np.random.Generator, n: int) -> np.ndarray:
    """A symmetric matrix with eigenvalues from 1e-9 to 1e8 (some negative), rotated."""
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    values = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-9, 8, n)
    a = (q * values) @ q.T
    return (a + a.T) / 2


def test_the_smallest_eigenvalue_bound_by_hand():
    assert 1 - 1e-12 <= smallest_eigenvalue_below(np.array([[2.0, 1.0], [1.0, 2.0]])) < 1
    assert -1 - 1e-12 <= smallest_eigenvalue_below(np.diag([-1.0, 5.0])) < -1
    assert smallest_eigenvalue_below(np.array([[np.nan]])) == -np.inf


def test_the_bound_is_below_the_exact_smallest_eigenvalue_where_eigvalsh_is_not():
    """Exact LDL^T of ``A - b I``: positive definite means b < lambda_min(A) exactly."""
    rng = np.random.default_rng(0)
    estimate_above = 0
    for _ in range(150):
        a = spread_matrix(rng, int(rng.integers(2, 7)))
        bound = smallest_eigenvalue_below(a)
        assert positive_definite(a, bound)
        assert positive_definite(a, gershgorin_below(a))
        estimate = float(np.linalg.eigvalsh(a)[0])
        estimate_above += not positive_definite(a, estimate)
        assert bound >= estimate - 1e-6 * np.abs(a).max()  # and not loose
    assert estimate_above > 10  # eigvalsh alone is at or above the exact value on many


def square_on_a_line() -> Qcqp:
    """v = [1, x, y] with (x - 1)(2 - x) >= 0 and (y - x)^2 = 0 (y = x on [1, 2]); the
    row x + y has the minimum 2, and ||v||^2 <= 9. The constraints are exact in float64."""
    e = np.eye(3)
    box = _sym(e[1] - e[0], 2 * e[0] - e[1]).reshape(1, -1)
    line = _sym(e[2] - e[1], e[2] - e[1]).reshape(1, -1)
    return Qcqp(3, csr_matrix(box), csr_matrix(line), np.array([[0.0, 1.0, 1.0]]), 9.0)


def test_huge_multipliers_never_certify_above_a_known_minimum():
    """Any multipliers give a sound bound; with a huge one on the equality (tight as it
    grows), the certificate matrix's entries are ~1e12 and its rounding and eigvalsh's
    error matter: the earlier check (eigvalsh, fixed 1e-12 and 1e-9 margins) was above the
    minimum 2 on 4,011 of 20,000 such draws, by up to 9.9e-5."""
    qcqp, row = square_on_a_line(), np.array([1.0])
    rng = np.random.default_rng(0)
    for _ in range(3000):
        lam = -(10 ** rng.uniform(4, 15))
        gamma = 2 + 10 ** rng.uniform(-14, -4)
        assert certified_bound(qcqp, row, gamma, [2.0], [lam]) <= 2
    assert certified_bound(qcqp, row, 2.0 - 1e-6, [2.0], [-1e6]) > 2 - 1e-5  # still tight


def exact_minimum(net: nn.Module) -> Fraction:
    """The one unit's row minimum, exactly on its float32 weights: b0 - max(0, c u)."""
    w, b = (Fraction(float(t.detach())) for t in (net[0].weight, net[0].bias))
    c, b0 = (Fraction(float(t.detach())) for t in (net[2].weight[1, 0], net[2].bias[0]))
    return b0 - max(Fraction(0), c * max(b, w + b))


def unit_cases(count: int):
    rng = np.random.default_rng(1)
    while count:
        w, bias, c = rng.uniform(-4, 4), rng.uniform(-2, 2), rng.uniform(-3, 3)
        if min(bias, w + bias) < 0 < max(bias, w + bias):  # unstable on [0, 1]
            count -= 1
            yield one_unit(w, bias, c)


@pytest.mark.parametrize("name", ["sdpverify", "lmiverify"])
def test_random_one_unit_sdps_stay_below_their_closed_form(name):
    """The relaxation is exact for one unstable unit (tests/test_sdp.py): every bound is
    at most the exact minimum and within 1e-6 of it."""
    prop = robustness_property(torch.full((1, 1), 0.5), torch.tensor([0]), 0.5, 2)
    verifier = make_verifier(default_registry(), name)
    for net in unit_cases(8):
        found = Fraction(float(verifier.lower_bounds(build_graph(net, (1,), "one"), prop)[0]))
        closed = exact_minimum(net)
        assert closed - Fraction(1, 10**6) <= found <= closed


@pytest.mark.parametrize("module", [sdp, lmi])
def test_perturbed_multipliers_never_certify_above_the_closed_form(monkeypatch, module):
    """The solver's multipliers, each scaled by 1 + noise and gamma raised above the exact
    minimum: the certificate must pay for it."""
    seen = []
    real = module.certified_bound

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(module, "certified_bound", spy)
    prop = robustness_property(torch.full((1, 1), 0.5), torch.tensor([0]), 0.5, 2)
    verifier = make_verifier(default_registry(), module.SdpVerifier.name
                             if module is sdp else "lmiverify")  # fmt: skip
    rng = np.random.default_rng(2)
    for net in unit_cases(4):
        seen.clear()
        verifier.lower_bounds(build_graph(net, (1,), "one"), prop)
        closed = exact_minimum(net)
        qcqp, row, _, mu, lam = seen[0]
        for _ in range(40):
            noise = 10 ** rng.uniform(-12, -2)
            mu2 = np.asarray(mu) * (1 + noise * rng.normal(size=len(mu)))
            lam2 = np.asarray(lam) * (1 + noise * rng.normal(size=len(lam)))
            gamma = float(closed) + 10 ** rng.uniform(-12, -3)
            assert Fraction(certified_bound(qcqp, row, gamma, mu2, lam2)) <= closed


def normalised_net(seed: int) -> nn.Module:
    """x -> (x - m) / s -> Linear -> ReLU -> Linear -> ReLU -> Linear: a first segment of
    two weighted ops and a middle layer whose stable neurons carry rounded forms."""
    torch.manual_seed(seed)
    return Normalised().double().eval()


class Normalised(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(),
                                    nn.Linear(4, 2))  # fmt: skip

    def forward(self, x):
        return self.layers((x - 0.3) / 0.7)


def exact_map(graph, start_end) -> tuple[list[list[Fraction]], list[Fraction]]:
    """A segment's affine map composed in rationals from each op's own (exact) matrix."""
    start, end = start_end
    matrix, const = None, None
    for op in graph.ops[start + 1 : end + 1]:
        shape = graph.ops[op.inputs[0]].out_shape
        n_in, n_out = int(np.prod(shape)), int(np.prod(op.out_shape))
        eye = torch.eye(n_out, dtype=torch.float64).reshape(1, n_out, *op.out_shape)
        (back,), _ = op.backward(eye, None)
        a = [[Fraction(float(v)) for v in r] for r in back.reshape(n_out, n_in).tolist()]
        c = [Fraction(float(v)) for v in op.forward(torch.zeros(1, *shape, dtype=torch.float64))
             .flatten().tolist()]  # fmt: skip
        if matrix is None:
            matrix, const = a, c
            continue
        matrix = [[sum(a[i][k] * matrix[k][j] for k in range(len(matrix)))
                   for j in range(len(matrix[0]))] for i in range(n_out)]  # fmt: skip
        const = [sum(a[i][k] * const[k] for k in range(len(const))) + c[i] for i in range(n_out)]
    return matrix, const


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_and_form_errors_cover_the_exact_rational_maps(seed):
    graph = build_graph(normalised_net(seed), (3,), "normalised")
    maps, cuts = affine_segments(graph)
    errors = segment_errors(graph)
    ends = [graph.ops[i].inputs[0] for i in cuts] + [len(graph.ops) - 1]
    assert errors[0][0].max() > 0  # two weighted ops: a product bound
    assert errors[1][0].max() == 0  # one Linear: exact
    spans = list(zip([0, *cuts], ends, strict=True))
    for (m, c), (e_m, e_c), span in zip(maps, errors, spans, strict=True):
        exact_m, exact_c = exact_map(graph, span)
        for i, r in enumerate(m.tolist()):
            for j, v in enumerate(r):
                assert abs(Fraction(v) - exact_m[i][j]) <= Fraction(float(e_m[i, j]))
            assert abs(Fraction(float(c[i])) - exact_c[i]) <= Fraction(float(e_c[i]))
    rng = np.random.default_rng(seed)  # forms: random rows with random error bounds
    forms, slack = rng.normal(size=(4, 6)) * 3, np.abs(rng.normal(size=(4, 6))) * 1e-12
    sign = rng.choice([-1, 1], size=forms.shape)  # the exact forms: at the slack's ends
    exact_forms = [[Fraction(float(forms[k, j])) + Fraction(float(slack[k, j])) * int(sign[k, j])
                    for j in range(6)] for k in range(4)]  # fmt: skip
    m, c = rng.normal(size=(5, 4)), rng.normal(size=5)
    z, e_z = affine_error(m, c, forms, slack, np.zeros((5, 4)), np.zeros(5))
    for i in range(5):
        for j in range(6):
            exact = sum(Fraction(float(m[i, k])) * exact_forms[k][j] for k in range(4))
            exact += Fraction(float(c[i])) if j == 0 else 0
            assert abs(Fraction(float(z[i, j])) - exact) <= Fraction(float(e_z[i, j]))


def test_a_normalised_two_layer_net_stays_below_sampled_values():
    net = normalised_net(3)
    graph = build_graph(net, (3,), "normalised")
    x = torch.rand(1, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    prop = robustness_property(x, net(x).argmax(1), 0.3, 2)
    points = prop.lower + (prop.upper - prop.lower) * torch.rand(4000, 3, dtype=torch.float64)
    with torch.no_grad():
        lowest = prop.rows(net(points)).amin(0)
    for name in ("sdpverify", "lmiverify"):
        bound = make_verifier(default_registry(), name).lower_bounds(graph, prop)[0][0]
        assert (bound <= lowest).all()
