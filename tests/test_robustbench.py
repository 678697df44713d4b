"""``source: robustbench``: a RobustBench model-zoo network from a checkpoint already on disk.

No real RobustBench checkpoint can be had here (no network), so the tests save random weights
of a real RobustBench architecture (``Wong2020Fast``, a PreActResNet-18 with its CIFAR-10
normalisation inside) in the layout RobustBench's ``load_model`` reads. The tests that need
the robustbench package skip, naming why, where it cannot be imported: it needs a
torchvision built for the installed torch, and there is none for torch 2.13.0+cpu on PyPI
(docs/own-model.md); `.ci/robustbench.sh` runs them in a venv where it can.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch
import yaml

from aisafety.cli import main
from aisafety.config import load_plan
from aisafety.database.datasets.embedded import EmbeddedCifar10
from aisafety.errors import ConfigError, UnknownNameError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.store.results import ResultStore

NAME = "Wong2020Fast"
CPU = torch.device("cpu")


def _spec(model_dir, name: str = NAME, **fields) -> ModelSpec:
    fields = {"dataset": "cifar10", "threat_model": "Linf", **fields}
    return ModelSpec(name=name, source="robustbench", model_dir=model_dir, **fields)


def test_a_missing_checkpoint_names_where_it_must_be_and_how_to_get_it(tmp_path):
    expected = tmp_path / "cifar10" / "Linf" / f"{NAME}.pt"
    with pytest.raises(ConfigError) as error:
        load_model(_spec(tmp_path), CPU)
    message = str(error.value)
    assert f"model {NAME!r}" in message and f"must be at {expected}" in message
    assert "nothing is downloaded" in message and f"load_model('{NAME}'" in message
    assert not expected.parent.exists()  # nothing made, nothing fetched


def test_plan_fields_are_checked_and_model_dir_is_relative_to_the_plan(tmp_path):
    plan = tmp_path / "plan.yaml"
    model = {"name": NAME, "source": "robustbench", "model_dir": "models",
             "dataset": "cifar10", "threat_model": "Linf"}  # fmt: skip
    plan.write_text(yaml.safe_dump({"model": model, "metrics": ["ca"]}))
    assert load_plan(plan).model.model_dir == tmp_path / "models"
    with pytest.raises(ConfigError, match="needs 'model_dir'"):
        load_plan_from({**model, "model_dir": None}, tmp_path)
    with pytest.raises(ConfigError, match="mean is not used by a robustbench model"):
        load_plan_from({**model, "mean": [0.5, 0.5, 0.5]}, tmp_path)  # RobustBench's own
    with pytest.raises(ConfigError, match="threat_model"):
        load_plan_from({**model, "threat_model": "linf"}, tmp_path)


def load_plan_from(model: dict, folder):
    plan = folder / "other.yaml"
    plan.write_text(yaml.safe_dump({"model": model, "metrics": ["ca"]}))
    return load_plan(plan)


def _robustbench():
    """robustbench's model table and utils, or a skip saying why they cannot be imported."""
    try:
        return importlib.import_module("robustbench.model_zoo"), importlib.import_module(
            "robustbench.utils"
        )
    except Exception as exc:  # noqa: BLE001 - a torchvision unfit for this torch: RuntimeError
        if os.environ.get("AISAFETY_REQUIRE_ROBUSTBENCH"):  # .ci/robustbench.sh: must run
            raise
        pytest.skip(
            f"robustbench cannot be imported here ({type(exc).__name__}: {str(exc)[:120]}); "
            "it needs timm and a torchvision built for this torch (docs/own-model.md)"
        )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Random weights of RobustBench's Wong2020Fast in its checkpoint layout, and the net."""
    zoo, _ = _robustbench()
    from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

    entry = zoo.model_dicts[BenchmarkDataset.cifar_10][ThreatModel.Linf][NAME]
    torch.manual_seed(0)
    net = entry["model"]()
    net.train()
    with torch.no_grad():  # running statistics that are not the identity
        net(torch.rand(16, 3, 32, 32))
    net.eval()
    model_dir = tmp_path_factory.mktemp("robustbench")
    (model_dir / "cifar10" / "Linf").mkdir(parents=True)
    state = {f"module.{k}": v for k, v in net.state_dict().items()}  # as RobustBench's files
    torch.save({"state_dict": state}, model_dir / "cifar10" / "Linf" / f"{NAME}.pt")
    return model_dir, net


