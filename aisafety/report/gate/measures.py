"""Per-sample outcomes of a stored run that the gate tests: clean accuracy, robust accuracy
per attack run, certified accuracy per certified metric; each a map sample index -> right.

Everything is read from the results database (the ``sample_outcomes`` and
``verification_samples`` rows), so any stored run can be a baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from aisafety.report.data import MetricRow, RunData, load_run
from aisafety.store import schema
from aisafety.store.results import ResultStore

CERTIFIED_METRICS = ("certified-accuracy", "ibp-certified-accuracy")


@dataclass(frozen=True)
class Measure:
    """One accuracy-type quantity of a run, sample by sample."""

    key: tuple  # what it measures, equal across runs: ("attack", label, eps), ...
    title: str
    correct: dict[int, bool]  # sample index -> counted (right, robust, certified)
    norm: str | None = None
    eps: float | None = None
    source: str = ""  # the attack label or metric label it comes from

    @property
    def accuracy(self) -> float:
        return sum(self.correct.values()) / len(self.correct)


@dataclass
class GateRun:
    """A stored run as the gate sees it: its data, measures and sample labels."""

    data: RunData
    measures: dict[tuple, Measure]
    labels: dict[int, int] = field(default_factory=dict)  # sample index -> true label

    @property
    def run_id(self) -> int:
        return self.data.run_id


def load_gate_run(store: ResultStore, run_id: int) -> GateRun:
    """Run ``run_id`` with every measure the gate can test (ConfigError if it is absent)."""
    data = load_run(store, run_id)
    measures: dict[tuple, Measure] = {}
    labels: dict[int, int] = {}
    clean: dict[int, bool] = {}
    for a in data.attack_runs:
        outcome = data.outcomes.get(a.id)
        if outcome is None:
            continue
        index = outcome["sample_index"].tolist()
        labels.update(zip(index, outcome["label"].tolist(), strict=True))
        clean.update(zip(index, (outcome["clean_pred"] == outcome["label"]).tolist(), strict=True))
        right = dict(zip(index, (outcome["adv_pred"] == outcome["label"]).tolist(), strict=True))
        key = ("attack", a.attack, a.eps)
        title = f"robust accuracy under {a.attack} at {a.norm or '-'} {a.eps:g}"
        measures[key] = Measure(key, title, right, a.norm, a.eps, a.attack)
    if clean:
        measures[("clean",)] = Measure(("clean",), "clean accuracy", clean)
    for m, verdicts in _certified(store, data.metrics):
        eps = m.eps if m.eps is not None else m.details.get("eps")
        key = ("certified", m.metric, eps)
        labels.update({i: label for i, (label, _) in verdicts.items()})
        correct = {i: certified for i, (_, certified) in verdicts.items()}
        title = f"certified accuracy ({m.metric})"
        measures[key] = Measure(key, title, correct, "linf", eps, m.details.get("verifier", ""))
    return GateRun(data, measures, labels)


def _certified(store: ResultStore, metrics: list[MetricRow]) -> list[tuple[MetricRow, dict]]:
    """Certified metrics' per-sample verdicts: (metric, {sample index: (label, certified)})."""
    rows = {m.id: m for m in metrics if m.name in CERTIFIED_METRICS and m.value is not None}
    if not rows:
        return []
    table = schema.VerificationSample
    found: dict[int, dict[int, tuple[int, bool]]] = defaultdict(dict)
    with Session(store.engine) as session:
        query = select(table.metric_value_id, table.sample_index, table.label, table.verdict)
        for value_id, index, label, verdict in session.execute(
            query.where(table.metric_value_id.in_(list(rows)))
        ):
            found[value_id][index] = (label, verdict == "certified")
    return [(rows[i], found[i]) for i in rows if i in found]


def worst_case(measures: list[Measure]) -> dict[int, bool]:
    """Per sample: right under every one of ``measures`` (samples all of them ran on)."""
    shared = set.intersection(*(set(m.correct) for m in measures))
    return {i: all(m.correct[i] for m in measures) for i in sorted(shared)}
