"""What makes the runs on one comparison page measure different things, said per run.

The comparison page ranks models on numbers stored by separate runs. A difference in those
numbers is the models' only when the runs counted them by the same rules, on the same
images, with the same evaluation settings and the same attacks at each budget; otherwise
part of it is the runs'. Each such difference is listed with every run's value and what it
does to the page. The run seed is not one: attack randomness from run to run is noise the
page shows (the ± of pooled ``seeds:`` runs), as the release gate allows it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aisafety.report.data import RunData
from aisafety.report.gate.comparable import PLAN_FIELDS, UNCOMPARED_DATASET_FIELDS
from aisafety.store import semantics

ABSENT = "—"  # a setting or budget a run does not have


@dataclass(frozen=True)
class Difference:
    """One way the runs differ: each run's value (by run id) and why it misleads."""

    what: str
    values: dict[int, str]
    why: str


def differences(runs: list[RunData]) -> list[Difference]:
    """Every way the runs' evaluations differ; empty when one rule set, data and plan."""
    if len({data.run_id for data in runs}) < 2:
        return []
    found = [_semantics(runs), _data(runs), _status(runs)]
    found += _settings(runs)
    found.append(_budgets(runs))
    return [d for d in found if d is not None]


def _differ(what: str, values: dict[int, str], why: str) -> Difference | None:
    return Difference(what, values, why) if len(set(values.values())) > 1 else None


def _semantics(runs: list[RunData]) -> Difference | None:
    versions = {semantics.version_of(d.semantics_version) for d in runs}
    if len(versions) < 2:
        return None
    shown = {d.run_id: semantics.shown(d.semantics_version) for d in runs}
    return Difference("results semantics version", shown, semantics.why_unlike(versions))


def _data(runs: list[RunData]) -> Difference | None:
    def images(data: RunData) -> str:
        shown = sorted(
            f"{d['name']}/{d['split']} ({d['n_samples']} samples, fingerprint "
            f"{d['fingerprint'][:12]})"
            for d in data.datasets
        )
        return ", ".join(shown) or ABSENT

    return _differ(
        "data",
        {d.run_id: images(d) for d in runs},
        "the runs measured other images: a rate on other images answers another question, "
        "and columns of one dataset name are ranked together",
    )


def _status(runs: list[RunData]) -> Difference | None:
    return _differ(
        "run status",
        {d.run_id: d.status for d in runs},
        "a run that did not finish stored only some of its units: the cells it lacks are "
        "ranked without it",
    )


def _settings(runs: list[RunData]) -> list[Difference]:
    """The plan fields that change what is measured (those the release gate compares)."""

    def dataset(plan: dict[str, Any]) -> dict[str, Any]:
        fields = plan.get("dataset") or {}
        return {k: v for k, v in fields.items() if k not in UNCOMPARED_DATASET_FIELDS}

    found = []
    names = sorted({k for d in runs for k in dataset(d.plan)})
    for name in names:
        values = {d.run_id: _shown(dataset(d.plan).get(name, ABSENT)) for d in runs}
        found.append(_differ(f"dataset.{name}", values, "other images or another draw of them"))
    for name in PLAN_FIELDS:
        values = {d.run_id: _shown(d.plan.get(name, ABSENT)) for d in runs}
        found.append(_differ(name, values, "the evaluation ran otherwise"))
    return [d for d in found if d is not None]


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def _budgets(runs: list[RunData]) -> Difference | None:
    """Attack runs (attack with its settings, norm, budget) that not every run has."""
    have = {
        d.run_id: {(a.attack, a.norm or "-", a.eps) for a in d.attack_runs} for d in runs
    }  # fmt: skip
    shared = set.intersection(*have.values())

    def only(run_id: int) -> str:
        extra = sorted(have[run_id] - shared)
        return "; ".join(f"{attack} {norm} @{eps:g}" for attack, norm, eps in extra) or ABSENT

    return _differ(
        "attacks only some runs have",
        {run_id: only(run_id) for run_id in have},
        "a column a run lacks ranks the others without it, and the worst case over attacks "
        "at a budget is taken over other attacks: weaker attacks leave higher numbers",
    )
