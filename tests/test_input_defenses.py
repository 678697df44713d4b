"""Input defenses against independent references, and adaptive (BPDA/EOT) evaluation.

References: Pillow's JPEG codec (libjpeg), scipy.ndimage's median, Gaussian and uniform
filters, per-image ``F.interpolate`` + ``F.pad``, scipy's binomial test, hand cases. The
last test is the point of the module: each defense lowers the success of a non-adaptive
PGD on the zoo model, and the adaptive (BPDA/EOT) PGD brings it back.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import scipy.ndimage as ndimage
import torch
import torch.nn.functional as F
from PIL import Image
from pillow_jpeg import pillow_round_trip  # testkit/
from scipy.stats import binomtest
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.cli import main
from aisafety.defense.base import InputDefense
from aisafety.defense.bit_depth import BitDepthReduction
from aisafety.defense.jpeg import JpegCompression
from aisafety.defense.jpeg_codec import (
    CHROMINANCE_TABLE,
    LUMINANCE_TABLE,
    jpeg_round_trip,
    quantization_table,
)
from aisafety.defense.median_filter import MedianFilter
from aisafety.defense.randomized_smoothing import (
    ABSTAIN,
    RandomizedSmoothing,
    two_sided_binomial_p,
)
from aisafety.defense.resize_pad import RandomResizePad, resize_and_place
from aisafety.defense.spatial_smoothing import SpatialSmoothing
from aisafety.errors import ConfigError
from aisafety.interfaces import DefenseSpec
from aisafety.loading import apply_defenses
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import TorchPredictor

INPUT_DEFENSES = {
    "bit-depth",
    "median-filter",
    "spatial-smoothing",
    "jpeg",
    "resize-pad",
    "randomized-smoothing",
}


def _linear(shape=(1, 28, 28), classes=10, seed=0) -> TorchPredictor:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), classes))
    return TorchPredictor(net, shape, classes, name="linear")


def _smooth_colour(n: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Natural-ish colour images: upsampled noise, so JPEG keeps most of them."""
    coarse = torch.rand(n, 3, 6, 6, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)


# --- JPEG ---------------------------------------------------------------------------------


@pytest.mark.parametrize("quality", [10, 50, 75, 100])
def test_quantization_tables_are_pillows(quality):
    """Pillow writes the IJG-scaled Annex K tables into the file (row-major order)."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="JPEG", quality=quality)
    tables = Image.open(buffer).quantization
    assert quantization_table(LUMINANCE_TABLE, quality).flatten().tolist() == list(tables[0])
    assert quantization_table(CHROMINANCE_TABLE, quality).flatten().tolist() == list(tables[1])


@pytest.mark.parametrize("quality", [10, 50, 75, 95])
def test_jpeg_gray_matches_pillow(embedded_mnist, quality):
    """libjpeg's integer DCT rounds differently from our float DCT, so a coefficient near a
    quantisation boundary can land one step apart: exact equality is not expected. The
    mean difference is about a tenth of a grey level: below 1/10 of what JPEG itself changes
    up to quality 75 (at 95 JPEG changes only half a level, so only the bound applies)."""
    x = embedded_mnist.x[:40]
    ours, pillow = jpeg_round_trip(x, quality), pillow_round_trip(x, quality)
    gap = (ours - pillow).abs().mean().item() * 255
    change = (x - pillow).abs().mean().item() * 255
    assert gap < 0.25, gap
    if quality <= 75:
        assert gap < change / 10


@pytest.mark.parametrize("quality", [25, 75, 95])
@pytest.mark.parametrize("size", [(32, 32), (30, 27)])
def test_jpeg_colour_matches_pillow(quality, size):
    """Colour adds libjpeg's fixed-point YCbCr and 2x2 chroma arithmetic: 0.4-0.9 levels of
    mean difference (measured), against 4-15 levels of JPEG's own change."""
    x = _smooth_colour(12, *size)
    ours, pillow = jpeg_round_trip(x, quality), pillow_round_trip(x, quality)
    gap = (ours - pillow).abs().mean().item() * 255
    change = (x - pillow).abs().mean().item() * 255
    assert gap < 1.25, gap
    if quality <= 75:
        assert gap < change / 5


