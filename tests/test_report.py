"""The HTML report and comparison page, built from a stored run; report sections as plugins."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import children
import numpy as np
import pytest
from scipy.stats import binomtest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aisafety.cli import main
from aisafety.plugins import build_registry
from aisafety.report.data import load_run
from aisafety.report.intervals import clopper_pearson
from aisafety.report.sections import ReportSection
from aisafety.report_catalog import default_catalog, registry_catalog
from aisafety.report_page import build_comparison, build_report
from aisafety.store import schema
from aisafety.store.results import EXAMPLES_PER_RUN, ResultStore


def test_run_stores_examples_and_its_machine(report_db):
    url, run_id = report_db
    store = ResultStore(url)
    data = load_run(store, run_id)
    assert data.environment is not None and data.environment["cpu_count"] >= 1
    assert data.wall_seconds is not None and data.wall_seconds > 0
    for run in data.attack_runs:
        examples = data.examples[run.id]
        assert len(examples) == EXAMPLES_PER_RUN
        for e in examples:  # the stored adversarial input is the attack's, within its budget
            assert e.clean.shape == (1, 28, 28)
            assert np.abs(e.adversarial - e.clean).max() <= run.eps + 1e-3
        broken = ~data.correct(run.id)
        # examples are the broken samples first
        shown = [e.sample_index for e in examples]
        assert all(broken[i] for i in shown[: min(int(broken.sum()), EXAMPLES_PER_RUN)])


def test_report_has_every_section_and_interval(report_db):
    url, run_id = report_db
    html = build_report(ResultStore(url), run_id)
    for section in ("provenance", "models", "sanity", "metrics", "curves", "corruptions",
                    "certified", "frontier", "examples"):  # fmt: skip
        assert f'id="{section}"' in html, section
    assert "http://" not in html and "https://" not in html  # self-contained
    plots = html.count('<img class="plot" src="data:image/png;base64,')
    assert plots == int(re.search(r'data-plots="(\d+)"', html).group(1))
    # 1 curve (l-inf) + 1 corruption heatmap + 1 certified curve + 1 frontier + 2 examples
    # (fgsm, pgd-linf; random noise has none)
    assert plots == 6
    assert "corruption error: 3 x 3 cells" in html  # 3 corruptions x 3 severities
    data = load_run(ResultStore(url), run_id)
    ca = next(m for m in data.metrics if m.metric == "ca")
    low, high = clopper_pearson(round(ca.value * ca.n_samples), ca.n_samples)
    assert f"[{low:.4f}, {high:.4f}]" in html
    radius = next(m for m in data.metrics if m.name == "average-certified-radius")
    assert len(data.radii[radius.id]) == radius.n_samples  # per-sample radii, read back
    assert "per-sample radii" in html
    ci = binomtest(round(ca.value * ca.n_samples), ca.n_samples).proportion_ci(method="exact")
    assert ca.ci == pytest.approx((ci.low, ci.high), abs=1e-12)  # stored with the value
    assert all((m.ci is not None) == (m.unit == "fraction") for m in data.metrics)
    fingerprint = data.models[0]["fingerprint"]
    assert fingerprint in html and "mnist-embedded" in html


def test_cli_report_latest_and_errors(report_db, tmp_path, capsys):
    url, run_id = report_db
    out = tmp_path / "nested" / "report.html"
    assert main(["report", "--latest", "--db", url, "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"run {run_id}" in printed.out and "not finished" not in printed.err
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "999", "--db", url, "-o", str(out)]) == 2
    assert "run 999 is not in" in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    assert main(["report", "--db", missing, "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()  # reporting never creates a database
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    ResultStore(empty)
    assert main(["report", "--db", empty, "-o", str(out)]) == 2
    assert "holds no runs yet" in capsys.readouterr().err
    assert main(["report", "--compare", "no-such-model", "--db", url, "-o", str(out)]) == 2
    assert "neither a run id nor a model" in capsys.readouterr().err


def test_an_unfinished_run_says_so_at_the_top_and_on_stderr(report_db, tmp_path, capsys):
    """A shared database's latest run may be someone's still running (or one killed): its
    report holds only the units stored so far. Before session 21 only the provenance table,
    at the page's end, said so, and a comparison only when the runs' statuses differed."""
    url, run_id = report_db
    copy = tmp_path / "copy.db"
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    store = ResultStore(f"sqlite:///{copy}")
    with Session(store.engine) as session, session.begin():
        session.get(schema.Run, run_id).status = "interrupted"
    note = f"run {run_id} interrupted, not finished: the numbers cover only the units stored"
    out = tmp_path / "r.html"
    assert main(["report", str(run_id), "--db", f"sqlite:///{copy}", "-o", str(out)]) == 0
    assert f"warning: {note}" in capsys.readouterr().err
    assert note in re.search(r"<header>(.*?)</header>", out.read_text()).group(1)
    assert note in re.search(r"<header>(.*?)</header>", build_comparison(store, [run_id])).group(1)
    store.engine.dispose()


@pytest.mark.parametrize(
    "where, reason",
    [("folder", "it is a folder"), ("under-a-file", "plain' is a file, not a folder")],
)
def test_an_output_path_that_cannot_be_written_is_one_error_not_a_traceback(
    report_db, tmp_path, capsys, where, reason
):
    """``-o`` naming a folder raised IsADirectoryError, and a path under a file
    FileExistsError, both as tracebacks after the report was built."""
    (tmp_path / "plain").write_text("")
    out = tmp_path if where == "folder" else tmp_path / "plain" / "report.html"
    assert main(["report", "--db", report_db[0], "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot write -o {str(out)!r}: " in err and reason in err


def test_comparison_ranks_models_and_marks_the_best(report_db, tmp_path):
    url, run_id = report_db
    store = ResultStore(url)
    html = build_comparison(store, [run_id, run_id])
    assert 'id="leaderboard"' in html and 'class="num best"' in html
    assert html.count('<img class="plot"') >= 3  # fgsm, pgd, noise, worst case
    out = tmp_path / "cmp.html"
    assert main(["report", "--compare", "mnist-cnn", "--db", url, "-o", str(out)]) == 0
    assert "mnist-cnn" in out.read_text()


def test_reading_a_stored_run_imports_no_torch(report_db, tmp_path):
    """`aisafety report` (one run, and --compare) reads the database and the built-ins'
    shipped listing: torch and the plugins are not imported (3.3 of its 4.5 s of imports on
    a loaded machine before session 19; a machine that only reports may not have torch)."""
    from aisafety import listing_cache

    if not listing_cache.only_builtins():
        pytest.skip("a plugin or an extra zoo is installed: the report loads the plugins")
    url, run_id = report_db
    code = (
        "import json, sys\n"
        "from aisafety.cli import main\n"
        "run, db, out = sys.argv[1:]\n"
        "rcs = [main(['report', run, '--db', db, '-o', out]),\n"
        "       main(['report', '--compare', run, '--db', db, '-o', out])]\n"
        "heavy = ('torch', 'aisafety.plugins', 'aisafety.builtin')\n"
        "print(json.dumps([rcs, [m for m in heavy if m in sys.modules]]))"
    )
    out = str(tmp_path / "report.html")
    done = children.run([sys.executable, "-c", code, str(run_id), url, out],
                        capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[0, 0], []]


def test_the_report_without_the_registry_is_the_report_with_it(report_db):
    """The shipped listing and built-in sections give the page the registry gives: every
    glossary entry, category, coverage unit, section and sanity check alike."""
    from aisafety.plugins import default_registry

    url, run_id = report_db
    store = ResultStore(url)
    registry = default_registry()
    assert build_report(store, run_id) == build_report(store, run_id, registry)
    assert build_comparison(store, [run_id]) == build_comparison(store, [run_id], registry)
    catalog, live = default_catalog(), registry_catalog(registry)
    assert catalog.metrics == live.metrics
    assert sorted(c.name for c in catalog.sections) == sorted(c.name for c in live.sections)
    for name, defaults in live.attacks.items():  # the listing's are JSON (tuples as lists)
        assert catalog.attack_defaults(name) == json.loads(json.dumps(defaults, default=str))


def test_leaderboard_marks_models_with_sanity_warnings(report_db):
    from aisafety.report_page import leaderboard
    from aisafety.sanity import Check

    url, run_id = report_db
    data = load_run(ResultStore(url), run_id)
    warned = [Check("c", "mnist-cnn", "warn", "d"), Check("c", "mnist-cnn", "pass", "d")]
    catalog = registry_catalog(build_registry())
    families = leaderboard([data], catalog, warned)
    assert families and all(row["warnings"] == 1 for f in families for row in f["rows"])
    assert all(row["warnings"] == 0 for f in leaderboard([data], catalog) for row in f["rows"])


def test_seeds_show_mean_and_std():
    from aisafety.report_page import _cell, _ranks

    assert _cell([0.5]) == "0.5"
    assert _cell([0.5, 0.7, 0.6]) == "0.6 ± 0.1"
    assert _ranks({"a": 0.9, "b": 0.5, "c": 0.9}, "higher") == {"a": 1, "b": 3, "c": 1}
    assert _ranks({"a": 0.9, "b": 0.5}, "lower") == {"a": 2, "b": 1}


class ThirdPartySection(ReportSection):
    name, title, order = "third-party", "A third-party section", 15

    def render(self, report):
        return report.template("plots.html.j2", plots=[], note=f"runs: {report.data.run_id}")


class BrokenSection(ReportSection):
    name, title, order = "broken", "A broken section", 16

    def render(self, report):
        raise RuntimeError("boom")


class SectionPlugin:
    @staticmethod
    def aisafety_report_sections():
        return [ThirdPartySection, BrokenSection]


def test_a_plugin_adds_a_report_section(report_db):
    from aisafety.hookspecs import hookimpl

    SectionPlugin.aisafety_report_sections = staticmethod(
        hookimpl(SectionPlugin.aisafety_report_sections)
    )
    registry = build_registry([("section-plugin", SectionPlugin)])
    assert not registry.failures
    url, run_id = report_db
    html = build_report(ResultStore(url), run_id, registry)
    assert 'id="third-party"' in html and f"runs: {run_id}" in html
    # placed by its order: after the model cards (10), before the sanity checks (20)
    assert html.index('id="models"') < html.index('id="third-party"') < html.index('id="sanity"')
    assert "this section failed: RuntimeError: boom" in html


def test_old_database_without_new_tables_still_reports(report_db, tmp_path):
    url, run_id = report_db
    copy = tmp_path / "old.db"  # the session's database stays as it is for the other tests
    for suffix in ("", "-wal"):  # SQLite in WAL mode keeps recent rows beside the file
        source = url.removeprefix("sqlite:///") + suffix
        if Path(source).exists():
            shutil.copy(source, f"{copy}{suffix}")
    store = ResultStore(f"sqlite:///{copy}")
    with Session(store.engine) as session, session.begin():
        session.query(schema.ExampleImage).delete()
        session.query(schema.RunEnvironment).delete()
    html = build_report(store, run_id)
    assert "not recorded (the run predates it)" in html
    assert 'id="examples"' not in html
    with Session(store.engine) as session:
        assert session.scalar(select(func.count()).select_from(schema.AttackRun)) > 0


def test_corruption_runs_stored_as_attacks_by_older_versions_are_read_around(report_db, tmp_path):
    """Before corruptions left attacks:, a run could store a corruption as an attack run
    (no budget); the report, the sanity checks and the gate read around such rows."""
    url, run_id = report_db
    copy = tmp_path / "legacy.db"
    for suffix in ("", "-wal"):
        source = url.removeprefix("sqlite:///") + suffix
        if Path(source).exists():
            shutil.copy(source, f"{copy}{suffix}")
    store = ResultStore(f"sqlite:///{copy}")
    before, html = load_run(store, run_id).attack_runs, build_report(store, run_id)
    with Session(store.engine) as session, session.begin():
        first = session.scalars(select(schema.AttackRun).where(schema.AttackRun.run_id == run_id))
        row = next(iter(first))
        session.add(
            schema.AttackRun(
                run_id=run_id, unit_key=row.unit_key, model_id=row.model_id,
                dataset_id=row.dataset_id, attack="fog", family="corruption", norm=None,
                eps=0.0, config={"severity": 3}, n_samples=row.n_samples, success_rate=0.5,
                robust_accuracy=0.5, seconds=0.0,
            )
        )  # fmt: skip
    after = load_run(store, run_id).attack_runs
    assert [a.id for a in after] == [a.id for a in before]
    assert build_report(store, run_id).count("fog") == html.count("fog")


def test_seeds_give_one_run_each_and_mean_std(tmp_path, capsys):
    import statistics

    import yaml

    plan = tmp_path / "seeds.yaml"
    plan.write_text(
        yaml.safe_dump({
            "dataset": {"name": "mnist-embedded", "limit": 40},
            "attacks": [{"name": "pgd-linf", "config": {"steps": 3}, "eps": [0.1]}],
            "metrics": ["ca", "robust-accuracy"],
            "seeds": [0, 1, 2],
        })
    )  # fmt: skip
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"report over the seeds: aisafety report --compare 1 2 3 --db {db}" in out  # its --db
    store = ResultStore(db)
    runs = [load_run(store, i) for i in (1, 2, 3)]
    assert [r.seed for r in runs] == [0, 1, 2]
    robust = [next(m.value for m in r.metrics if m.metric == "robust-accuracy") for r in runs]
    row = next(line for line in out.splitlines() if line.startswith("robust-accuracy"))
    assert f"{statistics.fmean(robust):.4g}" in row
    out_file = tmp_path / "seeds.html"
    assert main(["report", "--compare", "1", "2", "3", "--db", db, "-o", str(out_file)]) == 0
    html = out_file.read_text()
    assert f"{statistics.fmean(robust):.4g} ± {statistics.stdev(robust):.2g}" in html
    assert 'id="comparability"' not in html  # runs of one plan at other seeds: like for like
    with pytest.raises(Exception, match="distinct"):
        from aisafety.config import plan_from_dict

        plan_from_dict({"seeds": [1, 1]})


VERDICT = re.compile(
    r"Verdict: (?P<acc>\d+\.\d)% robust accuracy \[(?P<lo>\d+\.\d), (?P<hi>\d+\.\d)\] "
    r"\(95% CI, n=(?P<n>\d+)\) at (?P<norm>\w+) eps (?P<eps>[\d.]+), the worst case over "
    r"(?P<attacks>\d+) attack\(s\); (all \d+ sanity checks pass|worst sanity check: "
    r"(warn|skip), [^<]+)\."
)


def test_report_expands_every_metric_and_gives_one_verdict_per_model(report_db):
    """For a reader who did not write the plan: each metric name in the table is an
    abbreviation with its expansion, linked to a glossary entry; one verdict line per
    model, its robust accuracy recomputed here from the stored per-sample outcomes."""
    url, run_id = report_db
    html = build_report(ResultStore(url), run_id)
    data = load_run(ResultStore(url), run_id)
    glossary = dict(re.findall(r'<dt id="glossary-([^"]+)">.*?</dt><dd>(.*?)</dd>', html))
    assert set(glossary) == {m.name for m in data.metrics}
    assert all(text and "docs/metrics.md" in text for text in glossary.values())
    table = html[html.index('id="metrics"') : html.index('id="glossary"')]
    cells = re.findall(r"<tr><td>[^<]*</td><td>(.*?)</td>", table)
    assert len(cells) == len(data.metrics)
    for cell in cells:
        link = re.fullmatch(r'<a class="metric" href="#glossary-([^"]+)"><abbr class="metric" '
                            r'title="([^"]+)">([^<]+)</abbr></a>', cell)  # fmt: skip
        assert link and link.group(1) in glossary and link.group(3).startswith(link.group(1))
    lines = re.findall(r'<p class="verdict">(.*?)</p>', html)
    verdicts = [VERDICT.fullmatch(re.sub(r"<[^>]+>", "", line)) for line in lines]
    assert len(verdicts) == len(data.models) == 1 and verdicts[0], html[:2000]
    v = verdicts[0]
    runs = [a for a in data.attack_runs if a.eps == float(v["eps"])]
    robust = np.logical_and.reduce([data.correct(a.id) for a in runs])
    assert int(v["attacks"]) == len(runs) and int(v["n"]) == len(robust)
    assert float(v["acc"]) == pytest.approx(100 * robust.mean(), abs=0.05)
    ci = binomtest(int(robust.sum()), len(robust)).proportion_ci(method="exact")
    assert (float(v["lo"]), float(v["hi"])) == pytest.approx((100 * ci.low, 100 * ci.high),
                                                             abs=0.05)  # fmt: skip
    assert "not run" not in html.split('id="models"')[1].split("</section>")[0]


def test_the_plan_is_shown_as_written_with_defaults_folded_away():
    from aisafety.config import plan_from_dict
    from aisafety.report.plan_view import fold_defaults

    written = {"attacks": [{"name": "fgsm", "eps": [0.1, 0.3]},
                           {"name": "pgd-linf", "config": {"steps": 10}}],
               "metrics": ["ca", {"name": "ald", "config": {"p": "inf"}}],
               "batch_size": 64}  # fmt: skip
    stored = plan_from_dict(written).model_dump(mode="json")  # what the database holds
    assert "corruptions" in stored and "limits" in stored
    assert fold_defaults(stored) == {
        "model": {"name": "mnist-cnn"},
        "dataset": {"name": "mnist-embedded"},
        "attacks": [{"name": "fgsm", "eps": [0.1, 0.3]},
                    {"name": "pgd-linf", "config": {"steps": 10}, "eps": [0.1]}],
        "metrics": [{"name": "ca"}, {"name": "ald", "config": {"p": "inf"}}],
        "batch_size": 64,
    }  # fmt: skip


def test_coverage_metrics_get_no_binomial_interval(report_db):
    """kmncov / tkncov are shares of neurons (or their sections), not of images: an interval
    over the n images does not describe them; accuracy keeps its interval."""
    import dataclasses

    from aisafety.plugins import default_registry
    from aisafety.report.sections import MetricTable
    from aisafety.report_page import Report, coverage_metrics

    url, run_id = report_db
    data = load_run(ResultStore(url), run_id)
    ca = next(m for m in data.metrics if m.metric == "ca")
    data.metrics = [ca, dataclasses.replace(ca, metric="kmncov", value=0.25, ci=(0.2, 0.3))]
    report = Report(data, [])
    catalog = registry_catalog(default_registry())
    report.not_rates = coverage_metrics(["ca", "kmncov", "tkncov"], catalog)
    assert coverage_metrics(["ca", "kmncov", "tkncov"], default_catalog()) == {"kmncov", "tkncov"}
    assert report.not_rates == {"kmncov", "tkncov"}
    rows = re.findall(r"<tr><td>.*?</tr>", str(MetricTable().render(report)), re.S)
    assert "[0.2000, 0.3000]" not in rows[1] and re.search(r"\[0\.\d{4}, 0\.\d{4}\]", rows[0])


def test_coinciding_lines_stay_visible():
    """Two attacks with the same robust accuracies (PGD equal to the worst case, issue 36):
    both lines' colours are on the plot, the later one drawn inside the earlier one."""
    import base64
    import io

    from PIL import Image

    from aisafety.report.plots import Series, line_plot

    same = ([0.1, 0.2, 0.3], [0.8, 0.4, 0.1])
    plot = line_plot("t", [Series("pgd", *same), Series("worst case", *same)], "eps", "acc")
    image = Image.open(io.BytesIO(base64.b64decode(plot.uri.split(",", 1)[1]))).convert("RGB")
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    # matplotlib's C0 and C1; the legend's swatch alone is ~70 pixels (C0's whole count when
    # both lines were drawn alike), the lines add hundreds more
    for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        near = np.abs(pixels - np.array(colour)).sum(1) < 40
        assert near.sum() > 300, (colour, int(near.sum()))