def test_same_logits_as_the_architecture_loaded_directly(saved):
    model_dir, net = saved
    predictor, fingerprint = load_model(_spec(model_dir), CPU)
    x = EmbeddedCifar10().load(None, "test").x[:8]
    with torch.no_grad():
        diff = float((predictor.logits(x) - net(x)).abs().max())
    print(f"robustbench {NAME}: max |logit difference| to the module = {diff:.3g}")
    assert diff < 1e-5
    assert predictor.input_shape == (3, 32, 32) and predictor.num_classes == 10
    ours = predictor.network[0]  # no normalisation added: RobustBench's own, inside
    assert float(ours.mean.abs().max()) == 0 and float((ours.std - 1).abs().max()) == 0
    assert torch.allclose(predictor.module.sigma.flatten(), torch.tensor([0.2471, 0.2435, 0.2616]))
    assert len(fingerprint) == 64


def test_unknown_names_and_unsupported_entries_are_named(saved):
    model_dir, _ = saved
    (model_dir / "cifar10" / "Linf" / "Nobody2026.pt").write_bytes(b"")
    with pytest.raises(UnknownNameError, match="Carmon2019Unlabeled"):
        load_model(_spec(model_dir, "Nobody2026"), CPU)
    (model_dir / "cifar10" / "Linf" / "Chen2020Adversarial.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="is an ensemble.*source: python"):
        load_model(_spec(model_dir, "Chen2020Adversarial"), CPU)  # three checkpoint files


def test_a_plan_with_attacks_coverage_rdi_and_crown(saved, tmp_path):
    model_dir, _ = saved
    model = {"name": NAME, "source": "robustbench", "model_dir": str(model_dir),
             "dataset": "cifar10", "threat_model": "Linf"}  # fmt: skip
    plan = {
        "model": model,
        "dataset": {"name": "cifar10-embedded", "limit": 10},  # one per class
        "profile_dataset": {"name": "cifar10-embedded", "split": "test", "limit": 8},
        "attacks": [
            {"name": "pgd-linf", "eps": [0.5 / 255], "config": {"steps": 2}},
            {"name": "standard", "eps": [0.5 / 255], "config": {"steps": 1, "queries": 4}},
        ],
        "metrics": [
            "ca",
            "robust-accuracy",
            "tkncov",
            "rdi",
            {
                "name": "certified-accuracy",
                "config": {
                    "eps": 0.1 / 255,
                    "verifier": "crown",
                    "verifier_config": {"timeout": 30, "memory_gib": 2},
                },
            },
        ],  # fmt: skip
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(path), "--db", db, "--quiet"]) == 0
    _, rows = ResultStore(db).query("SELECT metric, value FROM results")
    print(f"robustbench {NAME} (random weights) stored: {sorted(rows)}")
    stored = {metric.split("(")[0] for metric, _ in rows}
    assert {"ca", "robust-accuracy", "tkncov", "rdi", "certified-accuracy"} <= stored, rows
    _, verdicts = ResultStore(db).query("SELECT verdict, margin FROM verification_samples")
    print(f"CROWN verdicts under a 2 GiB budget: {sorted(verdicts, key=str)}")
    assert len(verdicts) == 10  # one per image: the verifier answered for every one
    # the image the random net gets right reached CROWN (30 s here: timeout), not refused
    assert any(verdict != "falsified" for verdict, _ in verdicts)
