"""TorchScript and ONNX predictors, and the Square attack, against independent references.

References: the zoo model's own PyTorch logits (TorchScript round trip), the published test
accuracies of the VNN-COMP 2021 ``mnistfc`` networks run by onnxruntime (ONNX), onnxruntime
itself (the onnx2torch conversion), and the peer library torchattacks (Square's schedule and
strength).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.attack.score_search import margin_loss
from aisafety.attack.square import SquareLinf, p_selection
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import AISafetyError, CapabilityError, ConfigError
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.prediction.torchscript import TorchScriptPredictor

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MNISTFC = DATA / "vnncomp2021_mnistfc"
# Test accuracies stated by the VNN-COMP 2021 mnistfc benchmark (pixels x/255, 10,000 images).
PUBLISHED = {"mnist-net_256x2.onnx": 0.9808, "mnist-net_256x4.onnx": 0.9764,
             "mnist-net_256x6.onnx": 0.9689}  # fmt: skip
needs_data = pytest.mark.skipif(
    not (MNISTFC.is_dir() and (DATA / "mnist").is_dir()),
    reason=f"shared data folder {DATA} (VNN-COMP networks + MNIST) is absent",
)


@pytest.fixture(scope="module")
def zoo() -> TorchPredictor:
    return load_zoo_model("mnist-cnn")


@pytest.fixture(scope="module")
def subset() -> LoadedDataset:
    """60 class-balanced embedded MNIST test images."""
    return EmbeddedMnist().load(None, "test").balanced_subset(60, seed=0)


@pytest.fixture(scope="module")
def mnist_test() -> LoadedDataset:
    from aisafety.database.datasets.idx import MnistDataset

    return MnistDataset().load(DATA / "mnist", "test")


def _jit(fn, *args):
    with warnings.catch_warnings():  # torch.jit is deprecated upstream but still reads archives
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(*args)


# -- TorchScript -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["script", "trace"])
def test_torchscript_round_trip_gives_identical_logits(zoo, subset, tmp_path, how):
    example = subset.x[:4]
    module = (
        _jit(torch.jit.script, zoo.network)
        if how == "script"
        else _jit(torch.jit.trace, zoo.network, example)
    )
    path = tmp_path / f"mnist-cnn-{how}.pt"
    _jit(torch.jit.save, module, str(path))

    predictor = TorchScriptPredictor(path, (1, 28, 28))
    assert predictor.num_classes == 10  # probed from the module
    assert predictor.name == path.name
    assert predictor.capabilities == {Capability.GRADIENTS, Capability.SCORES, Capability.LABELS}
    with torch.inference_mode():
        assert torch.equal(predictor.logits(subset.x), zoo.logits(subset.x))
    with pytest.raises(CapabilityError, match="activations"):
        predictor.features(subset.x[:2], ["0"])

    # Gradients flow through the archive exactly as through the module: PGD agrees.
    pgd, x, y = PGDLinf(steps=3), subset.x[:20], subset.y[:20]
    ours, reference = pgd(predictor, x, y, 0.1), pgd(zoo, x, y, 0.1)
    assert torch.allclose(ours.x_adv, reference.x_adv, atol=1e-6)
    assert torch.equal(ours.success, reference.success)


def test_torchscript_normalisation_and_bad_file(zoo, subset, tmp_path):
    path = tmp_path / "bare.pt"
    _jit(torch.jit.save, _jit(torch.jit.script, zoo.module), str(path))  # without Normalize
    predictor = TorchScriptPredictor(path, (1, 28, 28), 10, mean=(0.1307,), std=(0.3081,))
    with torch.inference_mode():
        assert torch.allclose(predictor.logits(subset.x), zoo.logits(subset.x), atol=1e-5)

    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not an archive")
    with pytest.raises(ConfigError, match="not a TorchScript archive"):
        TorchScriptPredictor(junk, (1, 28, 28))
    with pytest.raises(ConfigError, match="does not exist"):
        TorchScriptPredictor(tmp_path / "missing.pt", (1, 28, 28))


# -- ONNX --------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("network", sorted(PUBLISHED))
def test_vnncomp_networks_reach_published_accuracy_with_onnxruntime(network, mnist_test):
    from aisafety.prediction.onnx_model import OnnxRuntimePredictor, load_onnx

    predictor = load_onnx(MNISTFC / network, input_shape=(1, 28, 28))
    assert isinstance(predictor, OnnxRuntimePredictor)
    assert predictor.graph_shape == [1, 784, 1] and predictor.feed_shape == (784, 1)
    assert predictor.num_classes == 10 and predictor.name == network
    assert predictor.capabilities == {Capability.SCORES, Capability.LABELS}
    assert len(mnist_test) == 10_000
    correct = int((predictor.predict(mnist_test.x) == mnist_test.y).sum())
    assert correct / 10_000 == PUBLISHED[network]


@needs_data
def test_fixed_batch_graph_is_chunked_when_not_relaxed(mnist_test):
    from aisafety.prediction.onnx_model import OnnxRuntimePredictor

    path = MNISTFC / "mnist-net_256x2.onnx"
    relaxed = OnnxRuntimePredictor(path, (1, 28, 28))
    looped = OnnxRuntimePredictor(path, (1, 28, 28), relax_batch=False)
    assert relaxed.fixed_batch is None  # onnxruntime accepted a symbolic batch dimension
    assert looped.fixed_batch == 1
    x = mnist_test.x[:37]
    assert torch.allclose(relaxed.logits(x), looped.logits(x), atol=1e-5)


@needs_data
def test_onnx_needs_input_shape_for_non_image_graphs():
    from aisafety.prediction.onnx_model import OnnxRuntimePredictor

    with pytest.raises(ConfigError, match=r"give input_shape=\(C, H, W\)"):
        OnnxRuntimePredictor(MNISTFC / "mnist-net_256x2.onnx")
    with pytest.raises(ConfigError, match="784 values per sample"):
        OnnxRuntimePredictor(MNISTFC / "mnist-net_256x2.onnx", (3, 32, 32))


@needs_data
@pytest.mark.parametrize("network", sorted(PUBLISHED))
def test_onnx2torch_conversion_matches_onnxruntime(network, mnist_test):
    from aisafety.prediction.onnx_model import OnnxTorchPredictor, load_onnx

    path = MNISTFC / network
    reference = load_onnx(path, input_shape=(1, 28, 28))
    converted = load_onnx(path, gradients=True, input_shape=(1, 28, 28))
    assert isinstance(converted, OnnxTorchPredictor)
    assert Capability.GRADIENTS in converted.capabilities
    assert converted.max_difference <= 1e-5 * 20
    x = mnist_test.x[:1000]
    with torch.inference_mode():
        got, expected = converted.logits(x), reference.logits(x)
    scale = max(1.0, float(expected.abs().max()))
    assert float((got - expected).abs().max()) <= 1e-5 * scale


@needs_data
def test_pgd_runs_on_converted_onnx_and_transfers_to_onnxruntime(mnist_test):
    from aisafety.prediction.onnx_model import load_onnx

    path = MNISTFC / "mnist-net_256x2.onnx"
    converted = load_onnx(path, gradients=True, input_shape=(1, 28, 28))
    runtime = load_onnx(path, input_shape=(1, 28, 28))
    x, y = mnist_test.x[:100], mnist_test.y[:100]
    result = PGDLinf(steps=20)(converted, x, y, 0.05)
    clean = float((runtime.predict(x) == y).float().mean())
    assert result.robust_accuracy < clean  # the attack finds adversarial examples
    assert float(result.norms["linf"].max()) <= 0.05 + 1e-6
    # The examples found through the converted gradients fool the original graph too.
    assert torch.equal(runtime.predict(result.x_adv), result.adv_pred)


@needs_data
def test_gradient_attack_on_onnxruntime_is_refused_but_square_runs(mnist_test):
    from aisafety.prediction.onnx_model import load_onnx

    runtime = load_onnx(MNISTFC / "mnist-net_256x2.onnx", input_shape=(1, 28, 28))
    x, y = mnist_test.x[:40], mnist_test.y[:40]
    with pytest.raises(CapabilityError) as caught:
        PGDLinf(steps=2)(runtime, x, y, 0.05)
    message = str(caught.value)
    assert "pgd-linf" in message and "mnist-net_256x2.onnx" in message
    assert "gradients" in message

    result = SquareLinf(queries=150, seed=1)(runtime, x, y, 0.05)
    clean = float((runtime.predict(x) == y).float().mean())
    assert result.robust_accuracy < clean
    assert float(result.norms["linf"].max()) <= 0.05 + 1e-6
    assert int(result.steps.max()) <= 150


def test_onnx_missing_file_is_a_clear_error(tmp_path):
    from aisafety.prediction.onnx_model import load_onnx

    with pytest.raises(ConfigError, match="does not exist"):
        load_onnx(tmp_path / "nothing.onnx")


def test_converter_import_leaves_no_torchvision_stand_in():
    import sys

    from aisafety.prediction.onnx_model import _onnx2torch

    assert _onnx2torch().convert is not None
    stub = sys.modules.get("torchvision")
    assert stub is None or getattr(stub, "__file__", None) is not None


@needs_data
def test_conversion_mismatch_is_refused(monkeypatch):
    """A converter that gets an operator wrong must not be trusted for gradients."""
    from aisafety.prediction import onnx_model

    real = onnx_model.convert_onnx

    def broken(model, name=None):
        module = real(model, name)
        return nn.Sequential(module, _AddConstant(1e-3))

    monkeypatch.setattr(onnx_model, "convert_onnx", broken)
    with pytest.raises(onnx_model.OnnxConversionError, match="differs from onnxruntime"):
        onnx_model.load_onnx(
            MNISTFC / "mnist-net_256x2.onnx", gradients=True, input_shape=(1, 28, 28)
        )


class _AddConstant(nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.value


# -- Square attack -----------------------------------------------------------------------


def test_square_schedule_equals_torchattacks():
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is not installed")
    for queries in (100, 1000, 5000):
        peer = torchattacks.Square(nn.Identity(), n_queries=queries, p_init=0.8)
        for it in range(queries):
            assert p_selection(0.8, it, queries) == peer.p_selection(it), (queries, it)


def test_margin_loss_by_hand():
    logits = torch.tensor([[3.0, 1.0, 2.5], [0.0, 4.0, 1.0]])
    assert torch.equal(margin_loss(logits, torch.tensor([0, 0])), torch.tensor([0.5, -4.0]))


class _Counting(Predictor):
    """Counts every sample the attack shows the model."""

    def __init__(self, inner: Predictor):
        self.inner, self.seen = inner, 0
        self.name, self.num_classes = inner.name, inner.num_classes
        self.input_shape, self.device = inner.input_shape, inner.device
        self.capabilities = frozenset({Capability.SCORES, Capability.LABELS})

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += len(x)
        return self.inner.logits(x)


def test_square_properties(linear):
    data = EmbeddedMnist().load(None, "test").balanced_subset(40, seed=2)
    x, y, queries = data.x, data.y, 120
    counting = _Counting(linear)
    attack = SquareLinf(queries=queries, seed=3)
    result = attack(counting, x, y, 0.08)
    clean_correct = linear.predict(x) == y
    assert result.robust_accuracy <= float(clean_correct.float().mean())
    assert result.robust_accuracy < 0.6  # a real attack: a linear MNIST model is fragile
    assert float((result.x_adv - x).abs().max()) <= 0.08 + 1e-6
    assert float(result.x_adv.min()) >= 0 and float(result.x_adv.max()) <= 1
    # Budget and early stop: at most `queries` per sample, fooled samples stop early, and the
    # model saw exactly the queries reported + the clean pass and the final check (base class)
    assert int(result.steps.max()) <= queries
    fooled = result.success & clean_correct
    assert bool((result.steps[clean_correct & ~result.success] == queries).all())
    assert float((result.steps[fooled] < queries).float().mean()) > 0.5
    assert bool((result.steps[~clean_correct] == 0).all())
    assert counting.seen == int(result.steps.sum()) + 2 * len(x)
    # Same seed, same result; another seed, other random squares.
    again = attack(linear, x, y, 0.08)
    assert torch.equal(again.x_adv, result.x_adv) and torch.equal(again.steps, result.steps)
    other = SquareLinf(queries=queries, seed=4)(linear, x, y, 0.08)
    assert not torch.equal(other.x_adv, result.x_adv)
    # Every perturbed pixel sits on the budget's boundary (or the box), as Square's moves do.
    delta = (result.x_adv - x).abs()
    on_edge = (delta - 0.08).abs() < 1e-5
    boxed = (result.x_adv == 0) | (result.x_adv == 1)
    assert bool((on_edge | boxed | (delta == 0)).all())


def test_square_at_least_as_strong_as_torchattacks(linear):
    """torchattacks' Square (AutoAttack's port) draws one window and sign for the whole batch
    and does not redraw windows that change nothing; the reference, which we follow, draws
    per image. Same budget, so ours must fool at least as many samples (up to noise)."""
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is not installed")
    data = EmbeddedMnist().load(None, "test").balanced_subset(100, seed=1)
    x, y = data.x, data.y
    ours = SquareLinf(queries=100, seed=0)(linear, x, y, 0.08).robust_accuracy
    peer_attack = torchattacks.Square(linear.network, eps=0.08, n_queries=100, seed=0)
    with torch.no_grad():
        peer = float((linear.network(peer_attack(x, y)).argmax(1) == y).float().mean())
    clean = float((linear.predict(x) == y).float().mean())
    assert peer < clean  # the peer attack works here, so the comparison means something
    assert ours <= peer + 0.03, (ours, peer)


def test_square_zero_budget_and_needs_scores(zoo, subset):
    x, y = subset.x[:8], subset.y[:8]
    result = SquareLinf(queries=10)(zoo, x, y, 0.0)
    assert torch.equal(result.x_adv, x) and int(result.steps.sum()) == 0

    class LabelsOnly(_Counting):
        def __init__(self, inner):
            super().__init__(inner)
            self.capabilities = frozenset({Capability.LABELS})

    with pytest.raises(CapabilityError, match="square-linf"):
        SquareLinf(queries=10)(LabelsOnly(zoo), x, y, 0.1)
    with pytest.raises(AISafetyError, match="queries"):
        SquareLinf(queries=0)


def test_logits_in_range_skips_the_scan_of_values_but_checks_layout_and_scores():
    """A query attack's proposals are clamped into [0, 1] by construction: ``in_range``
    skips the value scan (a device synchronisation per query) and nothing else."""
    predictor = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), (1, 2, 2), 3)
    outside = torch.full((2, 1, 2, 2), 2.0)
    with pytest.raises(AISafetyError, match="lies in"):
        predictor.logits(outside)
    assert predictor.logits(outside, in_range=True).shape == (2, 3)
    with pytest.raises(AISafetyError, match="float32"):
        predictor.logits(outside.double(), in_range=True)
    with pytest.raises(AISafetyError, match="NaN or infinite scores"):
        predictor.logits(torch.full((2, 1, 2, 2), float("nan")), in_range=True)
