"""``safe_dual.lower_bound`` against exact ``Fraction`` LP optima (every vertex of small LPs
enumerated and checked exactly), on random, degenerate and ill-conditioned LPs, with
HiGHS's duals, perturbed and wrong-signed duals, and against sampled feasible points."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import highspy
import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix

from aisafety.verification.refine import SAFETY
from aisafety.verification.safe_dual import lower_bound


def _solve_exact(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """Gauss-Jordan in exact arithmetic; None for a singular system."""
    n = len(rows)
    a = [list(r) + [v] for r, v in zip(rows, rhs, strict=True)]
    for c in range(n):
        p = next((r for r in range(c, n) if a[r][c] != 0), None)
        if p is None:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def exact_minimum(A, rl, ru, lo, hi, c) -> Fraction | None:
    """The exact optimum of a bounded LP: the least objective over its feasible vertices
    (every choice of n active constraints); None where infeasible."""
    n = len(c)
    q = [[Fraction(float(v)) for v in row] for row in A]
    planes = [(row, Fraction(float(s))) for i, row in enumerate(q)
              for s in (rl[i], ru[i]) if np.isfinite(s)]  # fmt: skip
    for j in range(n):
        unit = [Fraction(int(k == j)) for k in range(n)]
        planes += [(unit, Fraction(float(lo[j]))), (unit, Fraction(float(hi[j])))]
    best = None
    for combo in combinations(planes, n):
        x = _solve_exact([p[0] for p in combo], [p[1] for p in combo])
        if x is not None and _feasible(q, rl, ru, lo, hi, x):
            value = sum(Fraction(float(cj)) * xj for cj, xj in zip(c, x, strict=True))
            best = value if best is None else min(best, value)
    return best


def _feasible(q, rl, ru, lo, hi, x) -> bool:
    if any(not Fraction(float(lo[j])) <= x[j] <= Fraction(float(hi[j])) for j in range(len(x))):
        return False
    for i, row in enumerate(q):
        v = sum(a * b for a, b in zip(row, x, strict=True))
        if (np.isfinite(rl[i]) and v < Fraction(float(rl[i]))) or (
            np.isfinite(ru[i]) and v > Fraction(float(ru[i]))
        ):
            return False
    return True


def highs(A, rl, ru, lo, hi, c, **options) -> tuple[bool, float, np.ndarray]:
    """(optimal, reported objective, row duals) from HiGHS."""
    m = csr_matrix(np.asarray(A, dtype=np.float64))
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    for key, value in options.items():
        solver.setOptionValue(key, value)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(c), m.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = np.asarray(lo, float), np.asarray(hi, float)
    lp.row_lower_, lp.row_upper_ = np.asarray(rl, float), np.asarray(ru, float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(c), m.shape[0]
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = m.indptr, m.indices, m.data
    solver.passModel(lp)
    solver.run()
    optimal = solver.getModelStatus() == highspy.HighsModelStatus.kOptimal
    objective = solver.getInfo().objective_function_value
    return optimal, objective, np.array(solver.getSolution().row_dual)


def random_lp(seed: int, n: int = 3, m: int = 3, parallel: float | None = None):
    """A feasible LP with rows of scales 1e-3..1e3 (or two nearly parallel rows of scales
    up to 1e6 with ``parallel``), one-sided, ranged and equality rows."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(m, n))
    if parallel is None:
        A *= 10 ** rng.uniform(-3, 3, size=(m, 1))
        lo, hi = -rng.uniform(0.1, 5, n), rng.uniform(0.1, 5, n)
    else:
        A[1] = A[0] * (1 + rng.normal() * parallel)
        A *= 10 ** rng.uniform(-4, 6, size=(m, 1))
        lo, hi = -rng.uniform(0.1, 5, n) * 1e3, rng.uniform(0.1, 5, n) * 1e3
    v = A @ rng.uniform(lo, hi)
    if parallel is not None:
        rl, ru = v - rng.uniform(0, 1e-3, m) * abs(v), v + rng.uniform(0, 1e-3, m) * abs(v)
        return A, rl, ru, lo, hi, rng.normal(size=n)
    rl, ru = v - rng.uniform(0, 1, m), v + rng.uniform(0, 1, m)
    rl[0], ru[1] = -np.inf, np.inf
    if m > 2:
        rl[2] = ru[2] = float(A[2] @ rng.uniform(lo, hi))  # an equality row
    return A, rl, ru, lo, hi, rng.normal(size=n)


