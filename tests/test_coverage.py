"""Neuron coverage (KMNCov, NBCov, SNACov, TKNCov): exact hand cases and invariants.

The hand cases use (a) neuron-value matrices and bounds written out here, with the expected
coverage counted by hand in the comments, and (b) a tiny conv + linear model whose neurons are
known functions of the pixels (channel means and single pixels), so the expected values are
computed from the images with numpy, independently of the code under test. The invariants run
on the zoo model: coverage lies in [0, 1], the profile data covers itself completely and has no
corner cases, and adding inputs never lowers coverage.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.errors import ConfigError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.neuron_coverage import (
    KMultisectionNeuronCoverage,
    NeuronBoundaryCoverage,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
    corner_neurons,
    covered_sections,
    top_k_neurons,
)
from aisafety.evaluation.neurons import NeuronBounds, default_layers
from aisafety.prediction.torch_module import TorchPredictor

# --- (a) hand-written neuron values ----------------------------------------------------------
# Four neurons, k = 4 sections each.
#   n0: [0, 1]   sections [0,.25) [.25,.5) [.5,.75) [.75,1]   values 0.0 0.3 1.0  -> 3 sections
#   n1: [0, 2]   sections of width .5                         values 2.5 -0.1 0.5 -> 1 section,
#                                                             upper and lower corner
#   n2: [1, 1]   a point: every section is {1}                values 1.0 0.9 1.0  -> 4 sections,
#                                                             lower corner
#   n3: [-1, 1]  sections of width .5                         values 0.0 .25 0.5  -> 2 sections
BOUNDS = NeuronBounds(
    layers=("a", "b"),
    sizes=(2, 2),
    low=torch.tensor([0.0, 0.0, 1.0, -1.0]),
    high=torch.tensor([1.0, 2.0, 1.0, 1.0]),
    n_profile=0,
)
VALUES = torch.tensor(
    [
        [0.0, 2.5, 1.0, 0.0],
        [0.3, -0.1, 0.9, 0.25],
        [1.0, 0.5, 1.0, 0.5],
    ]
)


def test_kmn_sections_by_hand():
    covered = covered_sections(VALUES, BOUNDS, k=4)
    assert covered.tolist() == [
        [True, True, False, True],
        [False, True, False, False],
        [True, True, True, True],
        [False, False, True, True],
    ]
    assert covered.double().mean().item() == 10 / 16


def test_corner_neurons_by_hand():
    upper, lower = corner_neurons(VALUES, BOUNDS)
    assert upper.tolist() == [False, True, False, False]
    assert lower.tolist() == [False, True, True, False]
    # NBCov = (1 + 2) / (2 * 4), SNACov = 1 / 4
    assert (upper.sum() + lower.sum()).item() / 8 == 3 / 8


def test_top_k_by_hand_and_ties_go_to_the_lower_index():
    # layer a = n0, n1; layer b = n2, n3. Top-1 per input: (n1, n2), (n0, n2), (n0, n2).
    assert top_k_neurons(VALUES, (2, 2), 1).tolist() == [True, True, True, False]
    assert top_k_neurons(VALUES, (2, 2), 2).all()
    assert top_k_neurons(VALUES, (2, 2), 5).all()  # k beyond the layer size: the whole layer
    ties = torch.tensor([[0.5, 0.5, 0.1]])
    assert top_k_neurons(ties, (3,), 1).tolist() == [True, False, False]


def test_value_exactly_at_high_is_in_the_last_section_and_outside_is_no_section():
    bounds = NeuronBounds(("a",), (1,), torch.tensor([0.0]), torch.tensor([1.0]), 0)
    at_high = covered_sections(torch.tensor([[1.0]]), bounds, k=3)
    assert at_high.tolist() == [[False, False, True]]
    outside = covered_sections(torch.tensor([[1.5], [-0.5]]), bounds, k=3)
    assert not outside.any()


# --- (b) a model whose neurons are known functions of the pixels -------------------------------


def pixel_model() -> TorchPredictor:
    """Input (1, 2, 2). Layer '1' (ReLU after a 1x1 conv): channels x and 1 - x, so its
    neurons are mean(x) and 1 - mean(x). Layer '4' (ReLU after a linear): pixels x[0], x[3]."""
    conv = nn.Conv2d(1, 2, 1)
    pick = nn.Linear(8, 2)
    head = nn.Linear(2, 2)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
        conv.bias.copy_(torch.tensor([0.0, 1.0]))
        pick.weight.zero_()
        pick.bias.zero_()
        pick.weight[0, 0] = 1.0  # channel 0, pixel 0
        pick.weight[1, 3] = 1.0  # channel 0, pixel 3
        head.weight.copy_(torch.eye(2))
        head.bias.zero_()
    module = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), pick, nn.ReLU(), head)
    return TorchPredictor(module, (1, 2, 2), 2, name="pixel-model")


def hand_neurons(images: np.ndarray) -> np.ndarray:
    """The four neurons of ``pixel_model`` computed from the pixels, without the model."""
    flat = images.reshape(len(images), 4)
    mean = flat.mean(1)
    return np.stack([mean, 1 - mean, flat[:, 0], flat[:, 3]], 1)


PROFILE = np.array([[0.0, 0.4, 0.4, 0.8], [0.8, 0.4, 0.4, 0.0], [0.4, 0.8, 0.8, 0.4]])
TEST = np.array([[1.0, 1.0, 1.0, 1.0], [0.1, 0.5, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3]])


def dataset(rows: np.ndarray, name: str) -> LoadedDataset:
    x = torch.from_numpy(rows).float().view(-1, 1, 2, 2)
    return LoadedDataset(name, x, torch.zeros(len(rows), dtype=torch.long), ("0", "1"))


def pixel_context(test=TEST, profile=PROFILE) -> EvaluationContext:
    return EvaluationContext(
        pixel_model(),
        dataset(test, "test"),
        make_attack=None,  # type: ignore[arg-type]  # clean data only
        batch_size=2,  # several batches: results must not depend on batching
        load_profile=lambda: dataset(profile, "profile"),
    )


def clean(metric_cls, **config):
    return metric_cls(data="clean", **config)


def test_default_layers_are_the_activation_modules():
    assert default_layers(pixel_model()) == ("1", "4")


def test_model_neurons_are_channel_means_and_units():
    ctx = pixel_context()
    outputs = ctx.neuron_outputs(("1", "4"))
    np.testing.assert_allclose(outputs.numpy(), hand_neurons(TEST), atol=1e-6)
    bounds = ctx.neurons.bounds(("1", "4"))
    profile = hand_neurons(PROFILE)
    np.testing.assert_allclose(bounds.low.numpy(), profile.min(0), atol=1e-6)
    np.testing.assert_allclose(bounds.high.numpy(), profile.max(0), atol=1e-6)
    assert bounds.sizes == (2, 2) and bounds.n_profile == 3


def test_coverage_metrics_on_the_pixel_model_by_hand():
    # Profile neurons: mean in [0.4, 0.6], 1 - mean in [0.4, 0.6], x0 in [0, 0.8], x3 in [0, 0.8].
    # Test neurons (mean, 1-mean, x0, x3):  (1, 0, 1, 1)  (.3, .7, .1, .1)  (.3, .7, .3, .3)
    #   upper corners: mean (1 > .6), 1-mean (.7), x0 (1 > .8), x3 (1)   -> 4
    #   lower corners: mean (.3 < .4), 1-mean (0 < .4)                    -> 2
    #   k = 2 sections inside: x0 and x3 hit [0, .4) with .1 and .3       -> 2 of 8
    ctx = pixel_context()
    assert clean(NeuronBoundaryCoverage).compute(ctx)[0].value == 6 / 8
    assert clean(StrongNeuronActivationCoverage).compute(ctx)[0].value == 4 / 4
    assert clean(KMultisectionNeuronCoverage, k=2).compute(ctx)[0].value == 2 / 8
    # top-1 per layer: layer '1' -> mean, 1-mean, 1-mean; layer '4' -> x0 (ties to x0)
    assert clean(TopKNeuronCoverage, k=1).compute(ctx)[0].value == 3 / 4


def test_coverage_value_records_its_setting_and_sizes():
    value = clean(KMultisectionNeuronCoverage, k=2).compute(pixel_context())[0]
    assert value.metric == "kmncov(data=clean,k=2)"
    assert value.details == {"neurons": 4, "profile_samples": 3}
    assert value.n_samples == 3 and value.attack is None


def test_missing_profile_data_is_a_clear_error():
    ctx = EvaluationContext(pixel_model(), dataset(TEST, "t"), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="profile_dataset"):
        clean(NeuronBoundaryCoverage).compute(ctx)[0]


def test_unknown_layer_is_a_clear_error():
    with pytest.raises(ConfigError, match="no layer"):
        clean(NeuronBoundaryCoverage, layers=["nope"]).compute(pixel_context())[0]


class TinyTransformer(nn.Module):
    """A ViT's shape of problem: nn.MultiheadAttention uses its out_proj's weights in a
    functional call, so out_proj's forward (and a hook on it) never runs."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.block = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.block(self.embed(x.reshape(len(x), 4, 4))).mean(1))


