"""examples/cifar10.yaml: the plan of docs/cifar10.md validates (fast), and runs end to end
on 2 images with its report showing each unit's time and peak memory (slow: alpha-CROWN on a
CIFAR ResNet takes a minute of CPU on a busy machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aisafety.cli import main
from aisafety.config import load_plan
from tests.shared_data import absent, located, relocated

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "cifar10.yaml"
SHARED = located("cifar10-models")
NETS = ("resnet_2b", "resnet_4b", "pgd_2_3_16", "cifar10_keras_cnn")  # bench/cifar10_table.py

needs_models = pytest.mark.skipif(SHARED is None, reason=absent("cifar10-models"))


def test_the_plan_validates_and_names_every_capability_of_the_table():
    plan = load_plan(PLAN)
    names = {m.name for m in plan.metrics}
    assert {"ca", "robust-accuracy", "mce", "rdi", "adversarial-hypervolume"} <= names
    assert {"certified-accuracy", "smoothed-certified-accuracy"} <= names
    verifiers = {m.config["verifier"] for m in plan.metrics if m.name == "certified-accuracy"}
    assert verifiers == {"crown", "alpha-crown"}
    for m in plan.metrics:  # the limit counts CPU seconds (wall time varies with the load)
        if m.name == "certified-accuracy":
            assert m.config["verifier_config"]["clock"] == "cpu"
    assert plan.model.path.name == "resnet_2b.onnx"
    for net in NETS:  # each net of the table has its model block
        assert load_plan(ROOT / "examples" / "cifar10-models" / f"{net}.yaml").model.name == net


@needs_models
@pytest.mark.slow
def test_the_example_runs_on_two_images_and_the_report_has_its_units(tmp_path):
    """The plan as written, its model where tests/shared_data.py finds it."""
    raw = yaml.safe_load(PLAN.read_text())
    raw["model"]["path"] = str(relocated(load_plan(PLAN).model.path))
    plan = tmp_path / "cifar10.yaml"
    plan.write_text(yaml.safe_dump(raw))
    db = f"sqlite:///{tmp_path / 'c.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--limit", "2", "--quiet"]) == 0
    out = tmp_path / "report.html"
    assert main(["report", "--db", db, "-o", str(out)]) == 0
    html = out.read_text()
    assert "Time and peak memory per unit" in html
    for unit in ("clean metrics on cifar10-embedded", "pgd-linf(steps=20) eps=0.0313725"):
        assert unit in html
    assert "verifier=alpha-crown" in html
