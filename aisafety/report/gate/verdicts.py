"""The gate's verdicts: one per regression test against the baseline and one per
requirement, each pass or fail with the numbers that decided it (docs/release-gate.md).

Regression tests (accuracy-type measures both runs have, on the samples both ran): the
candidate fails one when McNemar's exact one-sided test says it is worse at level
``level / k`` (Bonferroni over the k tests, so a re-run of the same model fails the whole
gate with probability at most ``level``) *and* the upper end of the matching Newcombe
interval of the difference lies below ``-min_effect`` (it is worse by more than the minimum
effect with that confidence). Requirements: a one-sided exact lower bound at least the
threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aisafety.errors import ConfigError
from aisafety.report.gate.measures import GateRun, Measure, worst_case
from aisafety.report.gate.spec import (
    CertifiedAccuracy,
    CleanAccuracy,
    GateSpec,
    NoSanityWarnings,
    RobustAccuracy,
)
from aisafety.report.paired import lower_bound, mcnemar_exact, newcombe_interval, paired_table

EPS_TOLERANCE = 1e-6  # a written 8/255 against a stored 0.0313725...
# the report section (aisafety/report/sections.py) showing each kind of measure
EVIDENCE = {"attack": "curves", "clean": "models", "certified": "certified"}


@dataclass(frozen=True)
class Verdict:
    name: str  # the requirement, as the JUnit test case is named
    kind: Literal["regression", "requirement"]
    passed: bool
    detail: str  # the numbers behind it, one line
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: str = "metrics"  # the report section that shows what it is about

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"


def regression_verdicts(
    baseline: dict[tuple, Measure], candidate: dict[tuple, Measure], spec: GateSpec
) -> list[Verdict]:
    """One verdict per measure both runs have (``GateRun.measures``; the caller checked that
    the runs are comparable)."""
    keys = [k for k in candidate if k in baseline]
    per_test = spec.level / max(len(keys), 1)
    return [_regression(baseline[k], candidate[k], per_test, spec.min_effect) for k in keys]


def _regression(base: Measure, cand: Measure, level: float, min_effect: float) -> Verdict:
    shared = sorted(base.correct.keys() & cand.correct.keys())
    name = f"no regression: {cand.title}"
    if not shared:
        raise ConfigError(f"{cand.title}: the runs share no sample, nothing to compare")
    table = paired_table([base.correct[i] for i in shared], [cand.correct[i] for i in shared])
    p = mcnemar_exact(table.regressions, table.improvements)
    low, high = newcombe_interval(table, 1 - 2 * level)
    worse = p <= level and high < -min_effect
    detail = (
        f"{table.candidate_accuracy:.4f} vs baseline {table.baseline_accuracy:.4f} on "
        f"{table.n} shared samples ({table.regressions} lost, {table.improvements} gained); "
        f"exact McNemar p {p:.3g} (fails at <= {level:.3g}); difference "
        f"{table.difference:+.4f}, {1 - 2 * level:.4g} interval [{low:+.4f}, {high:+.4f}]"
        + (f", minimum effect {min_effect:g}" if min_effect else "")
    )
    numbers = {
        "baseline": table.baseline_accuracy, "candidate": table.candidate_accuracy,
        "n": table.n, "lost": table.regressions, "gained": table.improvements, "p": p,
        "level": level, "low": low, "high": high,
    }  # fmt: skip
    return Verdict(name, "regression", not worse, detail, numbers, EVIDENCE[cand.key[0]])


def requirement_verdicts(
    spec: GateSpec, candidate: GateRun, sanity_warnings: list[str]
) -> list[Verdict]:
    """One verdict per requirement of ``spec`` on the candidate; ``sanity_warnings`` are the
    candidate's warned sanity checks, one line each."""
    out = []
    for req in spec.requirements:
        if isinstance(req, NoSanityWarnings):
            detail = "; ".join(sanity_warnings) or "every sanity check passed or was skipped"
            passed = not sanity_warnings
            out.append(Verdict(req.title(), "requirement", passed, detail, evidence="sanity"))
        else:
            out.append(_at_least(req, _requirement_outcomes(req, candidate)))
    return out


def _at_least(req: CleanAccuracy | RobustAccuracy | CertifiedAccuracy, correct: dict) -> Verdict:
    k, n = sum(correct.values()), len(correct)
    bound = lower_bound(k, n, req.confidence)
    detail = (
        f"{k / n:.4f} ({k}/{n}); one-sided {req.confidence:.0%} exact lower bound "
        f"{bound:.4f} {'>=' if bound >= req.at_least else '<'} {req.at_least:g}"
    )
    numbers = {"observed": k / n, "k": k, "n": n, "lower_bound": bound}
    evidence = {"clean-accuracy": "models", "robust-accuracy": "curves"}.get(req.kind, "certified")
    return Verdict(req.title(), "requirement", bound >= req.at_least, detail, numbers, evidence)


def _requirement_outcomes(req, run: GateRun) -> dict[int, bool]:
    """The per-sample outcomes a requirement is about; a ConfigError naming what the run
    has instead when it has none of them (the plan cannot answer the requirement)."""
    measures = list(run.measures.values())
    if isinstance(req, CleanAccuracy):
        found = [m for m in measures if m.key == ("clean",)]
    elif isinstance(req, RobustAccuracy):
        found = [
            m for m in measures if m.key[0] == "attack" and m.norm == req.norm
            and abs(m.eps - req.eps) <= EPS_TOLERANCE
            and (req.attack is None or req.attack in (m.source, m.source.split("(", 1)[0]))
        ]  # fmt: skip
    else:
        found = [
            m for m in measures if m.key[0] == "certified" and m.eps is not None
            and abs(m.eps - req.eps) <= EPS_TOLERANCE
            and (req.verifier is None or req.verifier == m.source)
        ]  # fmt: skip
    if not found:
        has = "; ".join(m.title for m in measures) or "nothing per sample"
        raise ConfigError(
            f"requirement {req.title()!r}: run {run.run_id} has no such measurement (it has: "
            f"{has}); add the attack or metric to the plan, or fix the requirement"
        )
    return worst_case(found)


def gate_passed(verdicts: list[Verdict]) -> bool:
    return all(v.passed for v in verdicts)
