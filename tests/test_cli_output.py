"""What the command line prints where: data on stdout (valid CSV/JSON when redirected),
progress, headers and warnings on stderr."""

from __future__ import annotations

import csv
import io
import json
import sys
import types
import warnings

import pytest

from aisafety.cli import main

PLAN = (
    "dataset: {name: mnist-embedded, limit: 20}\n"
    "attacks: [{name: fgsm, eps: [0.1, 0.3]}]\n"
    "metrics: [ca, aaw, robust-accuracy]\n"
)


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    return path


def test_evaluate_json_stdout_is_only_json(tmp_path, plan, capsys):
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 "--format", "json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert {(r["metric"], r["attack"], r["eps"]) for r in rows} >= {
        ("ca", "", None), ("aaw", "fgsm", 0.1), ("robust-accuracy", "fgsm", 0.3)
    }  # fmt: skip
    assert "model mnist-cnn on mnist-embedded" in captured.err  # the header: on stderr
    assert "[3/3] fgsm eps=0.3" in captured.err  # progress: on stderr


def test_evaluate_csv_stdout_is_only_csv_also_when_resumed(tmp_path, plan, capsys):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(plan), "--db", db, "--format", "csv", "--resume"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.reader(io.StringIO(captured.out)))
    assert rows[0] == ["metric", "attack", "eps", "value", "ci95_low", "ci95_high", "better", "n"]
    assert len(rows) == 1 + 5 and all(len(r) == 8 for r in rows)
    assert "taken from the database" in captured.err


