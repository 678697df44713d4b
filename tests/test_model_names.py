"""A user's model is stored and reported under a name of its own, never silently under the
zoo's default ``mnist-cnn``: through the plan, ``aisafety.evaluate`` and the CLI, with
``--resume`` and the release gate's reuse of runs stored under the old default."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import aisafety
from aisafety.check import evaluated_run
from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.errors import AISafetyWarning, ConfigError
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.store.results import ResultStore

SHAPE = [1, 28, 28]


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """A TorchScript file ``m.pt``: a zero linear layer, so it always answers class 0 (at
    chance: the clean pass warns, naming the model)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    nn.init.zeros_(net[1].weight), nn.init.zeros_(net[1].bias)
    path = tmp_path_factory.mktemp("own") / "m.pt"
    torch.jit.trace(net.eval(), torch.zeros(1, *SHAPE)).save(str(path))
    return path


def own_plan(path, **model) -> dict:
    spec = {"source": "torchscript", "path": str(path), "input_shape": SHAPE, **model}
    return {"model": spec, "dataset": {"name": "mnist-embedded", "limit": 30},
            "metrics": ["ca"], "device": "cpu"}  # fmt: skip


def stored_names(db: str, run_id: int) -> tuple[str, list[str]]:
    """The model name in run ``run_id``'s stored plan, and the models its values belong to."""
    store = ResultStore(db)
    plan = store.query(f"SELECT json_extract(plan, '$.model.name') FROM runs WHERE id={run_id}")
    models = store.query(
        "SELECT DISTINCT m.name FROM metric_values v JOIN models m ON m.id = v.model_id "
        f"WHERE v.run_id = {run_id}"
    )
    return plan[1][0][0], [row[0] for row in models[1]]


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ({"source": "torchscript", "path": "/tmp/m.pt", "input_shape": [3, 32, 32]}, "m"),
        ({"source": "export", "path": "nets/resnet18.pt2", "input_shape": SHAPE}, "resnet18"),
        ({"source": "onnx", "path": "cifar-net.onnx"}, "cifar-net"),
        ({"source": "checkpoint", "path": "runs/ep50.pt", "architecture": "mnist-cnn"}, "ep50"),
        ({"source": "python", "factory": "mynets:TinyResNet", "input_shape": SHAPE},
         "TinyResNet"),
        ({"source": "python", "factory": "mynets:TinyResNet", "path": "w/ep50.pt",
          "input_shape": SHAPE}, "ep50"),
        ({"source": "onnx", "path": "net.onnx", "name": "mine"}, "mine"),
        ({"source": "zoo"}, "mnist-cnn"),
        ({}, "mnist-cnn"),
    ],
)  # fmt: skip
def test_a_users_file_or_code_is_named_after_it_in_the_stored_plan(model, name):
    plan = plan_from_dict({"model": model})
    assert plan.model.name == name
    assert plan.model_dump(mode="json")["model"]["name"] == name  # what runs.plan stores


@pytest.mark.parametrize(
    ("model", "meaning"),
    [
        ({"source": "remote", "url": "http://10.0.0.5:8000"}, "the served model's name"),
        ({"source": "robustbench", "model_dir": "models", "dataset": "cifar10",
          "threat_model": "Linf"}, "the network's name in RobustBench"),
    ],
)  # fmt: skip
def test_a_model_whose_name_says_what_to_load_needs_one(model, meaning):
    """Before: a remote plan asked the server for /v2/models/mnist-cnn, RobustBench for an
    entry 'mnist-cnn', silently."""
    with pytest.raises(ConfigError, match=f"needs 'name' \\(name: {meaning}"):
        plan_from_dict({"model": model})
    assert plan_from_dict({"model": {**model, "name": "net"}}).model.name == "net"


def test_evaluate_stores_and_warns_under_the_files_name(tmp_path, script):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.warns(AISafetyWarning, match="model 'm' has clean accuracy"):
        record = aisafety.evaluate(own_plan(script), db=db)
    assert record.plan.model.name == "m"
    assert stored_names(db, record.run_id) == ("m", ["m"])
    warned = [message for *_, message in ResultStore(db).run_warnings(record.run_id)]
    assert warned and all("'mnist-cnn'" not in message for message in warned)
    given = TorchPredictor(torch.jit.load(str(script)), SHAPE, 10, name="lab-net")
    record = aisafety.evaluate(own_plan(script), db=db, model=given)  # a Predictor's own name
    assert stored_names(db, record.run_id) == ("lab-net", ["lab-net"])


def test_resume_takes_units_stored_under_the_old_default(tmp_path, script):
    """A run stored before the name was the file's (``name: mnist-cnn`` in its plan): the
    units' keys hash the weights, not the name, so ``--resume`` still takes them (the same
    computation), and the new run is stored under the file's name."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.warns(AISafetyWarning):
        old = aisafety.evaluate(own_plan(script, name="mnist-cnn"), db=db)
        new = aisafety.evaluate(own_plan(script), db=db, resume=True)
    assert new.resumed_units == 1 and new.values == old.values
    assert stored_names(db, new.run_id)[0] == "m"


def test_the_gate_reuses_no_run_stored_under_another_name(tmp_path, script):
    """``aisafety check`` reuses a stored run of the same units only where it names the model
    as the plan does: a run of the file stored as 'mnist-cnn' would head the gate's output
    and report with the zoo's name."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = ResultStore(db)
    with pytest.warns(AISafetyWarning):
        old = aisafety.evaluate(own_plan(script, name="mnist-cnn"), db=db)
        named = plan_from_dict(own_plan(script, name="mnist-cnn"))
        assert evaluated_run(named, store, True) == (old.run_id, True)
        fresh, reused = evaluated_run(plan_from_dict(own_plan(script)), store, quiet=True)
    assert (fresh != old.run_id, reused) == (True, False)
    assert stored_names(db, fresh) == ("m", ["m"])
    assert evaluated_run(plan_from_dict(own_plan(script)), store, True) == (fresh, True)


def test_cli_names_the_file_and_model_override_names_the_zoo_model(tmp_path, script, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {{source: torchscript, path: {script}, input_shape: {SHAPE}}}\n"
        "dataset: {name: mnist-embedded, limit: 10}\nmetrics: [ca]\ndevice: cpu\n"
    )
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    assert "model m on mnist-embedded" in capsys.readouterr().out
    assert main(["evaluate", str(plan), "--db", db, "--quiet", "--model", "mnist-cnn"]) == 0
    assert "model mnist-cnn on mnist-embedded" in capsys.readouterr().out
    assert stored_names(db, 1) == ("m", ["m"]) and stored_names(db, 2)[0] == "mnist-cnn"
