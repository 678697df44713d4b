"""The comparison page says what makes its runs incomparable (results semantics, data, plan,
attack budgets) and shows the warnings they raised; ``--resume`` never reuses a unit counted
by older rules. Through the report builder on runs stored in SQLite."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import create_engine, text

from aisafety.errors import AISafetyWarning, ClassCountWarning, PluginLoadWarning
from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.report.comparability import differences
from aisafety.report.data import load_run
from aisafety.report.warning_kinds import counted, kind
from aisafety.report_page import build_comparison, build_report
from aisafety.runner import Runner
from aisafety.store import semantics
from aisafety.store.results import ResultStore
from aisafety.warning_log import KeptWarning

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=20),
    attacks=(AttackSpec(name="fgsm", eps=(0.1,)),),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "robust-accuracy")),
    device="cpu",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[str, list[int]]:
    """Three runs of mnist-cnn: two of one plan, one on 30 images with another budget."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cmp') / 'r.db'}"
    store = ResultStore(url)
    other = PLAN.model_copy(
        update={
            "dataset": DatasetSpec(limit=30),
            "attacks": (AttackSpec(name="fgsm", eps=(0.1, 0.2)),),
        }
    )
    ids = [Runner(plan, store, quiet=True).run().run_id for plan in (PLAN, PLAN, other)]
    store.engine.dispose()
    return url, ids


def _set_version(url: str, run_id: int, version: int | None) -> None:
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE runs SET semantics_version = :v WHERE id = :id"),
            {"v": version, "id": run_id},
        )
    engine.dispose()


def _section(html: str, name: str) -> str:
    found = re.search(rf'<section id="{name}".*?</section>', html, re.S)
    return found.group(0) if found else ""


def test_runs_of_one_plan_and_one_semantics_compare_without_a_note(runs):
    url, (a, b, _) = runs
    store = ResultStore(url)
    assert load_run(store, a).semantics_version == semantics.CURRENT  # stored with the run
    html = build_comparison(store, [a, b])
    assert 'id="comparability"' not in html and 'id="warnings"' not in html
    assert differences([load_run(store, a), load_run(store, a)]) == []  # one run twice


def test_runs_on_two_sides_of_a_semantics_change_are_flagged(runs):
    """A run stored before versions were kept (NULL: version 1, before keep_clean_mistakes)
    against one of today's: the page names the version of each and the change between."""
    url, (a, b, _) = runs
    _set_version(url, a, None)
    try:
        html = build_comparison(ResultStore(url), [a, b])
        report = build_report(ResultStore(url), a)
        provenance = _section(report, "provenance")
    finally:
        _set_version(url, a, semantics.CURRENT)
    section = _section(html, "comparability")
    assert "results semantics version" in section
    assert "1 (not recorded: stored before it was kept)" in section
    assert f"<td>{semantics.CURRENT}</td>" in section
    assert "attack/base.keep_clean_mistakes" in section
    assert html.index('id="comparability"') < html.index('id="leaderboard"')
    assert "results semantics version</th><td>not recorded" in provenance  # one run's page
    assert "run warnings:" not in _section(report, "models")  # it raised none: no badge
    # nothing else differs between these two runs
    assert section.count("<tr>") == 2  # the header and the one difference


def test_other_data_and_budgets_are_flagged_and_the_seed_is_not(runs):
    url, (a, _, c) = runs
    store = ResultStore(url)
    found = {d.what: d.values for d in differences([load_run(store, a), load_run(store, c)])}
    assert set(found) == {"data", "dataset.limit", "attacks only some runs have"}
    assert found["dataset.limit"] == {a: "20", c: "30"}
    assert "20 samples" in found["data"][a] and "30 samples" in found["data"][c]
    assert found["attacks only some runs have"] == {a: "—", c: "fgsm linf @0.2"}
    seeded = load_run(store, a)
    seeded.seed += 1  # attack randomness is the noise the page shows, not a difference
    assert differences([seeded, load_run(store, a)]) == []