def test_evaluate_seeds_json_stdout_is_only_json(tmp_path, plan, capsys):
    plan.write_text(PLAN + "seeds: [0, 1]\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 "--format", "json", "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert json.loads(captured.out) and "seeds [0, 1]" in captured.err


def test_compare_json_is_one_object_and_csv_one_table(tmp_path, plan, capsys):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    models = ["--models", "mnist-cnn", "mnist-cnn-pgd-at"]
    assert main(["compare", str(plan), *models, "--db", db, "--format", "json", "--quiet"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert [row["model"] for row in document["models"]] == ["mnist-cnn", "mnist-cnn-pgd-at"]
    # two models: no rank correlation is defined, so no table of nan; stderr says why
    assert "rank_correlations" not in document
    assert "rank correlations: none" in captured.err
    assert main(["compare", str(plan), *models, "--db", db, "--format", "csv", "--resume",
                 "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    rows = list(csv.reader(io.StringIO(captured.out)))
    assert rows[0][0] == "model" and [r[0] for r in rows[1:]] == models[1:]
    assert "rank correlations: none" in captured.err


def test_plugins_wraps_what_the_builtins_provide(capsys):
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    names = {n.strip(",;") for line in lines[2:] for n in line.split()}
    assert {"fgsm", "pgd-linf", "square-linf", "jpeg", "ca", "mnist-embedded"} <= names


def test_relative_paths_in_a_plan_file_are_relative_to_the_file(tmp_path, monkeypatch):
    from aisafety.config import load_plan

    folder = tmp_path / "plans"
    folder.mkdir()
    plan = folder / "plan.yaml"
    plan.write_text(
        "model: {name: net, source: torchscript, path: models/net.pt, input_shape: [1, 28, 28]}\n"
        "dataset: {name: npz, path: ../data/test.npz}\n"
        f"reference_model: {{name: ref, source: onnx, path: {tmp_path / 'abs.onnx'}}}\n"
    )
    monkeypatch.chdir(tmp_path)  # any working directory: the same files
    loaded = load_plan("plans/plan.yaml")
    assert loaded.model.path == folder / "models" / "net.pt"
    assert loaded.dataset.path == folder / ".." / "data" / "test.npz"
    assert loaded.reference_model.path == tmp_path / "abs.onnx"


@pytest.mark.parametrize(
    "command", [["compare", "--models", "mnist-cnn", "mnist-cnn-pgd-at"],
                ["check", "--baseline", "mnist-cnn-pgd-at"]],
)  # fmt: skip
def test_compare_and_check_print_a_failed_plugin_once_as_evaluate_does(
    command, tmp_path, monkeypatch, capsys
):
    """One line per failed plugin, the text evaluate prints: before, each run printed it
    again (compare: N + 1 lines for N models; check: 4 with a baseline evaluated); every run
    still stores it."""
    from aisafety.errors import PluginLoadWarning
    from aisafety.hookspecs import hookimpl
    from aisafety.plugins import build_registry, failure_warnings
    from aisafety.store.results import ResultStore

    def broken():
        raise RuntimeError("cannot import its weights")

    module = types.ModuleType("broken_plugin")
    module.aisafety_attacks = hookimpl(broken)
    registry = build_registry(extra_plugins=[("broken", module)])
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    monkeypatch.setattr("aisafety.runner.default_registry", lambda: registry)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("metrics: [ca]\nattacks: [{name: fgsm, eps: [0.1]}]\ndevice: cpu\n"
                    "dataset: {name: mnist-embedded, limit: 4}\n")  # fmt: skip
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with warnings.catch_warnings(record=True) as shown:  # pytest would record them
        warnings.simplefilter("always")
        assert main([command[0], str(tiny), *command[1:], "--db", db, "--quiet"]) == 0
    err = capsys.readouterr().err
    (line,) = failure_warnings(registry)
    assert "'broken'" in line and "cannot import its weights" in line
    assert [e for e in err.splitlines() if "plugin" in e] == [line]
    assert not [w for w in shown if w.category is PluginLoadWarning]  # not again per run
    stored = ResultStore(db).query(
        "SELECT run_id, message FROM run_warnings WHERE category = 'PluginLoadWarning'"
    )[1]
    message = line.removeprefix("warning: ")
    assert sorted(stored) == [(1, message), (2, message)]  # each run's, candidate's and baseline's


@pytest.mark.parametrize(
    "command", [["list", "attacks"], ["list", "verifiers", "--format", "json"],
                ["verify", "missing.onnx", "missing.vnnlib"]],
)  # fmt: skip
def test_list_and_verify_print_a_failed_plugin_as_evaluate_does(command, monkeypatch, capsys):
    """They printed nothing, so a verifier or attack a broken plugin would have added was
    only missing; now the same line on stderr (stdout keeps the listing: valid JSON)."""
    from aisafety.hookspecs import hookimpl
    from aisafety.plugins import build_registry, failure_warnings

    def broken():
        raise RuntimeError("cannot import its weights")

    module = types.ModuleType("broken_plugin")
    module.aisafety_verifiers = hookimpl(broken)
    registry = build_registry(extra_plugins=[("broken", module)])
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    monkeypatch.setenv("AISAFETY_LIST_CACHE", "0")
    main(command)
    out, err = capsys.readouterr()
    (line,) = failure_warnings(registry)
    assert [e for e in err.splitlines() if e.startswith("warning:")] == [line]
    if "--format" in command:
        assert json.loads(out)


@pytest.mark.parametrize(
    "command", [["compare", "--models", "mnist-cnn", "mnist-cnn-pgd-at"],
                ["check", "--baseline", "mnist-cnn-pgd-at"]],
)  # fmt: skip
def test_a_plan_warning_is_shown_once_per_command_and_stored_by_every_run(
    command, tmp_path, capsys
):
    """fgsm with only `ca`: 'no accuracy metric' was shown 4 times by check (a Runner to
    look for a stored run, then the run's, for the candidate and the baseline) and once per
    model by compare; the same plan, so once, and each run still stores it."""
    from aisafety.errors import AISafetyWarning
    from aisafety.store.results import ResultStore

    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("metrics: [ca]\nattacks: [{name: fgsm, eps: [0.1]}]\ndevice: cpu\n"
                    "dataset: {name: mnist-embedded, limit: 4}\n")  # fmt: skip
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # the command line's: once per text and line
        main([command[0], str(tiny), *command[1:], "--db", db, "--quiet"])
    plan_warnings = [str(w.message) for w in shown if "no accuracy metric" in str(w.message)]
    assert len(plan_warnings) == 1 and "'fgsm'" in plan_warnings[0]
    assert all(issubclass(w.category, AISafetyWarning) for w in shown if "fgsm" in str(w.message))
    rows = ResultStore(db).query("SELECT run_id, message FROM run_warnings")[1]
    assert sorted(r for r, m in rows if m == plan_warnings[0]) == [1, 2]


def test_quiet_keeps_the_results_and_the_sanity_warnings_not_the_skipped_checks(
    tmp_path, plan, capsys
):
    """--quiet printed every skipped check with its 'to check:' advice (six SKIP lines on
    this plan); now the checklist's counts and its warnings, as the table and curve."""
    from aisafety.report.data import load_run
    from aisafety.sanity import sanity_checks
    from aisafety.store.results import ResultStore

    db = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet", "--limit", "8"]) == 0
    quiet = capsys.readouterr().out
    checks = sanity_checks(load_run(ResultStore(db), 1))
    counts = {s: sum(c.status == s for c in checks) for s in ("warn", "pass", "skip")}
    assert counts["skip"] >= 1  # the plan has no random noise, no black-box attack, ...
    assert "[SKIP]" not in quiet and "to check:" not in quiet and "[PASS]" not in quiet
    # the hint names the --db the run went to (session 21: it read ./aisafety.db)
    assert (f"sanity checks: {counts['warn']} warning(s), {counts['pass']} passed, "
            f"{counts['skip']} skipped (details: aisafety report 1 --db {db})"
            ) in quiet  # fmt: skip
    assert quiet.count("[WARN]") == counts["warn"]
    assert "robust accuracy against budget" in quiet and "robust-accuracy" in quiet


def test_a_warning_under_a_progress_bar_clears_the_bars_line_first(monkeypatch, capsys):
    """A warning raised mid-attack was written straight to stderr, onto the open bar's line
    ('pgd-linf eps=0.1:  50%|...| 1/2 [...]warning: ...', session 21, an ImageNet run); the
    unit lines go through tqdm.write already. Under ``main`` a warning now clears the bar's
    line first and draws the bar again after it, and Python's display comes back after."""
    from tqdm import tqdm

    import aisafety.cli as cli
    from aisafety.errors import AISafetyWarning

    def plain(message, category, filename, lineno, file=None, line=None) -> None:
        sys.stderr.write(f"warning: {message}\n")  # Python's display: straight to stderr

    def command(argv) -> int:
        bar = tqdm(total=2, desc="pgd-linf eps=0.1", mininterval=0)  # on captured stderr
        bar.update(1)
        warnings.warn("the model sat at chance", AISafetyWarning, stacklevel=1)
        bar.update(1)
        bar.close()
        return 0

    monkeypatch.setattr(cli, "command", command)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = plain
        assert main([]) == 0
        assert warnings.showwarning is plain
    err = capsys.readouterr().err
    segments = err.replace("\n", "\r").split("\r")
    at = segments.index("warning: the model sat at chance")  # a line of its own
    assert segments[at - 1].strip() == "" and "50%" in segments[at - 2]  # the bar cleared
    assert "50%" in segments[at + 2] and "100%" in segments[-2]  # and drawn again
