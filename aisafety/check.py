"""The release gate behind ``aisafety check`` (the command is ``cli/check.py``): evaluate a
plan on the candidate model (or reuse the stored run of the same plan, model and data), compare
it sample by sample with a baseline run or model, and render the gate's report. The
statistics live in ``aisafety/report/gate/``; docs/release-gate.md explains them.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from aisafety.errors import ConfigError

if TYPE_CHECKING:  # torch, SQLAlchemy and the plugins load inside the command (cli/)
    from aisafety.interfaces import EvaluationPlan
    from aisafety.report.gate.measures import GateRun
    from aisafety.report.gate.spec import GateSpec
    from aisafety.report.gate.verdicts import Verdict
    from aisafety.store.results import ResultStore


def compared_with_baseline(
    baseline: str | None,
    quiet: bool,
    spec: GateSpec,
    plan: EvaluationPlan,
    store: ResultStore,
    candidate: GateRun,
) -> tuple[list[Verdict], str]:
    """The regression verdicts against ``--baseline``, and the baseline said in words."""
    from aisafety.report.gate.comparable import check_comparable
    from aisafety.report.gate.measures import load_gate_run
    from aisafety.report.gate.verdicts import regression_verdicts

    if baseline is None:
        raise ConfigError(
            "--baseline RUN_ID_OR_MODEL is needed to compare with (or set "
            "'regression: false' in the --require file to check only its requirements)"
        )
    baseline_id, how = baseline_run(baseline, plan, store, quiet)
    baseline_data = load_gate_run(store, baseline_id)
    check_comparable(baseline_data, candidate)
    if baseline_id == candidate.run_id:
        how += "; the candidate run itself, so nothing can regress"
    return (
        regression_verdicts(baseline_data.measures, candidate.measures, spec),
        f"baseline run {baseline_id} ({models_of(baseline_data)}, {how})",
    )


def shown(url: str) -> str:
    """The database URL without its password: the header goes into PR comments and CI logs."""
    from aisafety.store.engine import shown_url

    return shown_url(url)


def evaluated_run(plan: EvaluationPlan, store: ResultStore, quiet: bool) -> tuple[int, bool]:
    """(the run of ``plan``, whether it was stored before): a finished run that holds every
    unit of the plan (same plan, model weights, data and seed: the units' keys) and stored
    its model under the plan's name is reused."""
    from aisafety.execution import run_with
    from aisafety.runner import Runner

    runner = Runner(plan, store, quiet=quiet)  # one per plan: it warns about the plan
    keys = [u.key for u in runner.work_units(runner.prepare().subject)]
    stored = stored_run(store, keys, plan.model.name)
    if stored is not None:
        return stored, True
    return run_with(runner).run_id, False


def stored_run(store: ResultStore, keys: list[str], model_name: str) -> int | None:
    """The newest finished run whose complete rows hold every one of ``keys``, if one does,
    and whose stored plan names its model ``model_name``. A resumed run holds the units it
    reused from the interrupted run (``reused_units``) as well as its own; before session
    21 such a run was never found and its plan was evaluated again.

    The keys hash the weights, not the name: a run of the same file stored under another
    name (a user's model stored before its name was its file's, as the zoo's 'mnist-cnn')
    would give the gate's output and report a name the plan does not give; it is evaluated
    again instead (docs/release-gate.md)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from aisafety.interfaces import ZOO_DEFAULT
    from aisafety.store import schema

    finished = store.finished_units()
    if not keys or not set(keys) <= finished:
        return None
    with Session(store.engine) as session:
        owners = dict(
            session.execute(
                select(schema.Unit.key, schema.Unit.run_id).where(schema.Unit.key.in_(keys))
            ).all()
        )
        reusing = session.scalars(
            select(schema.ReusedUnit.run_id).where(schema.ReusedUnit.unit_key.in_(keys))
        )
        for run_id in sorted(set(owners.values()) | set(reusing), reverse=True):
            run = session.get(schema.Run, run_id)
            if run is None or run.status != "finished" or not covers(store, run_id, owners):
                continue
            stored_model = (run.plan or {}).get("model") or {}
            return run.id if stored_model.get("name", ZOO_DEFAULT) == model_name else None
    return None


def covers(store: ResultStore, run_id: int, owners: dict[str, int]) -> bool:
    """Whether run ``run_id`` holds every unit of ``owners`` (key -> the run whose rows are
    the unit's latest): it stored it, or reused those very rows (a resumed run, whose report
    reads them from the earlier run)."""
    reused = store.reused_units(run_id)
    return all(owner == run_id or reused.get(key) == owner for key, owner in owners.items())


def stored_baseline(baseline: str, store: ResultStore) -> int:
    """A run-id ``--baseline`` that names a finished run. Checked before the candidate is
    evaluated too: an id the database did not hold yet would otherwise be given to the
    candidate's own run, which then passed as its own baseline (and a typo cost a whole
    evaluation before its error)."""
    from sqlalchemy.orm import Session

    from aisafety.store import schema

    with Session(store.engine) as session:
        run = session.get(schema.Run, int(baseline))
        if run is None or run.status != "finished":
            state = "not in the database" if run is None else f"{run.status}, not finished"
            db = shlex.quote(shown(store.url))
            raise ConfigError(
                f"--baseline {baseline}: run {baseline} is {state} ({shown(store.url)}); give a "
                f"finished run id (`aisafety query 'SELECT id, status FROM runs' --db {db}`) "
                "or a zoo model"
            )
    return int(baseline)


def baseline_run(
    baseline: str, plan: EvaluationPlan, store: ResultStore, quiet: bool
) -> tuple[int, str]:
    """A run id as given, or the zoo model's run of the candidate's plan (evaluated or
    reused); and how it was found, said for the output."""

    from aisafety.database.zoo import list_models
    from aisafety.interfaces import ModelSpec

    if baseline.isdigit():
        return stored_baseline(baseline, store), "stored run"
    known = list_models()
    if baseline not in known:
        raise ConfigError(
            f"--baseline {baseline!r} is neither a run id nor a zoo model "
            "(`aisafety zoo list` names them)"
        )
    base_plan = plan.model_copy(update={"model": ModelSpec(name=baseline), "defenses": ()})
    run_id, reused = evaluated_run(base_plan, store, quiet)
    return run_id, f"{'reused' if reused else 'evaluated'} with the candidate's plan"


def gate_report(store: ResultStore, candidate: GateRun, verdicts, header: str) -> str:
    """The candidate run's HTML report with the gate's verdicts as its first section."""
    from aisafety.report.gate.output import summary
    from aisafety.report_page import Report, page, render_sections
    from aisafety.sanity import sanity_checks

    data = candidate.data
    report = Report(data, sanity_checks(data))
    report.gate = {"verdicts": verdicts, "header": header, "summary": summary(verdicts)}
    rendered = render_sections(report)
    subtitle = f"{', '.join(data.model_names)}: {summary(verdicts)}"
    return page(f"AISafety check: run {data.run_id}", subtitle, rendered, report.plots)


def models_of(run: GateRun) -> str:
    return ", ".join(run.data.model_names) or "no model"
