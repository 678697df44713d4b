"""The gradient-masking sanity checks: each check on hand-made runs, then the shipped models:
defensive distillation (whose PGD number docs/defenses.md calls gradient masking) is flagged,
the vanilla and PGD-AT models pass."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest
import yaml
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.cli import main
from aisafety.defense.bit_depth import BitDepthReduction
from aisafety.defense.obfuscation import obfuscation_warnings
from aisafety.defense.resize_pad import RandomResizePad
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.report.data import AttackRunRow, MemberRow, MetricRow, RunData, WarningRow
from aisafety.sanity import (
    black_box_not_stronger,
    breaks_at_large_budget,
    gradients_alive,
    monotone_in_budget,
    more_effort_not_weaker,
    noise_weaker_than_attacks,
    sanity_checks,
)

N = 100


def attack(i, name, eps, acc, family="gradient", config=None, norm="linf"):
    label = name + (f"({','.join(f'{k}={v}' for k, v in config.items())})" if config else "")
    return AttackRunRow(i, "m", "d", label, family, norm, eps, config or {}, N, acc, 1.0)


def run_data(runs, metrics=(), outcomes=None):
    return RunData(
        1, "finished", datetime(2026, 1, 1), None, "0", 0, "cpu", {}, None,
        [{"name": "m"}], [], list(metrics), list(runs), outcomes or {},
    )  # fmt: skip


def test_monotone():
    ok = [attack(1, "pgd-linf", 0.1, 0.6), attack(2, "pgd-linf", 0.3, 0.2)]
    assert monotone_in_budget("m", ok).status == "pass"
    bad = [attack(1, "pgd-linf", 0.1, 0.2), attack(2, "pgd-linf", 0.3, 0.5)]
    check = monotone_in_budget("m", bad)
    assert check.status == "warn" and "0.500 at eps 0.3" in check.detail and check.advice
    noise = [attack(1, "pgd-linf", 0.1, 0.6), attack(2, "pgd-linf", 0.3, 0.61)]
    assert monotone_in_budget("m", noise).status == "pass"  # within 2 samples of 100
    assert monotone_in_budget("m", ok[:1]).status == "skip"


def test_breaks_at_large_budget():
    assert breaks_at_large_budget("m", [attack(1, "pgd-linf", 0.5, 0.0)]).status == "pass"
    assert breaks_at_large_budget("m", [attack(1, "pgd-linf", 0.5, 0.3)]).status == "warn"
    assert breaks_at_large_budget("m", [attack(1, "pgd-linf", 0.3, 0.3)]).status == "skip"
    # an l2 budget of 0.5 breaks nothing: not this check's business
    assert breaks_at_large_budget("m", [attack(1, "pgd-l2", 0.5, 0.9, norm="l2")]).status == "skip"


def test_black_box_against_white_box_per_sample():
    label = np.zeros(N, dtype=np.int64)
    white_correct = np.arange(N) < 50
    black_correct = np.arange(N) < 10
    outcomes = {
        i: {"label": label, "clean_pred": label, "adv_pred": np.where(c, 0, 1)}
        for i, c in ((1, white_correct), (2, black_correct))
    }
    runs = [attack(1, "pgd-linf", 0.3, 0.5), attack(2, "square-linf", 0.3, 0.1, "score")]
    check = black_box_not_stronger("m", runs, run_data(runs, outcomes=outcomes))
    assert check.status == "warn" and "breaks 40 sample(s)" in check.detail
    runs[1] = attack(2, "square-linf", 0.3, 0.49, "score")
    assert black_box_not_stronger("m", runs, run_data(runs)).status == "pass"
    noise_only = [runs[0], attack(3, "random-noise", 0.3, 0.1, "decision")]
    assert black_box_not_stronger("m", noise_only, run_data(noise_only)).status == "skip"


def test_more_effort():
    runs = [attack(1, "pgd-linf", 0.3, 0.4, config={"steps": 10}), attack(2, "pgd-linf", 0.3, 0.3)]
    assert more_effort_not_weaker("m", runs).status == "pass"  # default steps 40 > 10
    runs = [attack(1, "pgd-linf", 0.3, 0.3, config={"steps": 10}), attack(2, "pgd-linf", 0.3, 0.4)]
    check = more_effort_not_weaker("m", runs)
    assert check.status == "warn" and "pgd-linf 0.400 > pgd-linf(steps=10) 0.300" in check.detail
    other_budget = [runs[0], attack(2, "pgd-linf", 0.1, 0.9)]
    assert more_effort_not_weaker("m", other_budget).status == "skip"


def test_gradients_and_noise():
    def rate(v, n=N):
        return [MetricRow("m", "d", "zero-gradient-rate", None, None, v, "lower", "fraction",
                          n, {})]  # fmt: skip

    assert gradients_alive("m", run_data([], rate(0.02))).status == "pass"
    # no correctly classified sample: the rate 0 proves nothing (it passed until session 21)
    assert gradients_alive("m", run_data([], rate(0.0, 0))).status == "skip"
    assert gradients_alive("m", run_data([], rate(0.6))).status == "warn"
    assert gradients_alive("m", run_data([])).status == "skip"
    runs = [attack(1, "pgd-linf", 0.3, 0.1), attack(2, "random-noise", 0.3, 0.9, "decision")]
    assert noise_weaker_than_attacks("m", runs).status == "pass"
    runs[1] = attack(2, "random-noise", 0.3, 0.05, "decision")
    assert noise_weaker_than_attacks("m", runs).status == "warn"
    assert noise_weaker_than_attacks("m", runs[:1]).status == "skip"


def test_a_run_without_attacks_has_no_checks():
    assert sanity_checks(run_data([])) == []


PLAN = {
    "dataset": {"name": "mnist-embedded", "limit": N},
    "attacks": [
        {"name": "pgd-linf", "config": {"steps": 10}, "eps": [0.1, 0.3, 0.5]},
        {"name": "pgd-linf", "config": {"steps": 20}, "eps": [0.3]},
        {"name": "square-linf", "config": {"queries": 100}, "eps": [0.3]},
        {"name": "random-noise", "eps": [0.1, 0.3, 0.5]},
    ],
    "metrics": ["ca", "robust-accuracy", "zero-gradient-rate"],
}


@pytest.mark.parametrize(
    ("model", "warned"),
    [
        ("mnist-cnn", set()),
        ("mnist-cnn-pgd-at", set()),
        (
            "mnist-cnn-distillation",
            {
                "accuracy reaches ~0 at l-inf eps 0.5",
                "black-box attacks do not beat white-box ones",
                "loss gradients are not zero or NaN",
                "random noise is weaker than the attacks",
            },
        ),
    ],
)
def test_shipped_models(model, warned, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({**PLAN, "model": {"name": model}}))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    out = capsys.readouterr().out
    # every check ran: the plan has what each one needs (--quiet prints the counts and only
    # the warned checks' lines since session 21; it listed all six before)
    counts = f"{len(warned)} warning(s), {6 - len(warned)} passed, 0 skipped"
    # the hint names the --db the run went to (session 21: it read ./aisafety.db)
    assert f"sanity checks: {counts} (details: aisafety report 1 --db {db})" in out, out
    lines = [line for line in out.splitlines() if line.startswith("  [")]
    assert len(lines) == len(warned), out
    flagged = {line.split(": ")[1] for line in lines if line.startswith("  [WARN]")}
    assert flagged == warned, out
    if warned:
        assert "likely cause: " in out and "gradient masking" in out and "run: " in out


def test_a_non_adaptive_defense_warning_asks_for_the_adaptive_attack_first():
    """The zero-gradient warning's advice (apgd-dlr, cw-l2) cannot move PGD through
    bit-depth rounding; the run's own obfuscation warning named the fix, bpda, so each warning
    on that defended model now says it first (the texts are the real ones)."""
    inner = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), (1, 8, 8), 3)
    texts = obfuscation_warnings(RandomResizePad(BitDepthReduction(inner)), [PGDLinf()])
    model = "m+bit-depth(bits=3)+resize-pad"
    runs = [AttackRunRow(1, model, "d", "pgd-linf", "gradient", "linf", 0.5, {}, N, 0.9, 1.0)]
    data = run_data(runs)
    data.warnings = [WarningRow(None, "GradientMaskingWarning", text) for text in texts]
    (warned,) = [c for c in sanity_checks(data) if c.status == "warn"]  # reaches ~0 at 0.5
    assert warned.advice.startswith(
        "set eot_samples: 8 (or more) for defense 'resize-pad' and bpda: true for defense "
        "'bit-depth' in the plan"
    )
    assert warned.advice.endswith(breaks_at_large_budget(model, runs).advice)
    runs = [AttackRunRow(1, "m", "d", "pgd-linf", "gradient", "linf", 0.5, {}, N, 0.9, 1.0)]
    data.attack_runs = runs  # the undefended reference model keeps the plain advice
    (warned,) = [c for c in sanity_checks(data) if c.status == "warn"]
    assert warned.advice == breaks_at_large_budget("m", runs).advice


def test_square_inside_standard_beating_its_gradient_members_warns():
    """A plan with `standard` alone had no black-box attack to compare: the check skipped
    while Square, standard's last member, broke all 38 samples APGD and FAB left on the zoo's
    thermometer model (gradient masking). The stored members now feed the check."""
    runs = [AttackRunRow(1, "m", "d", "standard", "gradient", "linf", 0.3, {}, 40, 0.0, 1.0)]
    masked = run_data(runs)
    masked.members = {1: [MemberRow("apgd-ce", 38, 0), MemberRow("apgd-t", 38, 0),
                          MemberRow("fab-t", 38, 0), MemberRow("square-linf", 38, 38)]}  # fmt: skip
    check = black_box_not_stronger("m", runs, masked)
    assert check.status == "warn"
    assert "inside standard, square-linf breaks 38 of the 38 sample(s) that apgd-ce, " in (
        check.detail
    )
    healthy = run_data(runs)  # Square breaks 1 of 40: within the 3% margin
    healthy.members = {1: [MemberRow("apgd-ce", 38, 5), MemberRow("square-linf", 33, 1)]}
    assert black_box_not_stronger("m", runs, healthy).status == "pass"
    first = run_data(runs)  # Square before any gradient member: nothing they missed
    first.members = {1: [MemberRow("square-linf", 38, 30), MemberRow("apgd-ce", 8, 8)]}
    assert black_box_not_stronger("m", runs, first).status == "skip"
