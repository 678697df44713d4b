"""``aisafety check``, the release gate: real runs of zoo models (100 images, PGD-10), the
statistics against scipy and a published interval, and the false-alarm rate by simulation
from stored per-sample outcomes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from scipy.stats import binomtest

from aisafety.check import shown
from aisafety.cli import main
from aisafety.report.gate.comparable import differences
from aisafety.report.gate.measures import Measure, load_gate_run
from aisafety.report.gate.spec import GateSpec
from aisafety.report.gate.verdicts import gate_passed, regression_verdicts
from aisafety.report.paired import (
    PairedTable,
    lower_bound,
    mcnemar_exact,
    newcombe_interval,
    paired_table,
)
from aisafety.store.results import ResultStore
from aisafety.store.semantics import CURRENT

PLAN = """
model: {{name: {model}}}
dataset: {{name: mnist-embedded, limit: {limit}}}
attacks:
  - name: pgd-linf
    config: {{steps: 10, random_start: true}}
    eps: [{eps}]
  - {{name: random-noise, eps: [0.3]}}
metrics:
  - ca
  - robust-accuracy
  - name: certified-accuracy
    config: {{eps: 0.01, verifier: ibp, attack_config: {{steps: 10}}}}
seed: {seed}
device: cpu
"""
REQUIRE = """
level: 0.05
requirements:
  - {kind: robust-accuracy, norm: linf, eps: 0.1, at_least: 0.45, confidence: 0.95}
  - {kind: clean-accuracy, at_least: 0.9}
  - {kind: certified-accuracy, verifier: ibp, eps: 0.01, at_least: 0.2}
  - {kind: no-sanity-warnings}
