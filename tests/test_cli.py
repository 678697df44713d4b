"""The ``aisafety`` command line, driven as a user would."""

from __future__ import annotations

import json

import pytest

from aisafety.cli import main
from aisafety.store.results import ResultStore


def _json_after_header(text: str):
    return json.loads(text[text.index("[") :])


def test_evaluate_prints_ca_and_aaw_that_query_returns(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", "--limit", "40", "--db", db, "--quiet", "--format", "json"]) == 0
    printed = _json_after_header(capsys.readouterr().out)
    shown = {(r["metric"], r["attack"], r["eps"]): r["value"] for r in printed}
    assert ("ca", "", None) in shown
    assert any(metric == "aaw" for metric, _, _ in shown)
    assert main(["query", "SELECT metric, attack, eps, value FROM results", "--db", db,
                 "--format", "json"]) == 0  # fmt: skip
    stored = _json_after_header(capsys.readouterr().out)
    assert len(stored) == len(printed)
    for row in stored:
        key = (row["metric"], row["attack"] or "", row["eps"])
        assert row["value"] == pytest.approx(shown[key], nan_ok=True)


def test_list_attacks_json_has_family_norm_and_capability(capsys):
    assert main(["list", "attacks", "--format", "json"]) == 0
    attacks = {a["name"]: a for a in json.loads(capsys.readouterr().out)}
    assert attacks["pgd-linf"]["family"] == "gradient"
    assert attacks["pgd-linf"]["norm"] == "linf"
    assert attacks["pgd-linf"]["requires"] == "gradients"
    assert attacks["fgsm"]["plugin"] == "aisafety.builtin"


@pytest.mark.parametrize("kind", ["metrics", "defenses", "datasets", "models"])
def test_list_other_kinds(kind, capsys):
    assert main(["list", kind, "--format", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert entries and all("name" in e for e in entries)


def test_query_formats(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    main(["evaluate", "--limit", "20", "--db", db, "--quiet"])
    capsys.readouterr()
    main(["query", "SELECT metric, value FROM results WHERE metric = 'ca'", "--db", db,
          "--format", "csv"])  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "metric,value" and lines[1].startswith("ca,")


def test_errors_exit_2_with_a_message_not_a_traceback(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("attacks:\n  - name: pgd-typo\n")
    assert main(["evaluate", str(config), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    err = capsys.readouterr().err
    assert "unknown attack 'pgd-typo'" in err and "pgd-linf" in err
    assert main(["query", "SELEC nonsense", "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    assert "query failed" in capsys.readouterr().err


def test_plugins_lists_the_builtins(capsys):
    code = main(["plugins"])
    out = capsys.readouterr().out
    assert "aisafety.builtin" in out and "pgd-linf" in out
    assert code in (0, 1)  # 1 only when some installed third-party plugin is broken


def test_model_and_dataset_options_replace_the_plans(tmp_path):
    """One model of a shared plan without copying it: --model a zoo name, --dataset a
    registered one (the plan's split, limit and seed kept)."""
    from aisafety.config import apply_overrides, plan_from_dict

    plan = plan_from_dict({
        "model": {"name": "mnist-cnn", "source": "zoo"},
        "dataset": {"name": "mnist", "path": "data/mnist", "limit": 30, "seed": 3},
        "attacks": [{"name": "fgsm", "eps": [0.1]}],
    })  # fmt: skip
    changed = apply_overrides(plan, None, None, model="mnist-cnn-pgd-at", dataset="mnist-embedded")
    assert changed.model.name == "mnist-cnn-pgd-at" and changed.model.source == "zoo"
    assert changed.dataset.name == "mnist-embedded" and changed.dataset.path is None
    assert (changed.dataset.limit, changed.dataset.seed) == (30, 3)
    assert changed.attacks == plan.attacks
    db = f"sqlite:///{tmp_path / 'r.db'}"
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("attacks: [{name: fgsm, eps: [0.1]}]\nmetrics: [ca]\n")
    assert main(["evaluate", str(plan_file), "--model", "mnist-cnn-pgd-at", "--limit", "10",
                 "--quiet", "--db", db]) == 0  # fmt: skip
    _, rows = ResultStore(db).query("SELECT name FROM models")
    assert rows == [("mnist-cnn-pgd-at",)]


FILES = [("nets/resnet_2b.onnx", "source: onnx"), ("best.pt", "source: onnx, export, torch")]


@pytest.mark.parametrize("given, source", FILES)
def test_a_model_file_given_to_model_is_answered_with_the_plan_field(
    tmp_path, capsys, given, source
):
    """--model takes a zoo name; a file there was answered with the 44 zoo names and no
    word of where a file goes. Exit 2, no traceback, the plan's model block to write."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", "--model", given, "--limit", "2", "--db", db]) == 2
    err = capsys.readouterr().err
    assert f"--model {given!r} is a model file; --model takes the name of a zoo model" in err
    assert f"model: {{{source}" in err and f"path: {given}}}" in err and "Traceback" not in err


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and out.count("aisafety") >= 1
