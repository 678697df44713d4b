"""Whether two stored runs can be compared sample by sample, and if not, what differs.

The gate tests the difference between two evaluations of the same question; a baseline
evaluated on other images, at other budgets, with other attacks, with other pinned seeds or
by code that counts otherwise (another results semantics version) answers another question,
and no statistic can say which model is better from it. The run seed may differ: attack
randomness from run to run is the noise the test allows for.
"""

from __future__ import annotations

from typing import Any

from aisafety.errors import ConfigError
from aisafety.report.gate.measures import GateRun
from aisafety.store import semantics

# plan fields that change what is measured (the model is what the gate compares)
PLAN_FIELDS = ("precision", "corruptions", "shard_size")
UNCOMPARED_DATASET_FIELDS = ("path",)  # where the files are; their contents are fingerprinted


class NotComparable(ConfigError):
    """The baseline and candidate runs measured different things; the message says what."""


def differences(baseline: GateRun, candidate: GateRun) -> list[str]:
    """Each way the runs' evaluations differ, said in words; empty when they are comparable."""
    found = _semantics(baseline, candidate) + _datasets(baseline, candidate)
    found += _plan(baseline.data.plan, candidate.data.plan)
    found += _measures(baseline, candidate)
    shared = baseline.labels.keys() & candidate.labels.keys()
    relabelled = sum(baseline.labels[i] != candidate.labels[i] for i in shared)
    if relabelled:
        found.append(f"labels differ at {relabelled} of the {len(shared)} shared sample indices")
    if baseline.labels and candidate.labels and not shared:
        found.append("no sample index is in both runs")
    return found


def check_comparable(baseline: GateRun, candidate: GateRun) -> None:
    """Refuse (exit 2) a baseline that measured something else, naming each difference."""
    found = differences(baseline, candidate)
    if found:
        lines = "\n".join(f"  - {line}" for line in found)
        raise NotComparable(
            f"baseline run {baseline.run_id} and candidate run {candidate.run_id} are not "
            f"comparable:\n{lines}\nevaluate the baseline model with the candidate's plan "
            "(--baseline MODEL_NAME does) or pick a run of the same plan"
        )


def _semantics(baseline: GateRun, candidate: GateRun) -> list[str]:
    """Runs counted by other rules (store/semantics.py): a change of the code, not the model,
    would pass or fail the gate (keep_clean_mistakes lowers robust accuracy)."""
    found = semantics.unlike(
        {
            "baseline": [baseline.data.semantics_version],
            "candidate": [candidate.data.semantics_version],
        }
    )
    return [found] if found else []


def _datasets(baseline: GateRun, candidate: GateRun) -> list[str]:
    def ids(run: GateRun) -> set[tuple]:
        return {(d["name"], d["split"], d["fingerprint"]) for d in run.data.datasets}

    before, after = ids(baseline), ids(candidate)
    if before == after:
        return []
    return [f"data: baseline {_names(before)}, candidate {_names(after)}"]


def _names(datasets: set[tuple]) -> str:
    return ", ".join(f"{n}/{s} (fingerprint {f[:12]})" for n, s, f in sorted(datasets)) or "none"


def _plan(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    found = []
    data_a, data_b = (
        {k: v for k, v in (p.get("dataset") or {}).items() if k not in UNCOMPARED_DATASET_FIELDS}
        for p in (before, after)
    )
    for name in sorted(data_a.keys() | data_b.keys()):
        if data_a.get(name) != data_b.get(name):
            found.append(f"dataset.{name}: baseline {data_a.get(name)!r}, "
                         f"candidate {data_b.get(name)!r}")  # fmt: skip
    for name in PLAN_FIELDS:
        if before.get(name) != after.get(name):
            found.append(f"{name}: baseline {before.get(name)!r}, candidate {after.get(name)!r}")
    return found


def _measures(baseline: GateRun, candidate: GateRun) -> list[str]:
    """Attacks, budgets and certified metrics that only one run has."""
    found = []
    for who, mine, theirs in (
        ("baseline", baseline, candidate),
        ("candidate", candidate, baseline),
    ):
        only = [mine.measures[k].title for k in mine.measures if k not in theirs.measures]
        if only:
            found.append(f"only the {who} has: {'; '.join(only)}")
    return found
