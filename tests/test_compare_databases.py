"""The database comparison (aisafety.store.compare) passes two runs of one plan and
reports a value changed by one bit."""

from __future__ import annotations

import math
import sqlite3

import pytest

from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.runner import Runner
from aisafety.store.compare import compare, exact, main
from aisafety.store.results import ResultStore

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