def bound(A, rl, ru, lo, hi, c, y) -> float:
    return lower_bound(csr_matrix(np.asarray(A, float)), rl, ru, lo, hi, c, y)


@pytest.mark.parametrize("seeds", [range(0, 40), range(40, 80)])
def test_the_bound_is_below_the_exact_optimum_and_close_to_it(seeds):
    checked = 0
    for seed in seeds:
        lp = random_lp(seed)
        exact = exact_minimum(*lp)
        optimal, _, y = highs(*lp)
        if exact is None or not optimal:
            continue
        value = bound(*lp, y)
        assert Fraction(value) <= exact, seed
        assert float(exact) - value <= 1e-9 * (1 + abs(float(exact))), seed  # tight
        checked += 1
    assert checked >= 20


def test_any_multipliers_give_a_bound_perturbed_or_wrong_signed():
    """The bound holds for any y: HiGHS's duals perturbed (relative 1e-6 and 1e-2), with
    flipped signs, and random; only its tightness changes."""
    rng = np.random.default_rng(7)
    for seed in range(20):
        lp = random_lp(seed)
        exact = exact_minimum(*lp)
        optimal, _, y = highs(*lp)
        if exact is None or not optimal:
            continue
        scale = np.abs(y).max() + 1
        noise = rng.normal(size=y.shape)
        for y2 in (y * (1 + 1e-6 * noise), y + 1e-2 * scale * noise, -y, noise * scale,
                   np.full_like(y, np.nan)):  # fmt: skip
            assert Fraction(bound(*lp, y2)) <= exact or bound(*lp, y2) == -np.inf


def test_an_infeasible_dual_that_overstates_the_optimum_is_corrected():
    """A dual with a reduced cost of the wrong sign: its dual objective (b.y alone, the
    value a solver reports) is above the exact optimum; the safe bound is not."""
    # min x1 + x2 s.t. x1 + x2 >= 1, 0 <= x <= 2: optimum 1 at y = 1
    A, rl, ru, lo, hi, c = [[1.0, 1.0]], [1.0], [np.inf], [0.0, 0.0], [2.0, 2.0], [1.0, 1.0]
    y = np.array([1.0 + 1e-6])  # r = -1e-6 each: slightly infeasible
    assert float(np.dot(rl, y)) > 1.0  # what ignoring the reduced costs would claim
    value = bound(A, rl, ru, lo, hi, c, y)
    assert value <= 1.0
    assert value >= 1.0 - 5e-6


def test_degenerate_and_ill_conditioned_lps():
    cases = [
        # degenerate: four rows and both bounds active at the optimum (0.5, 0.5)
        ([[1.0, 1.0], [1.0, 2.0], [2.0, 1.0], [1.0, -1.0]], [1.0, 1.5, 1.5, 0.0],
         [np.inf, np.inf, np.inf, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]),
        # nearly parallel rows (1 and 1 + 2^-40) at scale 1e8 and a tiny cost
        ([[1e8, 1e8], [1e8, 1e8 * (1 + 2.0**-40)]], [1e8, 1e8], [np.inf, np.inf],
         [-3.0, -3.0], [3.0, 3.0], [1.0, 1.0 + 2.0**-30]),
        # an equality row with coefficients 1e-7 and 1e7
        ([[1e-7, 1e7], [1.0, 1.0]], [1.0, -1.0], [1.0, 1.0], [-5.0, -5.0], [5.0, 5.0],
         [3.0, -1.0]),
    ]  # fmt: skip
    for lp in cases:
        exact = exact_minimum(*lp)
        optimal, _, y = highs(*lp)
        assert exact is not None and optimal
        value = bound(*lp, y)
        assert Fraction(value) <= exact
        assert float(exact) - value <= 1e-6 * (1 + abs(float(exact)))


