"""A user's network in float64 is attacked and verified in float64; one in half precision is
attacked (scores returned in float32) but refused by the verifiers, whose bounds would not
cover its rounding (docs/own-model.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.context import EvaluationContext
from aisafety.in_memory import in_memory_model
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.verification.graph import VerificationError, build_graph

SHAPE = (1, 2, 3)


def relu_net() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Conv2d(1, 2, 2), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
        nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3),
    ).eval()  # fmt: skip


def context(predictor: TorchPredictor, n: int = 16) -> EvaluationContext:
    x = torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y = predictor.logits(x).argmax(1)
    data = LoadedDataset("random", x, y, ("a", "b", "c"))
    return EvaluationContext(
        predictor, data, lambda s: default_registry().create("attack", s.name, s.config)
    )


def predictors(dtype: torch.dtype) -> tuple[TorchPredictor, TorchPredictor]:
    """The float32 net and its copy in ``dtype`` (float32 values are exact in float64)."""
    net = relu_net()
    mean, std = [0.4], [0.3]
    own = TorchPredictor(net, SHAPE, 3, name="f32", mean=mean, std=std)
    copy_net = copy.deepcopy(net).to(dtype)
    return own, TorchPredictor(copy_net, SHAPE, 3, name=str(dtype), mean=mean, std=std)


def test_a_float64_network_runs_builds_its_graph_and_keeps_its_dtype():
    f32, f64 = predictors(torch.float64)
    x = torch.rand(5, *SHAPE)
    scores = f64.logits(x)
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores.float(), f32.logits(x), rtol=1e-5, atol=1e-5)
    graph = build_graph(f64.network, SHAPE, "f64")
    torch.testing.assert_close(graph.forward(x.double()), scores)
    (predictor, _), spec = in_memory_model(f64.module, SHAPE)  # aisafety.evaluate(model=...)
    assert spec.num_classes == 3 and predictor.logits(x).dtype == torch.float64


def test_a_float64_python_factory_loads_and_its_classes_are_probed(tmp_path):
    """``source: python`` without ``num_classes``: one forward pass on a zero image of the
    network's dtype tells them (a float32 zero image failed on float64 weights)."""
    (tmp_path / "f64_factory.py").write_text(
        "from torch import nn\n\n"
        "def build():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(6, 4)).double()\n"
    )
    spec = ModelSpec(name="f64", source="python", factory="f64_factory:build",
                     input_shape=SHAPE, python_path=(tmp_path,))  # fmt: skip
    predictor, _ = load_model(spec, torch.device("cpu"))
    assert predictor.num_classes == 4
    assert predictor.logits(torch.rand(3, *SHAPE)).dtype == torch.float64


@pytest.mark.parametrize("verifier", ["crown", "alpha-crown", "complete"])
def test_a_float64_network_gets_the_verdicts_of_its_float32_copy(verifier):
    verdicts = {}
    for predictor in predictors(torch.float64):
        metric = default_registry().create(
            "metric", "certified-accuracy", {"verifier": verifier, "eps": 0.03}
        )
        value = metric.compute(context(predictor))[0]
        verdicts[predictor.name] = [s.verdict for s in value.verdicts]
    assert verdicts["f32"] == verdicts["torch.float64"]
    assert {"certified", "falsified"} <= set(verdicts["f32"])  # both outcomes covered


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_network_is_attacked_but_refused_by_the_verifiers(dtype):
    f32, half = predictors(dtype)
    x = torch.rand(5, *SHAPE)
    scores = half.logits(x)
    assert scores.dtype == torch.float32  # metrics read float32 margins
    torch.testing.assert_close(scores, f32.logits(x), rtol=0.05, atol=0.05)
    with pytest.raises(VerificationError, match=rf"{dtype}.*module\.float\(\)"):
        build_graph(half.network, SHAPE, "half")
    metric = default_registry().create("metric", "certified-accuracy", {"verifier": "crown"})
    with pytest.raises(VerificationError, match=str(dtype)):
        metric.compute(context(half))


def test_a_float64_network_is_not_searched_in_bf16_under_a_bf16_label(monkeypatch):
    """autocast leaves float64 ops in float64, so ``precision: bf16`` on a float64 network
    ran its search in float64 under a bf16 label: now refused, naming the dtype and the fix
    (through an input defense too); ``auto`` is the network's own float64 (no view: fp32's
    result exactly). A float32 network is still searched under autocast."""
    import aisafety.attack.precision as precision
    from aisafety.attack.pgd import PGDLinf
    from aisafety.defense.bit_depth import BitDepthReduction
    from aisafety.errors import ConfigError

    monkeypatch.setattr(precision, "fast_precisions", lambda device: ("bf16",))
    f32, f64 = predictors(torch.float64)
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = f64.logits(x).argmax(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what makes bf16 a no-op here
        assert f64.network(x).dtype == torch.float64 and f32.network(x).dtype == torch.bfloat16
    for model in (f64, BitDepthReduction(f64, bits=8)):
        with pytest.raises(ConfigError) as refused:
            PGDLinf(steps=2, precision="bf16")(model, x, y, 0.1)
        message = str(refused.value)
        assert "attack 'pgd-linf': precision 'bf16'" in message and "float64" in message
        assert "precision: fp32 or auto" in message and "module.float()" in message
    auto = PGDLinf(steps=2, precision="auto")(f64, x, y, 0.1)
    fp32 = PGDLinf(steps=2)(f64, x, y, 0.1)
    assert torch.equal(auto.x_adv, fp32.x_adv) and torch.equal(auto.success, fp32.success)
    searcher = PGDLinf(precision="bf16").search_predictor(f32)
    assert isinstance(searcher, precision.ReducedPrecision)
