"""A seeded slice of the attack fuzzing (testkit/attack_fuzz.py; the bench
bench/attack_fuzz.py runs many seeds): every registered attack's returned points stay in
their budget and [0, 1], replay as reported, never undo a clean mistake, and no certified
sample is broken (docs/attacks.md, "Fuzzing the attacks"); and the harness itself finds a
point over budget and a success that does not replay."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attack_fuzz import ROUNDING, check_result, fuzz_case, random_case

from aisafety.attack.base import Attack
from aisafety.plugins import default_registry

REGISTRY = default_registry()
# chosen to cover, cheaply (about 1-2 CPU s each): seed 15, a conv net with max pooling,
# certified samples and a clean mistake that PGD-l2/l1 returned classified correctly before
# attack/base.py's keep_clean_mistakes; 17, a residual block, certified samples; 13,
# sigmoid/tanh, two clean mistakes, CROWN-certified samples IBP does not certify; 7, a dense
# net behind bit-depth reduction with BPDA (``test_the_slice_exercises_both_sides`` holds
# that the slice breaks, certifies and attacks a defense)
SEEDS = (15, 17, 13, 7)
VERIFIERS = ("ibp", "crown", "alpha-crown", "deepz", "complete")


@pytest.fixture(scope="module")
def outcomes():
    attacks = REGISTRY.names("attack")
    return [fuzz_case(REGISTRY, seed, attacks, list(VERIFIERS)) for seed in SEEDS]


def test_every_attack_keeps_the_invariants_on_random_cases(outcomes):
    broken = [f for _, found, _ in outcomes for f in found if f.kind not in ROUNDING]
    assert not broken, "\n".join(map(str, broken))


def test_the_slice_exercises_both_sides(outcomes):
    """The slice is not vacuous: attacks ran and broke samples, clean mistakes were among
    them, verifiers certified samples that attacks then tried, and a defense was attacked."""
    ran = [r for _, _, r in outcomes]
    assert sum(r["attacks"] for r in ran) >= len(SEEDS) * len(REGISTRY.names("attack"))
    assert sum(r["broken"] for r in ran) > 0 and sum(r["pairs"] for r in ran) > 0
    cases = [case for case, _, _ in outcomes]
    assert any(c.defended for c in cases) and any(not c.defended for c in cases)
    with torch.no_grad():
        mistakes = sum(int((c.predictor.logits(c.x).argmax(1) != c.y).sum()) for c in cases)
    assert mistakes > 0


def test_the_harness_finds_a_point_over_budget_and_a_false_success():
    case = random_case(SEEDS[0], REGISTRY, defended=0.0)
    attack: Attack = REGISTRY.create("attack", "fgsm")
    result = attack(case.predictor, case.x, case.y, 0.1)
    kinds: list[str] = []
    moved = dataclasses.replace(result, x_adv=(result.x_adv + 0.2).clamp(0, 1))
    check_result(case, moved, lambda kind, detail: kinds.append(kind))
    assert "over budget" in kinds
    kinds.clear()
    flipped = dataclasses.replace(result, success=~result.success)
    check_result(case, flipped, lambda kind, detail: kinds.append(kind))
    assert "success miscounted" in kinds and "replay disagrees" in kinds