def test_a_loose_solver_breaks_the_tolerance_not_the_bound():
    """HiGHS at feasibility tolerances 1e-5: on two of 400 LPs with nearly parallel rows its
    optimum, even moved down by ``refine.SAFETY``, is above the exact one (what an LP
    bound was before); the safe bound from its duals is below on every LP."""
    loose = dict(primal_feasibility_tolerance=1e-5, dual_feasibility_tolerance=1e-5)
    tolerance_broken, checked = 0, 0
    for seed in (165, 170, *range(20)):
        lp = random_lp(seed, n=2, m=3, parallel=1e-9)
        exact = exact_minimum(*lp)
        optimal, objective, y = highs(*lp, **loose)
        if exact is None or not optimal:
            continue
        checked += 1
        tolerance_broken += Fraction(objective - SAFETY * (1 + abs(objective))) > exact
        assert Fraction(bound(*lp, y)) <= exact, seed
    assert tolerance_broken >= 1 and checked >= 10


def test_the_bound_is_below_every_sampled_feasible_point():
    rng = np.random.default_rng(3)
    for seed in range(10):
        A, rl, ru, lo, hi, c = random_lp(seed, n=4, m=2)  # no equality row: points to sample
        optimal, _, y = highs(A, rl, ru, lo, hi, c)
        if not optimal:
            continue
        value = Fraction(bound(A, rl, ru, lo, hi, c, y))
        q = [[Fraction(float(v)) for v in row] for row in A]
        points = rng.uniform(lo, hi, size=(4000, 4))
        for x in points[np.all((rl[:, None] <= A @ points.T) & (ru[:, None] >= A @ points.T), 0)]:
            xq = [Fraction(float(v)) for v in x]
            if _feasible(q, rl, ru, lo, hi, xq):
                assert value <= sum(Fraction(float(cj)) * xj for cj, xj in zip(c, xq, strict=True))


def test_unbounded_columns_need_a_provably_signed_reduced_cost():
    # min x s.t. x >= 1, x in [0, inf): y = 1 gives r = 0 within its error: -inf, not 1
    args = ([[1.0]], [1.0], [np.inf], [0.0], [np.inf], [1.0])
    assert bound(*args, np.array([1.0])) == -np.inf
    assert bound(*args, np.array([0.5])) <= 1.0  # r = 0.5 >= 0 surely: 0.5 + 0.5 * 0
    assert bound(*args, np.array([0.5])) > 0.49


def test_a_milp_certificate_the_safe_lp_cannot_prove_says_so():
    """On the diamond (``test_krelu``) the row's minimum is bias - 2 and the triangle LP's
    bias - 3: at bias 2.5 only HiGHS's MIP answer certifies it, and the note says so; at
    3.5 the safe LP bound proves it (or alpha-CROWN does, before any MILP): no note."""
    from test_krelu import diamond_net

    from aisafety.plugins import default_registry
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    prop = robustness_property(torch.full((1, 2), 0.5), torch.tensor([0]), 0.5, 2)
    verifier = make_verifier(default_registry(), "complete", {"engine": "milp"})
    for bias, unproved in ((2.5, True), (3.5, False)):  # at 3.5 the LP's 0.5 proves it
        result = verifier.verify(build_graph(diamond_net(bias), (2,), "diamond"), prop)
        assert result.verdicts[0].value == "certified"
        assert ("HiGHS's MIP bound" in result.notes[0]) == unproved