"""


def write_plan(folder, name, model="mnist-cnn", seed=0, limit=100, eps="0.1, 0.3"):
    path = folder / f"{name}.yaml"
    path.write_text(PLAN.format(model=model, seed=seed, limit=limit, eps=eps))
    return str(path)


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """A database of run 1: mnist-cnn at seed 0, run 2: mnist-cnn-pgd-at (its baseline, same
    plan), run 3: mnist-cnn at seed 1."""
    folder = tmp_path_factory.mktemp("gate")
    db = f"sqlite:///{folder / 'gate.db'}"
    (folder / "require.yaml").write_text(REQUIRE)
    out = {"folder": folder, "db": db, "plan0": write_plan(folder, "seed0")}
    out["plan1"] = write_plan(folder, "seed1", seed=1)
    args = ["check", out["plan0"], "--db", db, "--quiet", "--baseline", "mnist-cnn-pgd-at"]
    args += ["--junit", str(folder / "j.xml"), "--markdown", str(folder / "m.md")]
    out["regressed"] = main([*args, "--report", str(folder / "r.html")])
    assert main(["evaluate", out["plan1"], "--db", db, "--quiet", "--format", "json"]) == 0
    return out


def check(gate, plan, baseline, *extra):
    return main(["check", plan, "--db", gate["db"], "--quiet", "--baseline", str(baseline),
                 *extra])  # fmt: skip


def run_ids(gate) -> list[int]:
    columns, rows = ResultStore(gate["db"]).query("SELECT id FROM runs ORDER BY id")
    return [r[0] for r in rows]


# real runs --------------------------------------------------------------------------------


def test_weaker_model_fails_against_adversarially_trained_baseline(gate):
    """mnist-cnn against mnist-cnn-pgd-at: its robust and certified accuracy regress (run 1
    is the candidate, run 2 the baseline evaluated with the candidate's plan); its clean
    accuracy does not, and that test case passes."""
    assert gate["regressed"] == 1
    suite = ET.parse(gate["folder"] / "j.xml").getroot().find("testsuite")
    cases = {c.get("name"): c.find("failure") is None for c in suite.iter("testcase")}
    assert cases.items() >= {
        "no regression: robust accuracy under pgd-linf(random_start=True,steps=10) at linf 0.1":
            False,
        "no regression: robust accuracy under pgd-linf(random_start=True,steps=10) at linf 0.3":
            False,
        "no regression: clean accuracy": True,
        "no regression: certified accuracy (certified-accuracy(eps=0.01,verifier=ibp,"
        "attack=pgd-linf(steps=10)))": False,
    }.items()  # fmt: skip
    assert len(cases) == int(suite.get("tests")) == 5  # and random-noise's, either way
    assert suite.get("failures") == str(sum(not passed for passed in cases.values()))
    summary = (gate["folder"] / "m.md").read_text()
    assert summary.startswith("### ❌ aisafety check: FAIL: ")
    assert "| ❌ fail | no regression: robust accuracy under pgd-linf" in summary
    html = (gate["folder"] / "r.html").read_text()
    assert '<section id="gate"' in html and 'href="#curves"' in html and 'href="#certified"' in html


def test_same_model_at_another_seed_passes_and_requirements_are_named(gate, capsys):
    """mnist-cnn at seed 1 against its own run at seed 0 passes every regression test; the
    absolute requirements pass or fail by their bound (certified accuracy of the undefended
    model at 0.01 is 0: that one fails, named)."""
    first = run_ids(gate)[0]
    capsys.readouterr()
    assert check(gate, gate["plan1"], first) == 0
    out = capsys.readouterr().out
    assert out.count("PASS  no regression") == 5 and "FAIL" not in out
    code = check(gate, gate["plan1"], first, "--require", str(gate["folder"] / "require.yaml"))
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  certified accuracy with ibp at 0.01 >= 0.2" in out
    assert "PASS  robust accuracy at linf 0.1 >= 0.45" in out
    assert "PASS  clean accuracy >= 0.9" in out and "PASS  no sanity check warns" in out


def test_a_stored_run_of_the_same_plan_is_reused(gate, capsys):
    before = run_ids(gate)
    assert check(gate, gate["plan0"], before[0]) == 0
    assert run_ids(gate) == before
    assert f"candidate run {before[0]} (mnist-cnn, reused)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"limit": 80}, "dataset.limit: baseline 100, candidate 80"),
        ({"eps": "0.1"}, "only the baseline has: robust accuracy under pgd-linf"),
    ],
)
def test_non_comparable_runs_are_refused_naming_the_difference(gate, capsys, change, reason):
    plan = write_plan(gate["folder"], f"other-{next(iter(change))}", **change)
    assert check(gate, plan, run_ids(gate)[0]) == 2
    err = capsys.readouterr().err
    assert "are not comparable" in err and reason in err and "Traceback" not in err


def test_a_baseline_counted_by_other_rules_is_not_comparable(gate):
    """A baseline stored before keep_clean_mistakes (semantics version NULL, read as 1) and
    a candidate of today: the gate would pass or fail on the code's change."""
    store = ResultStore(gate["db"])
    first, _, third = run_ids(gate)[:3]
    old, new = load_gate_run(store, first), load_gate_run(store, third)
    old.data.semantics_version = None
    # the comparison page's and store.compare's words (store/semantics.unlike), which name
    # the change and what it moves (the line said only the change's name before session 21)
    [line] = differences(old, new)
    assert line.startswith(
        "results semantics version: baseline 1 (not recorded: stored before it was kept), "
        f"candidate {CURRENT}: the runs counted by different rules, so part of a difference is "
        "the "
        "code's, not the model's: version 2 (attack/base.keep_clean_mistakes, 2026-11-28): "
        "a clean mistake"
    )


def test_usage_errors_exit_2_with_a_message(gate, capsys, tmp_path):
    assert check(gate, gate["plan0"], "no-such-model") == 2
    assert "neither a run id nor a zoo model" in capsys.readouterr().err
    assert check(gate, gate["plan0"], 999) == 2
    assert "run 999 is not in the database" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("requirements:\n  - {kind: robust-accuracy, eps: 8/2x55, at_least: 2}\n")
    assert check(gate, gate["plan0"], 1, "--require", str(bad)) == 2
    err = capsys.readouterr().err
    assert "at_least: Input should be less than or equal to 1" in err and "8/2x55" in err
    unmeasured = tmp_path / "l2.toml"
    unmeasured.write_text('[[requirements]]\nkind = "robust-accuracy"\nnorm = "l2"\n'
                          'eps = 0.5\nat_least = 0.5\n')  # fmt: skip
    assert check(gate, gate["plan0"], 1, "--require", str(unmeasured)) == 2
    assert "has no such measurement" in capsys.readouterr().err
    assert check(gate, gate["plan0"], 1, "--level", "0") == 2
    assert "level: Input should be greater than 0" in capsys.readouterr().err
    assert main(["check", gate["plan0"], "--db", gate["db"], "--quiet"]) == 2
    assert "--baseline RUN_ID_OR_MODEL is needed" in capsys.readouterr().err
    clean_only = tmp_path / "clean.yaml"
    clean_only.write_text("dataset: {name: mnist-embedded, limit: 20}\nmetrics: [ca]\n")
    assert check(gate, str(clean_only), "mnist-cnn") == 2
    assert "nothing to check: run" in capsys.readouterr().err


def test_a_baseline_id_is_checked_before_the_candidate_can_take_it(tmp_path, capsys):
    """--baseline 1 on a database without run 1: before session 21 the candidate was
    evaluated first, stored as run 1 and passed as its own baseline (exit 0)."""
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    plan = write_plan(tmp_path, "p")
    assert main(["check", plan, "--db", db, "--quiet", "--baseline", "1"]) == 2
    err = capsys.readouterr().err
    assert "run 1 is not in the database" in err
    assert f"SELECT id, status FROM runs' --db {db}" in err  # the query to run names the --db
    assert ResultStore(db).query("SELECT id FROM runs")[1] == []  # nothing evaluated


def test_requirements_alone_need_no_baseline(gate, capsys, tmp_path):
    only = tmp_path / "only.yaml"
    only.write_text("regression: false\nrequirements: [{kind: clean-accuracy, at_least: 0.9}]\n")
    args = ["check", gate["plan0"], "--db", gate["db"], "--quiet", "--require", str(only)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "PASS  clean accuracy >= 0.9" in out and "no regression" not in out
    assert shown("postgresql://gate:secret@db/results") == "postgresql://gate:***@db/results"


def test_false_alarm_rate_over_simulated_seed_pairs_is_at_most_the_level(gate):
    """Seed pairs of the same model, drawn from the stored per-sample outcomes: each sample
    of each measure is right with the probability the two stored seeds give it (the real
    seed-to-seed noise), and, as a stress case with many discordant pairs, with the
    measure's accuracy for every sample. The gate (5 tests, level 0.05) may fail at most
    level of them; 2,000 pairs, so 3 standard errors of slack. Measured: the two stored
    seeds disagree on 4 samples, all under random-noise (PGD-10's random start changes no
    outcome here), so the first case draws ~2 discordant pairs per gate and 0 alarms; the
    stress case draws ~83 and fails 2.25% of the pairs."""
    store = ResultStore(gate["db"])
    first, _, third = run_ids(gate)[:3]  # seed 0, the baseline model, seed 1
    runs = [load_gate_run(store, i).measures for i in (first, third)]
    assert not differences(load_gate_run(store, first), load_gate_run(store, third))
    spec, pairs, rng = GateSpec(level=0.05), 2000, np.random.default_rng(0)
    slack = 3 * np.sqrt(spec.level * (1 - spec.level) / pairs)
    per_sample = {
        k: np.mean([[m[k].correct[i] for i in sorted(m[k].correct)] for m in runs], axis=0)
        for k in runs[0]
    }
    stress = {k: np.full_like(p, np.clip(p.mean(), 0.05, 0.95)) for k, p in per_sample.items()}
    for probabilities in (per_sample, stress):
        alarms = discordant = 0
        for _ in range(pairs):
            a, b = (draw(probabilities, rng) for _ in range(2))
            alarms += not gate_passed(regression_verdicts(a, b, spec))
            discordant += sum(x.correct[i] != b[k].correct[i] for k, x in a.items()
                              for i in x.correct)  # fmt: skip
        assert alarms / pairs <= spec.level + slack
    assert discordant / pairs > 40  # the stress case is one: ~40% of 400 pairs discordant


def draw(probabilities: dict, rng) -> dict[tuple, Measure]:
    return {
        k: Measure(k, str(k), dict(enumerate((rng.random(len(p)) < p).tolist())))
        for k, p in probabilities.items()
    }


# statistics -------------------------------------------------------------------------------


def test_mcnemar_p_values_equal_scipy_binomtest():
    """Every table with up to 40 discordant pairs, one-sided and two-sided."""
    for lost in range(41):
        for gained in range(41 - lost):
            m = lost + gained
            if m == 0:
                assert mcnemar_exact(0, 0) == 1.0
                continue
            worse = binomtest(lost, m, 0.5, alternative="greater").pvalue
            both = binomtest(lost, m, 0.5).pvalue
            assert mcnemar_exact(lost, gained) == pytest.approx(worse, rel=1e-12, abs=1e-300)
            assert mcnemar_exact(lost, gained, "two-sided") == pytest.approx(both, rel=1e-9)


def test_newcombe_interval_matches_the_published_one():
    """Cavo et al. 2012 (Fagerland, Lydersen & Laake 2017, ch. 8; R contingencytables'
    Newcombe_square_and_add_CI_paired_2x2): 59/6/16/80, -0.0621 (95% CI -0.1186 to -0.0046).
    Swapping the runs negates the interval; the point estimate lies inside it."""
    table = PairedTable(both=59, improvements=6, regressions=16, neither=80)
    low, high = newcombe_interval(table, 0.95)
    assert (round(table.difference, 4), round(low, 4), round(high, 4)) == (-0.0621, -0.1186,
                                                                            -0.0046)  # fmt: skip
    swapped = PairedTable(both=59, improvements=16, regressions=6, neither=80)
    assert newcombe_interval(swapped, 0.95) == pytest.approx((-high, -low))
    assert paired_table([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == PairedTable(2, 1, 1, 1)


def test_lower_bound_is_scipy_clopper_pearson_one_sided():
    for k, n, confidence in [(45, 100, 0.95), (0, 10, 0.95), (10, 10, 0.99), (7, 30, 0.9)]:
        two_sided = binomtest(k, n).proportion_ci(2 * confidence - 1, "exact").low
        assert lower_bound(k, n, confidence) == pytest.approx(two_sided, abs=1e-12)


def test_min_effect_tolerates_a_significant_but_small_drop():
    """8 of 400 samples lost, none gained: p = 2^-8, significant; a 2-point drop is below a
    5-point minimum effect, so that gate passes."""
    base = {("clean",): Measure(("clean",), "clean accuracy", dict.fromkeys(range(400), True))}
    cand = {("clean",): Measure(("clean",), "clean accuracy",
                                {i: i >= 8 for i in range(400)})}  # fmt: skip
    strict = regression_verdicts(base, cand, GateSpec(level=0.05))
    assert not strict[0].passed and strict[0].numbers["p"] == 2.0**-8
    assert regression_verdicts(base, cand, GateSpec(level=0.05, min_effect=0.05))[0].passed