def test_jpeg_is_batched_shape_and_range_preserving(embedded_mnist):
    defense = JpegCompression(_linear(), {"quality": 30})
    x = embedded_mnist.x[:8]
    out = defense.transform(x)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    # one image at a time gives the same result: no coupling across the batch
    single = torch.cat([defense.transform(x[i : i + 1]) for i in range(len(x))])
    torch.testing.assert_close(out, single, atol=1e-6, rtol=0)


def test_jpeg_gradient_is_zero_but_its_bpda_surrogate_is_not():
    defense = JpegCompression(_linear((1, 16, 16)), {"quality": 50})
    x = (0.3 + 0.4 * torch.rand(3, 1, 16, 16)).requires_grad_(True)  # nothing clips
    (grad_real,) = torch.autograd.grad(defense.transform(x).sum(), x)
    assert grad_real.abs().max() == 0  # rounding: the obfuscated gradient
    surrogate = defense.surrogate(x)
    torch.testing.assert_close(surrogate, defense.transform(x))  # same values
    # Without rounding, gray JPEG is DCT, q / q, inverse DCT: the identity, so BPDA's
    # gradient of the sum is exactly one per pixel.
    (grad_bpda,) = torch.autograd.grad(surrogate.sum(), x)
    torch.testing.assert_close(grad_bpda, torch.ones_like(x), atol=1e-5, rtol=0)


# --- feature squeezing and smoothing ------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_median_filter_matches_scipy(size):
    """Xu et al. used scipy's median_filter; even windows take the upper middle value."""
    x = torch.rand(3, 3, 11, 9, generator=torch.Generator().manual_seed(size))
    defense = MedianFilter(_linear((3, 11, 9)), {"size": size})
    expected = ndimage.median_filter(x.numpy(), size=(1, 1, size, size))
    np.testing.assert_array_equal(defense.transform(x).numpy(), expected)


def test_median_filter_hand_case_removes_salt():
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 1.0  # one salt pixel: a 3x3 median removes it
    x[0, 0, :, 0] = 1.0  # a full bright column survives only where it is the majority
    out = MedianFilter(_linear((1, 5, 5)), {"size": 3}).transform(x)
    assert out[0, 0, 2, 2] == 0
    # the mirrored edge doubles the column: 6 bright of 9 at the edge, 3 of 9 next to it
    assert out[0, 0, :, 0].tolist() == [1.0] * 5 and out[0, 0, :, 1].tolist() == [0.0] * 5


