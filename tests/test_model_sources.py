"""Every model source runs through a plan; capabilities decide which attacks may run."""

from __future__ import annotations

import io

import pytest
import torch

from aisafety.database.zoo import load_zoo_model
from aisafety.errors import CapabilityError
from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec, ModelSpec
from aisafety.prediction.server import make_server
from aisafety.runner import Runner
from aisafety.store.results import ResultStore
from tests.shared_data import shared_folder

DATA = DatasetSpec(limit=30)
SQUARE = AttackSpec(name="square-linf", config={"queries": 50}, eps=0.2)
PGD = AttackSpec(name="pgd-linf", config={"steps": 5}, eps=0.2)


def _run(tmp_path, model: ModelSpec, attacks, metrics=("ca", "aaw", "aab")):
    plan = EvaluationPlan(
        model=model,
        dataset=DATA,
        attacks=tuple(attacks),
        metrics=tuple(MetricSpec(name=m) for m in metrics),
        device="cpu",
    )
    record = Runner(plan, ResultStore(f"sqlite:///{tmp_path / 'r.db'}"), quiet=True).run()
    return {(v.metric, v.attack): v.value for v in record.values}


@pytest.fixture(scope="module")
def zoo_files(tmp_path_factory):
    """The zoo model saved as a state dict and as TorchScript."""
    folder = tmp_path_factory.mktemp("models")
    predictor = load_zoo_model("mnist-cnn")
    torch.save(predictor.module.state_dict(), folder / "cnn.pt")
    torch.jit.trace(predictor.network, torch.zeros(1, 1, 28, 28)).save(str(folder / "cnn.ts"))
    return folder


def test_checkpoint_and_torchscript_match_the_zoo_model(tmp_path, zoo_files):
    zoo = _run(tmp_path / "a", ModelSpec(), [PGD])
    checkpoint = ModelSpec(
        name="mine", source="checkpoint", path=zoo_files / "cnn.pt", architecture="mnist-cnn",
        input_shape=(1, 28, 28), mean=(0.1307,), std=(0.3081,),
    )  # fmt: skip
    scripted = ModelSpec(name="ts", source="torchscript", path=zoo_files / "cnn.ts",
                         input_shape=(1, 28, 28))  # fmt: skip
    assert _run(tmp_path / "b", checkpoint, [PGD]) == pytest.approx(zoo)
    assert _run(tmp_path / "c", scripted, [PGD]) == pytest.approx(zoo)


def test_onnx_scores_only_model_runs_score_attacks_and_refuses_gradient_ones(tmp_path):
    vnn = shared_folder("vnncomp2021_mnistfc")
    model = ModelSpec(
        name="net256x2", source="onnx", path=vnn / "mnist-net_256x2.onnx", input_shape=(1, 28, 28)
    )
    values = _run(tmp_path, model, [SQUARE])
    assert 0.9 <= values[("ca", None)] <= 1.0
    assert values[("aab", "square-linf(queries=50)")] < values[("ca", None)]
    with pytest.raises(CapabilityError, match="pgd-linf.*net256x2.*gradients") as err:
        _run(tmp_path / "pgd", model, [PGD])
    assert "Attacks that run on this model:" in str(err.value) and "square-linf" in str(err.value)
    converted = model.model_copy(update={"gradients": True})
    assert ("aaw", "pgd-linf(steps=5)") in _run(tmp_path / "conv", converted, [PGD])


def test_remote_model_gives_the_same_numbers_as_in_process(tmp_path):
    predictor = load_zoo_model("mnist-cnn")
    local = _run(tmp_path / "local", ModelSpec(), [SQUARE])
    with make_server(predictor, model_name="mnist-cnn").start() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        remote = _run(tmp_path / "remote", ModelSpec(name="mnist-cnn", source="remote", url=url),
                      [SQUARE])  # fmt: skip
    assert remote == pytest.approx(local, abs=1e-6)


def test_state_dict_round_trip_is_weights_only(tmp_path):
    """A checkpoint that pickles code is refused by the loader (weights_only=True)."""
    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(2), "code": print}, buffer)
    (tmp_path / "evil.pt").write_bytes(buffer.getvalue())
    spec = ModelSpec(name="evil", source="checkpoint", path=tmp_path / "evil.pt",
                     architecture="mnist-cnn", input_shape=(1, 28, 28))  # fmt: skip
    with pytest.raises(Exception, match="(?i)weights.only|unsupported|global"):
        _run(tmp_path, spec, [])