def test_a_transformers_out_proj_is_not_a_default_layer_and_never_a_keyerror():
    """tkncov on a TransformerEncoderLayer net failed with KeyError 'block.self_attn.out_proj'
    after the attacks had run: it was a default layer, and its hook never fired."""
    torch.manual_seed(0)
    predictor = TorchPredictor(TinyTransformer().eval(), (1, 4, 4), 10)
    layers = default_layers(predictor)  # no activation modules: the weight layers but the last
    assert layers == ("embed", "block.linear1", "block.linear2")
    x = torch.rand(3, 1, 4, 4)
    assert predictor.features(x, layers)["block.linear1"].shape == (3, 4, 16)
    with pytest.raises(ConfigError, match=r"\['block.self_attn.out_proj'\] never ran"):
        predictor.features(x, ["block.self_attn.out_proj"])


def test_bounds_and_outputs_are_computed_once_for_all_coverage_metrics():
    ctx = pixel_context()
    for metric in (KMultisectionNeuronCoverage, NeuronBoundaryCoverage):
        clean(metric).compute(ctx)[0]
    clean(StrongNeuronActivationCoverage).compute(ctx)[0]
    clean(TopKNeuronCoverage).compute(ctx)[0]
    assert ctx.neurons.passes == {"outputs": 1, "deviation": 0, "bounds": 1}