@pytest.mark.parametrize(
    "config",
    [{"sigma": 0.5}, {"sigma": 1.0}, {"sigma": 1.3, "truncate": 2.0}],
)
def test_gaussian_smoothing_matches_scipy(config):
    x = torch.rand(2, 3, 12, 10, generator=torch.Generator().manual_seed(1))
    defense = SpatialSmoothing(_linear((3, 12, 10)), config)
    expected = ndimage.gaussian_filter(
        x.numpy(), sigma=(0, 0, config["sigma"], config["sigma"]),
        truncate=config.get("truncate", 4.0),
    )  # fmt: skip
    np.testing.assert_allclose(defense.transform(x).numpy(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_mean_smoothing_matches_scipy(size):
    x = torch.rand(2, 1, 9, 9, generator=torch.Generator().manual_seed(2))
    defense = SpatialSmoothing(_linear((1, 9, 9)), {"kernel": "mean", "size": size})
    expected = ndimage.uniform_filter(x.numpy(), size=(1, 1, size, size))
    np.testing.assert_allclose(defense.transform(x).numpy(), expected, atol=1e-6, rtol=0)


def test_mean_smoothing_hand_case():
    x = torch.zeros(1, 1, 7, 7)
    x[0, 0, 3, 3] = 0.9
    out = SpatialSmoothing(_linear((1, 7, 7)), {"kernel": "mean", "size": 3}).transform(x)
    expected = torch.zeros(7, 7)
    expected[2:5, 2:5] = 0.1  # the impulse spreads evenly over its 3x3 neighbourhood
    torch.testing.assert_close(out[0, 0], expected)


def test_bit_depth_hand_case():
    x = torch.tensor([0.0, 0.2, 0.49, 0.51, 0.8, 1.0]).view(1, 1, 1, 6)
    one_bit = BitDepthReduction(_linear((1, 1, 6)), {"bits": 1}).transform(x)
    assert one_bit.flatten().tolist() == [0, 0, 0, 1, 1, 1]
    two_bits = BitDepthReduction(_linear((1, 1, 6)), {"bits": 2}).transform(x)
    torch.testing.assert_close(two_bits.flatten(), torch.tensor([0, 1, 1, 2, 2, 3]) / 3)


# --- random resize and pad ----------------------------------------------------------------


def test_resize_and_place_is_interpolate_then_pad_per_image():
    x = torch.rand(5, 3, 10, 13, generator=torch.Generator().manual_seed(3))
    sizes = torch.tensor([[10, 13], [12, 15], [11, 14], [13, 17], [14, 18]])
    tops, lefts = torch.tensor([0, 1, 2, 0, 0]), torch.tensor([0, 3, 1, 1, 0])
    canvas = (14, 18)
    out = resize_and_place(x, sizes, tops, lefts, canvas)
    for i in range(len(x)):
        (rows, cols), top, left = sizes[i].tolist(), int(tops[i]), int(lefts[i])
        resized = F.interpolate(x[i : i + 1], size=(rows, cols), mode="nearest-exact")
        padded = F.pad(resized, (left, canvas[1] - left - cols, top, canvas[0] - top - rows))
        torch.testing.assert_close(out[i : i + 1], padded, atol=0, rtol=0)


def test_resize_pad_draws_stay_in_xie_ranges_and_are_seeded(embedded_mnist):
    defense = RandomResizePad(_linear(), {"canvas_scale": 1.25, "seed": 7})
    sizes, tops, lefts = defense.draw(500, (28, 28), (35, 35))
    assert sizes.min() >= 28 and sizes.max() <= 34  # [input side, canvas side)
    assert (sizes[:, 0] == sizes[:, 1]).all()  # square images keep their aspect
    assert len(sizes[:, 0].unique()) == 7  # every side is drawn
    assert (tops >= 0).all() and (tops + sizes[:, 0] <= 35).all()
    assert (lefts >= 0).all() and (lefts + sizes[:, 1] <= 35).all()
    x = embedded_mnist.x[:16]
    out = RandomResizePad(_linear(), {"canvas_scale": 1.25, "seed": 7}).transform(x)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    again = RandomResizePad(_linear(), {"canvas_scale": 1.25, "seed": 7}).transform(x)
    other = RandomResizePad(_linear(), {"canvas_scale": 1.25, "seed": 8}).transform(x)
    torch.testing.assert_close(out, again, atol=0, rtol=0)
    assert not torch.equal(out, other)


# --- randomized smoothing -----------------------------------------------------------------


class _Brightness(nn.Module):
    """Class 1 if the mean pixel is above 1/2, else class 0: its vote is known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        score = x.flatten(1).mean(1, keepdim=True) - 0.5
        return torch.cat([-score, score], dim=1) * 100


def _brightness_model() -> TorchPredictor:
    return TorchPredictor(_Brightness(), (1, 8, 8), 2, name="brightness")


def test_binomial_p_values_match_scipy():
    k = np.array([0, 3, 10, 17, 20, 50, 51, 60, 99, 100])
    n = np.array([20, 20, 20, 20, 20, 100, 100, 100, 100, 100])
    expected = [binomtest(int(a), int(b), 0.5).pvalue for a, b in zip(k, n, strict=True)]
    np.testing.assert_allclose(two_sided_binomial_p(k, n), expected, rtol=1e-9)


def test_smoothing_votes_and_abstains_as_cohen_predict():
    defense = RandomizedSmoothing(
        _brightness_model(), {"sigma": 0.25, "samples": 200, "alpha": 0.001}
    )
    # Noise moves the mean of 64 pixels by sigma / 8 = 0.03: far from the boundary, the
    # vote is unanimous; exactly on it, each class wins half the time.
    x = torch.stack([torch.full((1, 8, 8), v) for v in (0.1, 0.9, 0.5)])
    answer = defense.predict_smoothed(x)
    assert answer.counts[0].tolist() == [200, 0] and answer.counts[1].tolist() == [0, 200]
    assert answer.labels[:2].tolist() == [0, 1] and not answer.abstained[:2].any()
    assert answer.labels[2] == ABSTAIN and answer.abstained[2]
    assert 60 < answer.counts[2, 0] < 140
    expected = binomtest(int(answer.counts[2].max()), 200, 0.5).pvalue
    assert answer.p_values[2].item() == pytest.approx(expected, rel=1e-5)
    # As a predictor: log vote shares with add-1/2 smoothing, argmax = plurality vote.
    with torch.no_grad():
        probs = defense.probs(x[:2])
    torch.testing.assert_close(probs[0], torch.tensor([200.5, 0.5]) / 201)


def test_smoothing_is_seeded_and_chunking_does_not_change_votes():
    x = torch.full((3, 1, 8, 8), 0.5)
    config = {"sigma": 0.25, "samples": 50, "seed": 3}
    a = RandomizedSmoothing(_brightness_model(), config).votes(x)
    b = RandomizedSmoothing(_brightness_model(), config).votes(x)
    c = RandomizedSmoothing(_brightness_model(), {**config, "seed": 4}).votes(x)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a.sum(1) == 50).all()


def test_smoothing_gradient_is_zero_without_bpda_and_soft_with_it():
    x = torch.full((2, 1, 8, 8), 0.45).requires_grad_(True)
    naive = RandomizedSmoothing(_brightness_model(), {"samples": 20})
    (grad,) = torch.autograd.grad(naive._logits(x)[:, 1].sum(), x)
    assert grad.abs().max() == 0
    adaptive = RandomizedSmoothing(
        _brightness_model(), {"samples": 20, "bpda": True, "eot_samples": 8}
    )
    logits = adaptive._logits(x)
    with torch.no_grad():  # the forward value is still the vote
        torch.testing.assert_close(logits.exp().sum(1), torch.ones(2))
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), x)
    assert (grad > 0).all()  # brighter pixels raise the soft vote for "bright"


# --- BPDA and EOT mechanics ---------------------------------------------------------------


def test_bpda_keeps_predictions_and_passes_the_gradient_at_the_transformed_point(
    zoo_predictor, mnist_subset
):
    """BPDA with the identity: d f(g(x)) / dx is taken as f'(g(x)) (Athalye et al. 2018)."""
    x = mnist_subset(10).x
    plain = BitDepthReduction(zoo_predictor, {"bits": 3})
    bpda = BitDepthReduction(zoo_predictor, {"bits": 3, "bpda": True})
    assert torch.equal(plain.predict(x), bpda.predict(x))
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(bpda._logits(xg)[:, 0].sum(), xg)
    squeezed = plain.transform(x).requires_grad_(True)
    (expected,) = torch.autograd.grad(zoo_predictor._logits(squeezed)[:, 0].sum(), squeezed)
    torch.testing.assert_close(grad, expected)
    (obfuscated,) = torch.autograd.grad(plain._logits(xg)[:, 0].sum(), xg)
    assert obfuscated.abs().max() == 0


def test_eot_averages_the_logits_of_k_draws(zoo_predictor, mnist_subset):
    x = mnist_subset(6).x
    eot = RandomResizePad(zoo_predictor, {"seed": 5, "eot_samples": 4, "canvas_scale": 1.2})
    logits = eot._logits(x.clone().requires_grad_(True))
    manual = RandomResizePad(zoo_predictor, {"seed": 5, "canvas_scale": 1.2})
    draws = manual.transform(x.repeat(4, 1, 1, 1))  # the same stream, drawn at once
    with torch.no_grad():
        expected = zoo_predictor._logits(draws).view(4, 6, -1).mean(0)
    torch.testing.assert_close(logits.detach(), expected)
    with torch.no_grad():  # a prediction is one draw, never the EOT average
        assert eot._logits(x).shape == (6, 10)


# --- registration, plans, errors ----------------------------------------------------------


def test_every_input_defense_is_listed_with_its_kind(capsys):
    assert main(["list", "defenses", "--format", "json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert set(listed) >= INPUT_DEFENSES
    for name in INPUT_DEFENSES:
        assert listed[name]["kind"] == "input" and listed[name]["description"]
        assert {"bpda", "eot_samples"} <= set(listed[name]["config"])


@pytest.mark.parametrize("name", sorted(INPUT_DEFENSES))
def test_plan_wraps_a_model_and_keeps_shape_and_range(name, mnist_subset):
    spec = DefenseSpec(name=name, config={"bpda": True})
    defended = apply_defenses(_linear(), (spec,), default_registry())
    assert isinstance(defended, InputDefense) and defended.name == f"linear+{name}(bpda=True)"
    x = mnist_subset(10).x
    view = defended.transform(x)
    assert view.shape == x.shape
    if name != "randomized-smoothing":  # Gaussian noise is deliberately not clipped
        assert view.min() >= 0 and view.max() <= 1
    assert defended.predict(x).shape == (10,)


def test_bad_defense_config_names_the_defense_and_the_field():
    with pytest.raises(ConfigError, match=r"defense 'jpeg': quality.*Valid settings"):
        JpegCompression(_linear(), {"quality": 0})
    with pytest.raises(ConfigError, match="eot_samples"):
        RandomResizePad(_linear(), {"eot_samples": 0})


# --- the point: non-adaptive attacks fail, adaptive ones do not ----------------------------

EPS = 0.15
# (defense, config, adaptive settings, what a non-adaptive attacker does)
# "naive": PGD through the defended model with the gradient PyTorch computes (zero for
# rounding and votes: the obfuscated gradient). "oblivious": PGD crafted on the undefended
# model, then shown to the defended one; the only non-adaptive attack on a transform whose
# gradient is exact (median, smoothing) or merely random (resize-pad).
CASES = [
    ("jpeg", {"quality": 50}, {"bpda": True}, "naive"),
    ("bit-depth", {"bits": 3}, {"bpda": True}, "naive"),
    ("median-filter", {"size": 2}, {"bpda": True}, "oblivious"),
    ("spatial-smoothing", {"sigma": 1.0}, {"bpda": True}, "oblivious"),
    ("resize-pad", {"canvas_scale": 1.25}, {"eot_samples": 16}, "oblivious"),
    (
        "randomized-smoothing",
        {"sigma": 0.25, "samples": 8},
        {"bpda": True, "eot_samples": 4},
        "naive",
    ),
]


@pytest.fixture(scope="module")
def undefended_attack(zoo_predictor, mnist_subset):
    data = mnist_subset(60)
    result = _pgd()(zoo_predictor, data.x, data.y, EPS)
    return data, result


def _pgd() -> PGDLinf:
    return PGDLinf(steps=10, step_size=EPS / 4, seed=0)


@pytest.mark.parametrize(("name", "config", "adaptive", "non_adaptive"), CASES)
def test_defense_stops_non_adaptive_pgd_and_falls_to_adaptive_pgd(
    name, config, adaptive, non_adaptive, zoo_predictor, undefended_attack
):
    data, undefended = undefended_attack
    registry = default_registry()
    defended = registry.create("defense", name, config, zoo_predictor)
    if non_adaptive == "naive":
        stopped = _pgd()(defended, data.x, data.y, EPS).success.float().mean().item()
    else:
        with torch.no_grad():
            stopped = (defended.predict(undefended.x_adv) != data.y).float().mean().item()
    attacker = registry.create("defense", name, {**config, **adaptive}, zoo_predictor)
    broken = _pgd()(attacker, data.x, data.y, EPS).success.float().mean().item()
    baseline = undefended.success.float().mean().item()
    print(
        f"RESULT {name}: undefended {baseline:.3f} non-adaptive {stopped:.3f} adaptive {broken:.3f}"
    )
    assert baseline >= 0.75
    assert stopped <= baseline - 0.2, (stopped, baseline)
    assert broken >= stopped + 0.15, (broken, stopped)
