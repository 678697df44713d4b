"""A seeded slice of the VNN-COMP route's fuzzing (testkit/vnncomp_fuzz.py; the bench
bench/vnncomp_fuzz.py runs many seeds): ``vnncomp.verify_disjuncts`` on random small
networks and disjunctions of conjunctions keeps the invariants of a sound answer
(docs/certification.md, "Fuzzing the VNN-COMP route"), under its time limit and under a
counting clock whose limit expires at points all along the route; and the harness itself
finds a wrong ``unsat``, a margin above a value and a counterexample that does not replay."""

from __future__ import annotations

import pytest
import torch
from vnncomp_fuzz import (
    check,
    has_float32_point,
    random_case,
    reference,
    run_case,
    ticking_clock,
)

from aisafety.plugins import default_registry
from aisafety.verification.vnncomp import InstanceResult

REGISTRY = default_registry()
# chosen to be cheap (about 2 s of CPU per verifier) and to cover the answers: seed 2,
# targeted (one disjunct of 2 atoms: ``_verify_conjunctions``), unsat; seeds 1, 4 and 9,
# one-atom disjuncts (``_verify_rows``), sat, unsat, sat; MILP references on all four.
# The mixed family and sigmoid/tanh nets are the bench's (docs/certification.md).
SEEDS = (2, 1, 4, 9)
# counting-clock limits: from one reading to past a whole run of seed 2 (3,448 readings)
TICKS = (1, 40, 300, 5000)


@pytest.fixture(scope="module")
def cases():
    return [(case, reference(case)) for case in map(random_case, SEEDS)]


@pytest.mark.parametrize("name", ["alpha-crown", "complete"])
def test_the_route_keeps_the_invariants_on_random_cases(name, cases):
    """``complete`` on all four, ``alpha-crown`` (bounds only) on the three cheap ones."""
    statuses = set()
    for case, ref in cases if name == "complete" else cases[1:]:
        result = run_case(REGISTRY, name, case, timeout=3.0)
        statuses.add(result.status)
        found = check(case, ref, result, name)
        assert not found, "\n".join(map(str, found))
    assert {"sat", "unsat"} <= statuses  # both kinds of answer were checked


def test_answers_stay_sound_wherever_the_deadline_expires(cases):
    """``bab`` under a counting clock: limits from one reading to a whole run; every
    answer, timeouts included, keeps the invariants."""
    statuses = set()
    for case, ref in cases[:2]:
        for limit in TICKS:
            with ticking_clock():
                result = run_case(REGISTRY, "bab", case, timeout=limit)
            statuses.add(result.status)
            found = check(case, ref, result, f"bab@{limit}")
            assert not found, "\n".join(map(str, found))
    assert statuses == {"timeout", "unsat", "sat"}


def test_the_harness_finds_wrong_answers(cases):
    violated = next((c, r) for c, r in cases if r.lowest < 0)
    safe = next((c, r) for c, r in cases if r.lowest > 0)
    case, ref = violated
    wrong = InstanceResult("unsat", 0.0, 0.5)
    kinds = {f.kind for f in check(case, ref, wrong, "wrong")}
    assert "unsat where a point violates" in kinds and "margin above a value" in kinds
    case, ref = safe
    centre = ((case.lower + case.upper) / 2).flatten().tolist()
    text = "(" + " ".join(f"(X_{i} {v!r})" for i, v in enumerate(centre)) + ")"
    kinds = {f.kind for f in check(case, ref, InstanceResult("sat", 0.0, -1.0, text), "wrong")}
    assert "counterexample does not replay" in kinds
    outside = torch.tensor(centre) + 10.0
    text = "(" + " ".join(f"(X_{i} {v!r})" for i, v in enumerate(outside.tolist())) + ")"
    kinds = {f.kind for f in check(case, ref, InstanceResult("sat", 0.0, -1.0, text), "wrong")}
    assert kinds == {"counterexample outside the box"}


def test_a_box_without_a_float32_point_is_flagged_in_the_reference(cases):
    """lower = upper at a float64 value float32 cannot represent leaves nothing to replay,
    so such a case is never ``sat`` however violated: the reference says so (the bench
    counts these apart from misses), and a ``sat`` there is a finding."""
    one = torch.tensor([[0.1]], dtype=torch.float64)  # 0.1 is no float32
    assert not has_float32_point(one, one)
    assert has_float32_point(one.float().double(), one.float().double())
    assert has_float32_point(one, one + 1e-8)  # a float32 lies inside
    assert all(ref.float32_point for _, ref in cases)
    case = random_case(7)  # a degenerate input at a float64 centre
    assert not has_float32_point(case.lower, case.upper)
    ref = reference(case, random_points=4, pgd_steps=2)
    assert not ref.float32_point
    text = "(" + " ".join(f"(X_{i} {v!r})" for i, v in enumerate(case.lower.flatten().tolist()))
    kinds = {f.kind for f in check(case, ref, InstanceResult("sat", 0.0, -1.0, text + ")"), "w")}
    assert "sat without a float32 point in the box" in kinds
