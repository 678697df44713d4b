"""A run made from ``aisafety.evaluate(plan, model=..., data=...)``, re-run from its stored
plan: the plan records both fingerprints; without the objects it names what to pass, with the
same objects ``resume`` takes every unit from the database, with other objects it says that
nothing can be resumed."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

import aisafety
from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.errors import ConfigError
from aisafety.loading import fingerprint
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.store.results import ResultStore

PLAN = {"metrics": ["ca", "robust-accuracy"],
        "attacks": [{"name": "fgsm", "eps": [0.05]}]}  # fmt: skip


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).eval()


@pytest.fixture
def stored(tmp_path):
    """One run from a module and arrays, and its plan as the database keeps it."""
    x, y = torch.rand(12, 3, 8, 8), torch.arange(12) % 10
    db = f"sqlite:///{tmp_path / 'r.db'}"
    record = aisafety.evaluate(PLAN, db, model=_net(0), data=(x, y), name="mine")
    _, rows = ResultStore(db).query(f"SELECT plan FROM runs WHERE id = {record.run_id}")
    plan = rows[0][0]
    return plan if isinstance(plan, dict) else json.loads(plan), db, x, y, record


def test_the_stored_plan_records_both_fingerprints(stored):
    plan, _, x, y, record = stored
    assert plan["model"]["source"] == "object" and plan["model"]["name"] == "mine"
    assert len(plan["model"]["fingerprint"]) == 64
    assert plan["dataset"]["name"] == "arrays"
    handed = aisafety.in_memory.in_memory_data((x, y))
    assert plan["dataset"]["fingerprint"] == fingerprint(handed)
    assert record.plan.model.fingerprint == plan["model"]["fingerprint"]


def test_without_the_objects_the_error_names_what_to_pass(stored, tmp_path, capsys):
    plan, db, x, y, _ = stored
    file = tmp_path / "stored.yaml"
    file.write_text(yaml.safe_dump(plan))
    assert main(["evaluate", str(file), "--db", db, "--resume", "--quiet"]) == 2
    message = capsys.readouterr().err
    assert "model= (model 'mine', fingerprint " in message and "data= (the arrays" in message
    assert "aisafety.evaluate(plan, model=" in message and "Traceback" not in message
    predictor = TorchPredictor(_net(0), (3, 8, 8), 10, name="mine")
    with pytest.raises(ConfigError, match=r"cannot load again: data= \(the arrays") as error:
        aisafety.evaluate(plan_from_dict(plan), db, model=predictor)
    assert "model=" not in str(error.value).split("again:")[1].split(";")[0]


def test_with_the_same_objects_resume_takes_every_unit(stored):
    plan, db, x, y, first = stored
    again = aisafety.evaluate(
        plan_from_dict(plan), db, resume=True, model=_net(0), data=(x, y), name="mine"
    )
    assert again.resumed_units > 0
    assert sorted((v.metric, v.value) for v in again.values) == sorted(
        (v.metric, v.value) for v in first.values
    )


def test_with_other_objects_resume_says_nothing_can_be_resumed(stored):
    plan, db, x, y, _ = stored
    with pytest.raises(ConfigError, match=r"plan was stored for model= with fingerprint"):
        aisafety.evaluate(plan_from_dict(plan), db, resume=True, model=_net(1), data=(x, y))
    with pytest.raises(ConfigError, match=r"stored for data= .*other code, weights or images"):
        aisafety.evaluate(plan_from_dict(plan), db, resume=True, model=_net(0), data=(x[:6], y[:6]))
    fresh = aisafety.evaluate(plan_from_dict(plan), db, model=_net(1), data=(x, y))
    assert fresh.values and fresh.resumed_units == 0  # without resume: the other model, run
    assert fresh.plan.model.fingerprint != plan["model"]["fingerprint"]


def test_a_fingerprint_belongs_to_arrays_only():
    with pytest.raises(ConfigError, match="dataset 'mnist-embedded' does not take it"):
        plan_from_dict({"dataset": {"name": "mnist-embedded", "fingerprint": "ab"}})
