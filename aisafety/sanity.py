"""Gradient-masking sanity checks on a stored run (Carlini et al. 2019, "On Evaluating
Adversarial Robustness"; Croce & Hein 2020's AutoAttack ``checks.py``).

Most published robustness numbers that later fell were an attack failing, not a model
resisting. Each check reads the run's attack results and says ``pass``, ``warn`` (with the
likely cause and what to run) or ``skip`` (the run lacks the attacks the check needs, and
which to add). Tolerances allow for sampling noise: ``tolerance(n)`` is 2 samples or 1%.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

from aisafety.report.data import AttackRunRow, RunData

Status = Literal["pass", "warn", "skip"]
BREAKING_LINF_EPS = 0.5  # every [0, 1] image can be moved to flat grey: no model survives
BROKEN_ACCURACY = 0.05  # "reaches ~0": at most this robust accuracy at the breaking budget
BLACK_BOX_MARGIN = 0.03  # a black-box attack may beat the white-box ones by this much
ZERO_GRADIENT_LIMIT = 0.10  # share of samples with a zero/NaN gradient before it warns
WHITE_BOX = "gradient"
BLACK_BOX = ("score", "decision")
NOISE = "random-noise"
# Ensemble members that query scores only (AutoAttack's Square): what one breaks after the
# gradient members ran is what every one of them missed.
BLACK_BOX_MEMBERS = ("square-linf", "square-l2")
Defaults = Callable[[str], dict]  # attack name -> its default settings
EFFORT_KEYS = ("steps", "restarts", "n_restarts", "queries", "iterations", "max_iter")
# The run's own warnings (defense/obfuscation.py) about a defense attacked non-adaptively.
UNADAPTED = re.compile(
    r"defense '(?P<kind>[^']+)' is (?:(?P<bpda>not differentiable and its bpda is off)"
    r"|random and its eot_samples is 1)"
)


@dataclass(frozen=True)
class Check:
    check: str
    model: str
    status: Status
    detail: str
    cause: str = ""
    advice: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def tolerance(n: int) -> float:
    return max(2.0 / max(n, 1), 0.01)


def sanity_checks(data: RunData, defaults: Defaults | None = None) -> list[Check]:
    """Every check for every model of the run that was attacked; ``defaults``: an attack's
    default settings by name (None: the installed plugins', report_catalog.py)."""
    defaults = defaults or installed_defaults()
    checks: list[Check] = []
    for model in dict.fromkeys(a.model for a in data.attack_runs):
        runs = [a for a in data.attack_runs if a.model == model]
        if not runs:
            continue
        checks += [
            monotone_in_budget(model, runs),
            breaks_at_large_budget(model, runs),
            black_box_not_stronger(model, runs, data),
            more_effort_not_weaker(model, runs, defaults),
            gradients_alive(model, data),
            noise_weaker_than_attacks(model, runs),
        ]
    return [_adaptive_first(check, data) for check in checks]


def adaptive_settings(data: RunData, model: str) -> list[str]:
    """The settings the run's obfuscation warnings asked for on ``model``'s input defenses
    (``bpda: true``, ``eot_samples``), e.g. ``["bpda: true for defense 'jpeg'"]``."""
    found = []
    for warning in data.warnings:
        match = UNADAPTED.match(warning.message)
        if warning.category != "GradientMaskingWarning" or match is None:
            continue
        kind = match["kind"]
        if re.search(rf"\+{re.escape(kind)}(?:\(|\+|$)", model):
            setting = "bpda: true" if match["bpda"] else "eot_samples: 8 (or more)"
            found.append(f"{setting} for defense {kind!r}")
    return list(dict.fromkeys(found))


def _adaptive_first(check: Check, data: RunData) -> Check:
    """A warning on a defense the run attacked non-adaptively: its first fix is the adaptive
    attack (a margin loss or more steps through a zero gradient change nothing)."""
    settings = adaptive_settings(data, check.model) if check.status == "warn" else []
    if not settings:
        return check
    advice = (
        f"set {' and '.join(settings)} in the plan (the adaptive attack, docs/defenses.md): "
        f"this run attacked the defense non-adaptively; then {check.advice}"
    )
    return replace(check, advice=advice)


def _attacks(runs: list[AttackRunRow]) -> dict[str, list[AttackRunRow]]:
    grouped: dict[str, list[AttackRunRow]] = defaultdict(list)
    for run in runs:
        grouped[run.attack].append(run)
    return grouped


def monotone_in_budget(model: str, runs: list[AttackRunRow]) -> Check:
    name = "robust accuracy falls with the budget"
    problems = []
    compared = 0
    for attack, group in _attacks(runs).items():
        if attack.startswith(NOISE):
            continue
        ordered = sorted(group, key=lambda r: r.eps)
        for small, large in zip(ordered, ordered[1:], strict=False):
            compared += 1
            if large.robust_accuracy > small.robust_accuracy + tolerance(large.n_samples):
                problems.append(
                    f"{attack}: {small.robust_accuracy:.3f} at eps {small.eps:g} but "
                    f"{large.robust_accuracy:.3f} at eps {large.eps:g}"
                )
    if not compared:
        return Check(
            name,
            model,
            "skip",
            "no attack was run at two budgets",
            advice="give an attack several budgets, e.g. eps: [0.1, 0.3, 0.5]",
        )
    if problems:
        return Check(
            name,
            model,
            "warn",
            "; ".join(problems),
            cause="a larger budget contains every smaller one, so the attack is not finding "
            "what it could (gradient masking or too few steps)",
            advice="rerun with more steps and restarts (pgd-linf steps: 200), and with "
            "apgd-dlr or square-linf at the same budgets",
        )
    return Check(name, model, "pass", f"{compared} pair(s) of budgets, none rising")


def breaks_at_large_budget(model: str, runs: list[AttackRunRow]) -> Check:
    name = f"accuracy reaches ~0 at l-inf eps {BREAKING_LINF_EPS:g}"
    large = [
        r
        for r in runs
        if r.norm == "linf" and r.eps >= BREAKING_LINF_EPS and not r.attack.startswith(NOISE)
    ]
    if not large:
        return Check(
            name,
            model,
            "skip",
            f"no l-inf attack at eps >= {BREAKING_LINF_EPS:g}",
            advice=f"add eps {BREAKING_LINF_EPS:g} to an l-inf attack, "
            f"e.g. pgd-linf eps: [0.1, 0.3, {BREAKING_LINF_EPS:g}]",
        )
    best = min(large, key=lambda r: r.robust_accuracy)
    detail = f"best: {best.attack} at eps {best.eps:g} leaves {best.robust_accuracy:.3f}"
    if best.robust_accuracy > BROKEN_ACCURACY:
        return Check(
            name,
            model,
            "warn",
            detail,
            cause=f"at eps {BREAKING_LINF_EPS:g} any image can be turned flat grey, so a "
            "working attack breaks almost every sample: the attack is not following the "
            "model (gradient masking) or stops too early",
            advice="run apgd-dlr or square-linf (needs no gradients) at the same budget",
        )
    return Check(name, model, "pass", detail)


def _worst_case(data: RunData, runs: list[AttackRunRow]) -> np.ndarray | None:
    """Per sample: correct under every one of ``runs`` (None when outcomes are missing)."""
    masks = [data.correct(r.id) for r in runs if r.id in data.outcomes]
    if not masks or len({len(m) for m in masks}) != 1:
        return None
    return np.logical_and.reduce(masks)


def black_box_not_stronger(model: str, runs: list[AttackRunRow], data: RunData) -> Check:
    name = "black-box attacks do not beat white-box ones"
    budgets: dict[tuple, dict[str, list[AttackRunRow]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        budgets[(run.norm, run.eps)][run.family].append(run)
    problems, compared = [], 0
    for (norm, eps), families in sorted(budgets.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        white = families.get(WHITE_BOX, [])
        black = [r for f in BLACK_BOX for r in families.get(f, []) if r.name != NOISE]
        if not white or not black:
            continue
        compared += 1
        white_acc = min(r.robust_accuracy for r in white)
        best_black = min(black, key=lambda r: r.robust_accuracy)
        if best_black.robust_accuracy < white_acc - BLACK_BOX_MARGIN:
            survivors = _worst_case(data, white)
            extra = ""
            if survivors is not None and best_black.id in data.outcomes:
                only = survivors & ~data.correct(best_black.id)
                extra = f"; it breaks {int(only.sum())} sample(s) every white-box attack missed"
            problems.append(
                f"{norm} eps {eps:g}: {best_black.attack} {best_black.robust_accuracy:.3f} < "
                f"white-box {white_acc:.3f}{extra}"
            )
    for run in runs:
        if run.family != WHITE_BOX:
            continue
        compared_here, problem = _black_box_member(run, data)
        compared += compared_here
        problems += [problem] if problem else []
    if not compared:
        return Check(
            name,
            model,
            "skip",
            "no budget has both a white-box and a black-box attack",
            advice="add square-linf at a budget of a gradient attack",
        )
    if problems:
        return Check(
            name,
            model,
            "warn",
            "; ".join(problems),
            cause="an attack that sees only outputs cannot know more than one that sees "
            "gradients, unless the gradients are useless: gradient masking",
            advice="report the black-box number (or the per-sample worst case), and attack "
            "with apgd-dlr, cw-l2 or a margin loss instead of cross-entropy",
        )
    return Check(name, model, "pass", f"{compared} budget(s) compared")


def _black_box_member(run: AttackRunRow, data: RunData) -> tuple[int, str]:
    """(1 if compared, the problem or ""): an ensemble's black-box member that, run after its
    gradient members, breaks more than ``BLACK_BOX_MARGIN`` of the samples they all missed
    (AutoAttack's own check: Square beating APGD means the gradients mislead)."""
    members = data.members.get(run.id, [])
    for i, member in enumerate(members):
        white = [m.member for m in members[:i] if m.member not in BLACK_BOX_MEMBERS]
        if member.member not in BLACK_BOX_MEMBERS or not white:
            continue
        if member.n_broken / max(run.n_samples, 1) > BLACK_BOX_MARGIN:
            return 1, (
                f"{run.norm} eps {run.eps:g}: inside {run.attack}, {member.member} breaks "
                f"{member.n_broken} of the {member.n_attacked} sample(s) that "
                f"{', '.join(white)} left (of {run.n_samples})"
            )
        return 1, ""
    return 0, ""


def installed_defaults() -> Defaults:
    """The installed attacks' default settings (a plan's config lists only what it changed);
    {} for an attack no longer installed."""
    from aisafety.report_catalog import default_catalog

    return default_catalog().attack_defaults


def _effort(run: AttackRunRow, defaults: Defaults) -> tuple[int, ...]:
    default = defaults(run.name)
    return tuple(int(run.config.get(k, default.get(k)) or 0) for k in EFFORT_KEYS)


def more_effort_not_weaker(
    model: str, runs: list[AttackRunRow], defaults: Defaults | None = None
) -> Check:
    name = "more steps or restarts do not raise robust accuracy"
    defaults = defaults or installed_defaults()
    groups: dict[tuple, list[AttackRunRow]] = defaultdict(list)
    for run in runs:
        rest = {k: v for k, v in run.config.items() if k not in EFFORT_KEYS}
        groups[(run.name, run.norm, run.eps, repr(sorted(rest.items())))].append(run)
    problems, compared = [], 0
    effort = {id(run): _effort(run, defaults) for run in runs}
    for group in groups.values():
        for weak in group:
            for strong in group:
                high, low = effort[id(strong)], effort[id(weak)]
                more = all(s >= w for s, w in zip(high, low, strict=True))
                if strong is weak or not more or high == low:
                    continue
                compared += 1
                if strong.robust_accuracy > weak.robust_accuracy + tolerance(strong.n_samples):
                    problems.append(
                        f"{strong.attack} {strong.robust_accuracy:.3f} > {weak.attack} "
                        f"{weak.robust_accuracy:.3f} at eps {strong.eps:g}"
                    )
    if not compared:
        return Check(
            name,
            model,
            "skip",
            "no attack was run twice with different effort",
            advice="run an attack a second time with 4x the steps, e.g. pgd-linf "
            "config {steps: 160} next to {steps: 40}",
        )
    if problems:
        return Check(
            name,
            model,
            "warn",
            "; ".join(problems),
            cause="a longer search can only find more adversarial examples; randomness in "
            "the model (stochastic defense) or masked gradients make it look otherwise",
            advice="average gradients over randomness (EOT), and use apgd-ce/apgd-dlr",
        )
    return Check(name, model, "pass", f"{compared} pair(s) compared")


def gradients_alive(model: str, data: RunData) -> Check:
    name = "loss gradients are not zero or NaN"
    rows = [m for m in data.metrics if m.model == model and m.name == "zero-gradient-rate"]
    if not rows or rows[0].value is None:
        return Check(
            name,
            model,
            "skip",
            "the run did not measure zero-gradient-rate",
            advice="add the metric zero-gradient-rate to the plan",
        )
    if not rows[0].n_samples:  # the rate of no sample is 0 and proved nothing: it passed
        return Check(
            name,
            model,
            "skip",
            "no correctly classified sample to take a loss gradient at",
            advice="evaluate images the model classifies correctly (more of them; or check "
            "mean/std, input size and the label order if clean accuracy is 0)",
        )
    rate = rows[0].value
    detail = f"{rate:.1%} of {rows[0].n_samples} correctly classified samples"
    if rate > ZERO_GRADIENT_LIMIT:
        return Check(
            name,
            model,
            "warn",
            detail,
            cause="the cross-entropy gradient vanishes (saturated softmax, e.g. defensive "
            "distillation) or is NaN, so gradient attacks do not move: gradient masking",
            advice="attack with cw-l2 or apgd-dlr (margin / logit-ratio losses do not "
            "saturate) and with square-linf",
        )
    return Check(name, model, "pass", detail)


def noise_weaker_than_attacks(model: str, runs: list[AttackRunRow]) -> Check:
    name = "random noise is weaker than the attacks"
    noise = {(r.norm, r.eps): r for r in runs if r.name == NOISE}
    problems, compared = [], 0
    for run in runs:
        baseline = noise.get((run.norm, run.eps))
        if baseline is None or run.name == NOISE:
            continue
        compared += 1
        if baseline.robust_accuracy < run.robust_accuracy - tolerance(run.n_samples):
            problems.append(
                f"{run.attack} {run.robust_accuracy:.3f} > noise "
                f"{baseline.robust_accuracy:.3f} at eps {run.eps:g}"
            )
    if not compared:
        return Check(
            name,
            model,
            "skip",
            "no random-noise run at an attack's budget",
            advice="add the attack random-noise with the same eps as the others",
        )
    if problems:
        return Check(
            name,
            model,
            "warn",
            "; ".join(problems),
            cause="random noise does not look at the model; an attack it beats is not "
            "following the loss (gradient masking) or is misconfigured",
            advice="check the attack's step size, and run apgd-dlr and square-linf",
        )
    return Check(name, model, "pass", f"{compared} attack run(s) compared")


def summary_line(check: Check) -> str:
    """One line of CLI output; a warning adds its cause and advice on the next lines."""
    line = f"  [{check.status.upper():4}] {check.model}: {check.check}: {check.detail}"
    if check.status == "warn":
        line += f"\n         likely cause: {check.cause}\n         run: {check.advice}"
    elif check.status == "skip":
        line += f"\n         to check: {check.advice}"
    return line
