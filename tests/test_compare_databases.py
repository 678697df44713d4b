"""The database comparison (aisafety.store.compare) passes two runs of one plan and
reports a value changed by one bit."""

from __future__ import annotations

import math
import sqlite3

import pytest

from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.runner import Runner
from aisafety.store.compare import NotLikeForLike, compare, exact, main, versions
from aisafety.store.results import ResultStore
from aisafety.store.semantics import CURRENT

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=20),
    attacks=(AttackSpec(name="fgsm", eps=(0.1, 0.3)),),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "aaw", "acac")),
    device="cpu",
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    paths = [folder / "before.db", folder / "after.db"]
    for path in paths:
        Runner(PLAN, ResultStore(f"sqlite:///{path}"), quiet=True).run()
    return paths


def _url(path) -> str:
    return f"sqlite:///{path}"


def test_two_runs_of_one_plan_are_identical(two_runs, capsys):
    counts, differences = compare(*map(_url, two_runs))
    assert differences == []
    assert counts == {"metric_values": 5, "attack_runs": 2, "sample_outcomes": 40}
    assert main([_url(p) for p in two_runs]) == 0
    assert "identical: 5 metric_values" in capsys.readouterr().out


def test_a_value_changed_in_its_last_bit_is_reported(two_runs, tmp_path, capsys):
    changed = tmp_path / "changed.db"
    changed.write_bytes(two_runs[1].read_bytes())
    with sqlite3.connect(changed) as db:
        (old,) = db.execute("SELECT value FROM metric_values WHERE metric = 'ca'").fetchone()
        db.execute(
            "UPDATE metric_values SET value = ? WHERE metric = 'ca'",
            (math.nextafter(old, math.inf),),
        )
        db.execute("UPDATE sample_outcomes SET adv_pred = 9 - adv_pred WHERE sample_index = 3")
    _, differences = compare(_url(two_runs[0]), _url(changed))
    tables = sorted(d.table for d in differences)
    assert tables == ["metric_values", "sample_outcomes", "sample_outcomes"]
    [ca] = [d for d in differences if d.table == "metric_values"]
    assert "ca" in ca.key and ca.before[0] == old and ca.after[0] == math.nextafter(old, math.inf)
    assert main([_url(two_runs[0]), _url(changed)]) == 1
    out = capsys.readouterr().out
    assert "3 difference(s)" in out and "metric_values [mnist-cnn" in out


def test_a_missing_row_is_reported(two_runs, tmp_path):
    fewer = tmp_path / "fewer.db"
    fewer.write_bytes(two_runs[1].read_bytes())
    with sqlite3.connect(fewer) as db:
        db.execute("DELETE FROM metric_values WHERE metric = 'acac' AND eps = 0.3")
    _, differences = compare(_url(two_runs[0]), _url(fewer), ["metric_values"])
    [missing] = differences
    assert missing.after is None and "acac" in missing.key


def test_exact_tells_apart_only_different_bits():
    assert exact(0.1 + 0.2) != exact(0.3)
    assert exact(float("nan")) == exact(float("nan"))
    assert exact(-0.0) != exact(0.0)
    assert exact({"b": 1.0, "a": 2}) == exact('{"a": 2, "b": 1.0}')


def test_details_are_compared_unless_left_out(two_runs, tmp_path):
    extra = tmp_path / "extra.db"
    extra.write_bytes(two_runs[1].read_bytes())
    with sqlite3.connect(extra) as db:
        db.execute("""UPDATE metric_values SET details = '{"new": 1}' WHERE metric = 'ca'""")
    [changed] = compare(_url(two_runs[0]), _url(extra))[1]
    assert "ca" in changed.key
    assert compare(_url(two_runs[0]), _url(extra), details=False)[1] == []


def test_plain_file_paths_are_accepted_and_a_missing_file_is_a_clear_error(
    two_runs, tmp_path, capsys
):
    assert main([str(p) for p in two_runs]) == 0
    assert "identical" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([str(two_runs[0]), str(tmp_path / "mistyped.db")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "no database file" in error and "mistyped.db" in error
    assert not (tmp_path / "mistyped.db").exists()  # nothing created on the way
    with pytest.raises(SystemExit):  # as a URL too (before session 21 it made an empty file)
        main([str(two_runs[0]), f"sqlite:///{tmp_path / 'mistyped.db'}"])
    assert "no database file" in capsys.readouterr().err
    assert not (tmp_path / "mistyped.db").exists()


def _set_versions(path, version) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET semantics_version = ?", (version,))


def test_runs_counted_by_other_rules_are_refused_unless_asked(two_runs, tmp_path, capsys):
    """A database stored before versions were kept (NULL: version 1) against one of today's
    (2): the numbers were counted by other rules (keep_clean_mistakes), so the comparison is
    refused in the comparison page's and the gate's words; --across-versions flags it."""
    old = tmp_path / "old.db"
    old.write_bytes(two_runs[0].read_bytes())
    _set_versions(old, None)
    with pytest.raises(NotLikeForLike) as refused:
        compare(_url(old), _url(two_runs[1]))
    line = (
        "results semantics version: before 1 (not recorded: stored before it was kept), "
        f"after {CURRENT}: the runs counted by different rules, so part of a difference is the "
        "code's, "
        "not the model's: version 2 (attack/base.keep_clean_mistakes, 2026-11-28)"
    )
    assert str(refused.value).startswith(line) and "--across-versions" in str(refused.value)
    assert main([str(old), str(two_runs[1])]) == 2
    captured = capsys.readouterr()
    assert line in captured.err and captured.out == "" and "Traceback" not in captured.err
    assert compare(_url(old), _url(two_runs[1]), across_versions=True)[1] == []
    assert main([str(old), str(two_runs[1]), "--across-versions"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"not like for like: {line}") and "(not like for like" in out


def test_the_versions_are_shown_and_an_old_database_reads_as_unrecorded(two_runs, tmp_path, capsys):
    assert main([str(p) for p in two_runs]) == 0
    shown = f"; results semantics version before {CURRENT}, after {CURRENT}"  # today's runs
    assert shown in capsys.readouterr().out
    older = tmp_path / "older.db"  # a database of revision 0004: no semantics_version column
    older.write_bytes(two_runs[0].read_bytes())
    with sqlite3.connect(older) as db:
        db.execute("ALTER TABLE runs DROP COLUMN semantics_version")
    assert versions(_url(older)) == {None}  # read as 1, never migrated on the way
    assert main([str(older), str(two_runs[1])]) == 2
    assert "before 1 (not recorded" in capsys.readouterr().err
    assert versions(_url(two_runs[0]), ["sample_outcomes"]) == {CURRENT}


def test_a_database_without_results_is_a_clear_error(two_runs, tmp_path, capsys):
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert main([str(two_runs[0]), str(empty)]) == 2
    error = capsys.readouterr().err
    assert "holds no aisafety results (no runs table)" in error and "empty.db" in error