# --- invariants on the zoo model and the shipped training subset -------------------------------


@pytest.fixture(scope="module")
def train_subset() -> LoadedDataset:
    return EmbeddedMnist().load(None, "train").balanced_subset(300, seed=1)


def zoo_context(zoo_predictor, data: LoadedDataset, profile: LoadedDataset):
    return EvaluationContext(
        zoo_predictor, data, None, batch_size=128, load_profile=lambda: profile
    )  # type: ignore[arg-type]


ALL = (
    (KMultisectionNeuronCoverage, {"k": 1}),
    (KMultisectionNeuronCoverage, {"k": 10}),
    (NeuronBoundaryCoverage, {}),
    (StrongNeuronActivationCoverage, {}),
    (TopKNeuronCoverage, {"k": 2}),
)


def test_profile_data_covers_its_own_range_and_has_no_corner_cases(zoo_predictor, train_subset):
    ctx = zoo_context(zoo_predictor, train_subset, train_subset)
    assert clean(KMultisectionNeuronCoverage, k=1).compute(ctx)[0].value == 1.0
    assert clean(NeuronBoundaryCoverage).compute(ctx)[0].value == 0.0
    assert clean(StrongNeuronActivationCoverage).compute(ctx)[0].value == 0.0


def test_zoo_coverage_in_unit_interval_and_monotone_in_the_test_set(
    zoo_predictor, train_subset, mnist_subset
):
    small, large = mnist_subset(50), mnist_subset(200)
    assert set(map(tuple, small.x.flatten(1).tolist())) <= set(
        map(tuple, large.x.flatten(1).tolist())
    )
    ctx_small = zoo_context(zoo_predictor, small, train_subset)
    ctx_large = zoo_context(zoo_predictor, large, train_subset)
    for metric_cls, config in ALL:
        a = clean(metric_cls, **config).compute(ctx_small)[0]
        b = clean(metric_cls, **config).compute(ctx_large)[0]
        assert 0.0 <= a.value <= b.value <= 1.0, (a.metric, a.value, b.value)
    nbc = clean(NeuronBoundaryCoverage).compute(ctx_large)[0].value
    snac = clean(StrongNeuronActivationCoverage).compute(ctx_large)[0].value
    assert snac / 2 <= nbc  # NBC = (upper + lower) / 2N >= upper / 2N
    assert ctx_large.neurons.sizes(default_layers(zoo_predictor)) == (16, 32, 100)