def test_the_comparison_shows_each_runs_warnings(runs):
    url, (a, b, _) = runs
    store = ResultStore(url)
    message = "the clean accuracy 0.1 of mnist-cnn is at chance (10 classes)"
    store.finish_run(b, "finished", [KeptWarning(None, AISafetyWarning, message)])
    try:
        html = build_comparison(store, [a, b])
    finally:  # the other tests' runs raised none
        with store.engine.begin() as connection:
            connection.execute(text("DELETE FROM run_warnings"))
    section = _section(html, "warnings")
    assert message in section and "AISafetyWarning" in section and "the run" in section
    assert section.count("<tr>") == 2  # run b's warning only; run a raised none
    # counted by kind since session 21 (was "1 run warning(s)"): a plain AISafetyWarning
    # names no kind
    assert ">1 run warning: other</a>" in _section(html, "leaderboard")


def test_a_single_run_report_counts_its_warnings_by_kind_and_links_them(runs):
    """The model card's badge says how many warnings of which kind (from their stored class)
    and links to the Warnings section, which lists each; the rendered HTML, no browser."""
    url, (a, _, _) = runs
    store = ResultStore(url)
    kept = [
        KeptWarning(None, ClassCountWarning, "model 'mnist-cnn' has 12 outputs"),
        KeptWarning(None, PluginLoadWarning, "plugin 'broken' failed to load"),
        KeptWarning("fgsm eps=0.1", ClassCountWarning, "another class count"),
    ]
    store.finish_run(a, "finished", kept)
    try:
        html = build_report(store, a)
    finally:  # the other tests' runs raised none
        with store.engine.begin() as connection:
            connection.execute(text("DELETE FROM run_warnings"))
    badge = re.search(
        r'<a class="badge warn" href="#([^"]+)"[^>]*>([^<]*)</a>', _section(html, "models")
    )
    assert badge and badge.groups() == ("warnings", "3 warnings: class count (2), plugin load")
    listed = _section(html, "warnings")
    assert listed.count("<tr>") == 4 and "PluginLoadWarning" in listed  # the header and 3
    assert 'id="warnings"' in html and html.index('id="warnings"') < html.index('id="models"')


def test_a_warnings_kind_is_its_class_name_in_words():
    assert [kind(c) for c in ("ClassCountWarning", "PluginLoadWarning", "AtChanceWarning")] == [
        "class count",
        "plugin load",
        "at chance",
    ]
    assert kind("ONNXShapeWarning") == "ONNX shape"  # a plugin's own class: no table needed
    assert kind("AISafetyWarning") == kind("UserWarning") == "other"  # no kind named
    assert counted([]) == ""
    assert counted(["NotRepeatableWarning"], "run warning") == "1 run warning: not repeatable"
    assert counted(["A", "AISafetyWarning", "A"]) == "3 warnings: a (2), other"


def test_resume_never_reuses_a_unit_counted_by_older_rules(runs):
    url, ids = runs
    store = ResultStore(url)
    before = store.finished_units()
    assert before
    for run_id in ids:
        _set_version(url, run_id, semantics.CURRENT - 1)
    try:
        assert store.finished_units() == set()  # computed again, not reused
        _set_version(url, ids[0], None)  # stored before versions were kept: the same
        assert store.finished_units() == set()
    finally:
        for run_id in ids:
            _set_version(url, run_id, semantics.CURRENT)
    assert store.finished_units() == before


def test_the_table_of_changes_is_ordered_and_current():
    versions = [c.version for c in semantics.CHANGES]
    assert versions == sorted(set(versions)) and versions[0] == semantics.UNRECORDED + 1
    assert versions[-1] == semantics.CURRENT
    assert semantics.version_of(None) == semantics.UNRECORDED
    assert (
        semantics.changes_between(2, 1) == semantics.changes_between(1, 2) == [semantics.CHANGES[0]]
    )
    assert semantics.changes_between(2, 2) == []