def _diamond_onnx(path, bias: float) -> str:
    """``test_krelu``'s diamond net as an ONNX file (two Gemm layers around a ReLU)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from test_krelu import diamond_net

    net = diamond_net(bias)
    inits = [numpy_helper.from_array(t.detach().numpy(), name) for name, t in
             (("W0", net[0].weight), ("b0", net[0].bias), ("W2", net[2].weight),
              ("b2", net[2].bias))]  # fmt: skip
    nodes = [helper.make_node("Gemm", ["x", "W0", "b0"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], transB=1)]  # fmt: skip
    graph = helper.make_graph(
        nodes, "diamond", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def _unit_square_spec(path, *outputs: str) -> str:
    """A VNN-LIB file over the diamond net's inputs in [0, 1]^2, asserting ``outputs``."""
    lines = ["(declare-const X_0 Real)", "(declare-const X_1 Real)", "(declare-const Y_0 Real)",
             "(declare-const Y_1 Real)", "(assert (>= X_0 0.0))", "(assert (<= X_0 1.0))",
             "(assert (>= X_1 0.0))", "(assert (<= X_1 1.0))"]  # fmt: skip
    path.write_text("\n".join(lines + [f"(assert {atom})" for atom in outputs]) + "\n")
    return str(path)


def test_aisafety_verify_prints_the_note_of_a_milp_certificate(tmp_path, capsys):
    """``aisafety verify`` (``complete``, the MILP on this two-ReLU net) prints the note of
    an ``unsat`` that rests on HiGHS's MIP bound as one comment line, and none where the
    safe LP bound proves it (the cases of the test above)."""
    from aisafety.cli import main

    spec = _unit_square_spec(tmp_path / "box.vnnlib", "(>= Y_1 Y_0)")
    for bias, unproved in ((2.5, True), (3.5, False)):
        net = _diamond_onnx(tmp_path / f"diamond{bias}.onnx", bias)
        assert main(["verify", net, str(spec), "--timeout", "30"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "unsat"
        notes = [line for line in lines if line.startswith("# note: ")]
        assert len(notes) == int(unproved)
        assert all("rest on HiGHS's MIP bound" in line for line in notes)


def test_a_conjunction_refuted_by_a_milp_certificate_keeps_its_note(tmp_path, capsys, monkeypatch):
    """A conjunction (two asserted atoms: Y_1 >= Y_0 and Y_0 <= 1000, the second true on the
    whole box) is refuted by the first atom alone, which only HiGHS's MIP answer certifies at
    bias 2.5: the note reaches ``verify_instance``'s result (which the VNN-COMP bench rows
    store) and ``aisafety verify``'s ``# note:`` line, naming the disjunct and the atom.
    Before: the conjunction path dropped it (``unsat`` with no note).

    Session 17: by default the joint search's probe runs first and refutes this
    conjunction itself (input splits on the two inputs, bab's rounding-safe bounds: no MIP
    answer, so no note); the atom route is reached here with the probe given no time."""
    from aisafety.cli import main
    from aisafety.plugins import default_registry
    from aisafety.verification import vnncomp
    from aisafety.verification.vnncomp import verify_instance

    spec = _unit_square_spec(tmp_path / "conjunction.vnnlib", "(>= Y_1 Y_0)", "(<= Y_0 1000.0)")
    probed = verify_instance(default_registry(), _diamond_onnx(tmp_path / "probed.onnx", 2.5),
                             spec, "complete", 30.0)  # fmt: skip
    assert probed.status == "unsat" and probed.note == ""
    monkeypatch.setattr(vnncomp, "PROBE_SHARE", 0.0)
    for bias, unproved in ((2.5, True), (3.5, False)):
        net = _diamond_onnx(tmp_path / f"diamond{bias}.onnx", bias)
        result = verify_instance(default_registry(), net, spec, "complete", 30.0)
        assert result.status == "unsat"
        expected = "the atoms refuting disjunct 0 (atom 0) rest on HiGHS's MIP bound"
        assert result.note.startswith(expected) if unproved else result.note == ""
        assert main(["verify", net, str(spec), "--timeout", "30"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "unsat"
        notes = [line for line in lines if line.startswith("# note: ")]
        assert notes == ([f"# note: {result.note}"] if unproved else [])