# --- the shipped training subset ----------------------------------------------------------------

RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"


def test_embedded_train_split_is_500_per_class():
    data = EmbeddedMnist().load(None, "train")
    assert data.x.shape == (5000, 1, 28, 28)
    assert torch.bincount(data.y).tolist() == [500] * 10


@pytest.mark.skipif(not RAW.is_dir(), reason="raw MNIST files not available")
def test_embedded_train_split_is_the_first_500_of_each_class_of_mnist_train():
    def read(name: str, offset: int) -> np.ndarray:
        return np.frombuffer(gzip.open(RAW / name).read(), np.uint8, offset=offset)

    images = read("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    labels = read("train-labels-idx1-ubyte.gz", 8)
    index = np.sort(np.concatenate([np.flatnonzero(labels == c)[:500] for c in range(10)]))
    data = EmbeddedMnist().load(None, "train")
    np.testing.assert_array_equal((data.x[:, 0] * 255).round().byte().numpy(), images[index])
    np.testing.assert_array_equal(data.y.numpy(), labels[index])


def test_embedded_unknown_split_names_the_valid_ones():
    with pytest.raises(ConfigError, match="'test', 'train'"):
        EmbeddedMnist().load(None, "validation")


def test_profile_loading_error_says_how_to_fix_it():
    def no_train_split():
        raise ConfigError("dataset 'x' has no 'train' split")

    ctx = EvaluationContext(pixel_model(), dataset(TEST, "t"), None, load_profile=no_train_split)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no 'train' split.*'profile_dataset'"):
        clean(KMultisectionNeuronCoverage).compute(ctx)[0]


def reference_coverages(values: np.ndarray, low: np.ndarray, high: np.ndarray, sizes, k: int):
    """DeepGauge's definitions neuron by neuron with Python sets (slow, obviously right)."""
    sections, upper, lower = 0, 0, 0
    for n in range(values.shape[1]):
        hit = set()
        for v in values[:, n]:
            if low[n] <= v <= high[n]:
                if high[n] == low[n]:
                    hit.update(range(k))
                else:
                    hit.add(min(int((v - low[n]) / (high[n] - low[n]) * k), k - 1))
        sections += len(hit)
        upper += bool((values[:, n] > high[n]).any())
        lower += bool((values[:, n] < low[n]).any())
    top, start = set(), 0
    for size in sizes:
        for row in values[:, start : start + size]:
            top.update(start + i for i in sorted(range(size), key=lambda i: -row[i])[:2])
        start += size
    n_neurons = values.shape[1]
    return {
        "kmncov": sections / (k * n_neurons),
        "nbcov": (upper + lower) / (2 * n_neurons),
        "snacov": upper / n_neurons,
        "tkncov": len(top) / n_neurons,
    }


def test_zoo_coverage_matches_a_neuron_by_neuron_reference(
    zoo_predictor, train_subset, mnist_subset
):
    ctx = zoo_context(zoo_predictor, mnist_subset(60), train_subset)
    layers = default_layers(zoo_predictor)
    values = ctx.neuron_outputs(layers).double().numpy()
    bounds = ctx.neurons.bounds(layers)
    expected = reference_coverages(
        values, bounds.low.double().numpy(), bounds.high.double().numpy(), bounds.sizes, k=5
    )
    got = {
        "kmncov": clean(KMultisectionNeuronCoverage, k=5).compute(ctx)[0].value,
        "nbcov": clean(NeuronBoundaryCoverage).compute(ctx)[0].value,
        "snacov": clean(StrongNeuronActivationCoverage).compute(ctx)[0].value,
        "tkncov": clean(TopKNeuronCoverage, k=2).compute(ctx)[0].value,
    }
    assert got == pytest.approx(expected, abs=1e-12)
    assert got["nbcov"] > 0 and 0 < got["kmncov"] < 1  # a non-trivial case
