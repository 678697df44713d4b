"""``vnncomp._verify_conjunctions`` on a linear net of two inputs (y = x, the box [-1, 1]^2):
the margin where the search stops (#33, "an answer at any time") and a one-atom disjunct
falsified by the complete verifier.

The atoms' rows are chosen so that each value is known by hand: for the disjunct
A = {x0 + 0.1 <= 0, -x0 + 0.1 <= 0} no point satisfies both (min_x max = 0.1) but each atom
alone holds at x0 = -1 or 1 (bound -0.9), so no atom refutes A; B = {x1 - 1.9 <= 0,
-x1 - 1.9 <= 0} holds at x1 = 0 (max -1.9 there, bounds -2.9)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from aisafety.plugins import default_registry
from aisafety.verification import vnncomp
from aisafety.verification.graph import BoundGraph, build_graph

E0, E1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
A = [(E0, 0.1), (-E0, 0.1)]
B = [(E1, -1.9), (-E1, -1.9)]
LOWER, UPPER = (
    -torch.ones(1, 1, 1, 2, dtype=torch.float64),
    torch.ones(1, 1, 1, 2, dtype=torch.float64),
)


@dataclass
class Identity:
    """Stands for ``vnncomp.Network``: the bound graph and the replay of y = x."""

    graph: BoundGraph

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), 2).float()


def identity() -> Identity:
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))
        layer.bias.zero_()
    net = torch.nn.Sequential(torch.nn.Flatten(), layer).eval()
    return Identity(build_graph(net, (1, 1, 2), "identity"))


def conjunctions(disjuncts, verifier: str) -> vnncomp.InstanceResult:
    settings = {"timeout": 20.0, "clock": "cpu"}
    return vnncomp._verify_conjunctions(
        default_registry(), identity(), LOWER, UPPER, disjuncts, verifier, settings
    )


def sampled_margin(disjuncts, n: int = 2001) -> float:
    """min over a grid of the box of min over disjuncts of max over atoms of the row."""
    t = torch.linspace(-1, 1, n, dtype=torch.float64)
    x = torch.cartesian_prod(t, torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))
    x = torch.cat([x, torch.cartesian_prod(torch.tensor([-1.0, 0.0, 1.0]).double(), t)])
    per = [torch.stack([x @ c.double() + d for c, d in rows]).amax(0) for rows in disjuncts]
    return float(torch.stack(per).amin())


def test_a_disjunct_left_unrefuted_gives_the_bound_proved_for_every_disjunct(monkeypatch):
    """Before: ``crown`` answered -0.9 (A's bound alone) although B reaches -1.9 at x = 0:
    not a bound. (``complete`` answered -inf, then, until the joint search, the same as
    ``crown``; it now refutes A: the next test.) Box-PGD is switched off (as if it missed
    B's points): with it, [A, B] is ``sat`` (``test_every_disjunct_is_attacked_...``)."""
    monkeypatch.setattr(vnncomp, "all_rows_hold", lambda *args, **stages: None)
    verifier = "crown"
    result = conjunctions([A], verifier)
    assert result.status == "unknown" and result.margin == pytest.approx(-0.9, abs=1e-5)
    assert result.margin <= sampled_margin([A])
    result = conjunctions([A, B], verifier)
    assert result.status == "unknown" and result.margin == pytest.approx(-2.9, abs=1e-5)
    assert result.margin <= sampled_margin([A, B]) == pytest.approx(-1.9)


def test_the_joint_search_refutes_a_disjunct_that_no_atom_refutes_alone():
    """A: each atom alone holds at a corner, both together nowhere (min_x max = 0.1 at
    x0 = 0). The joint search splits the input x0 (two inputs: input splitting) and prunes
    each half by the atom > 0 on it: ``unsat``, its margin a bound of 0.1 from below.
    Before: ``unknown``, margin -0.9."""
    result = conjunctions([A], "complete")
    assert result.status == "unsat"
    assert 0 < result.margin <= sampled_margin([A]) == pytest.approx(0.1)
    assert result.margin == pytest.approx(0.1, abs=1e-6)
    result = conjunctions([A, B], "complete")  # B holds at x1 = 0
    assert result.status == "sat" and result.margin == pytest.approx(-1.9)


def deadline_passes_after_the_search(monkeypatch) -> None:
    """The deadline passes as the search of the first unrefuted disjunct ends. The joint
    search's probe gets no time (it would refute A before the atom route; session 17), so
    the atom route is that search, as the test was written."""
    monkeypatch.setattr(vnncomp, "PROBE_SHARE", 0.0)
    real = vnncomp._refuted_by_one_atom

    def search_then_out_of_time(registry, net, prop, bounds, verifier, settings, deadline,
                                rival=None):  # fmt: skip
        found = real(registry, net, prop, bounds, verifier, settings, deadline, rival)
        monkeypatch.setattr(type(deadline), "passed", lambda self: True)
        return found

    monkeypatch.setattr(vnncomp, "_refuted_by_one_atom", search_then_out_of_time)


def test_no_time_left_for_the_rest_leaves_the_margin_unbounded(monkeypatch):
    """The disjuncts after the one the search stopped at get their first pass only before
    the deadline: none left, the margin says nothing (-inf); stopped at the last disjunct,
    every disjunct has its bound. Before: -inf in both cases. Box-PGD is switched off:
    it would find B's points before any search."""
    deadline_passes_after_the_search(monkeypatch)
    monkeypatch.setattr(vnncomp, "all_rows_hold", lambda *args, **stages: None)
    result = conjunctions([A, B], "complete")
    assert result.status == "timeout" and result.margin == -math.inf
    monkeypatch.undo()
    deadline_passes_after_the_search(monkeypatch)
    monkeypatch.setattr(vnncomp, "all_rows_hold", lambda *args, **stages: None)
    result = conjunctions([A], "complete")
    assert result.status == "timeout" and result.margin == pytest.approx(-0.9, abs=1e-5)


def test_a_one_atom_disjunct_falsified_by_the_complete_verifier_is_sat(monkeypatch):
    """Box-PGD on the disjunct's rows is switched off (as if it missed the point): the
    complete verifier's counterexample for the only atom satisfies the disjunct. Before:
    ``unknown`` (a disjunct was not refuted)."""
    monkeypatch.setattr(vnncomp, "all_rows_hold", lambda *args, **stages: None)
    refuted = [(E1, 2.0), (-E1, 0.1)]  # x1 + 2 >= 1 on the box
    result = conjunctions([[(E0, -0.5)], refuted], "complete")
    assert result.status == "sat"
    x = [float(line.split()[1].rstrip(")")) for line in result.counterexample.splitlines()]
    assert -1 <= x[0] <= 0.5 and -1 <= x[1] <= 1  # X_0, X_1: the atom x0 - 0.5 <= 0 holds
    # the objective min_d max_k row at the point (was -inf): the first disjunct's x0 - 0.5
    assert result.margin == pytest.approx(min(x[0] - 0.5, max(x[1] + 2, -x[1] + 0.1)))


def test_a_disjunct_found_by_box_pgd_is_sat_with_its_points_value():
    """B holds at x1 = 0; the margin is the objective at the replayed point (<= 0), as a
    falsified sample's margin is its point's value. Before: -inf."""
    result = conjunctions([B, A], "crown")
    assert result.status == "sat"
    x = [float(line.split()[1].rstrip(")")) for line in result.counterexample.splitlines()]
    at_a, at_b = max(x[0] + 0.1, -x[0] + 0.1), max(x[1] - 1.9, -x[1] - 1.9)
    assert result.margin == pytest.approx(min(at_a, at_b)) and result.margin <= 0


@pytest.mark.parametrize("verifier", ["crown", "complete"])
def test_every_disjunct_is_attacked_before_any_bound_work(verifier, monkeypatch):
    """[A, B]: A is left open by ``crown`` (no atom refutes it) and, here, by ``complete``
    (the deadline passes as its search ends), B holds at x1 = 0. Before, box-PGD ran on a
    disjunct only once the ones before it were refuted: ``unknown`` and ``timeout`` where B
    is violated at the box's centre. Now every disjunct is attacked before any bound: ``sat``,
    the counterexample replayed (B holds there) and no bound computed."""
    deadline_passes_after_the_search(monkeypatch)
    passes = []
    real = vnncomp._first_pass
    monkeypatch.setattr(vnncomp, "_first_pass", lambda *a: passes.append(1) or real(*a))
    result = conjunctions([A, B], verifier)
    assert result.status == "sat" and not passes
    x = [float(line.split()[1].rstrip(")")) for line in result.counterexample.splitlines()]
    y = identity().run(torch.tensor(x[:2]).reshape(1, 1, 1, 2))[0].double()
    assert max(y[1] - 1.9, -y[1] - 1.9) <= 0 and all(-1 <= v <= 1 for v in x[:2])
    assert result.margin == pytest.approx(vnncomp.value_at(identity(), LOWER, UPPER, [A, B],
                                                           torch.tensor([x[:2]])))  # fmt: skip
