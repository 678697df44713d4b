"""Perturbation Sensitivity Distance: exact hand values, a loop reference, invariants.

The reference below walks every pixel with numpy, pads with numpy's 'reflect' and takes
``np.std`` of the 3x3 region, as Luo et al. and the AISafety/DEEPSEC code describe; the
implementation under test uses pooled moments instead, so they are independent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.perturbation_sensitivity import (
    PerturbationSensitivityDistance,
    local_std,
    perturbation_sensitivity_distance,
)
from aisafety.interfaces import AttackSpec
from aisafety.prediction.torch_module import TorchPredictor
from tests.test_metrics import FixedAttack  # adversarial images chosen in advance


def reference_psd(x: np.ndarray, x_adv: np.ndarray, min_std: float, inverse: bool) -> float:
    """One image (C, H, W): sum_j |delta_j| * Sen(R(x_j)), pixel by pixel."""
    total = 0.0
    for channel, adv_channel in zip(x, x_adv, strict=True):
        padded = np.pad(channel, 1, mode="reflect")
        for i in range(channel.shape[0]):
            for j in range(channel.shape[1]):
                std = np.std(padded[i : i + 3, j : j + 3])
                weight = 1 / max(std, min_std) if inverse else std
                total += abs(adv_channel[i, j] - channel[i, j]) * weight
    return total


def test_flat_image_weights_by_the_floor_exactly():
    # A flat region has std 0, so the weight is 1 / min_std: 0.1 * 255 + 0.2 * 255.
    x = torch.full((1, 1, 4, 4), 0.5)
    x_adv = x.clone()
    x_adv[0, 0, 1, 2] += 0.1
    x_adv[0, 0, 3, 3] -= 0.2
    value = perturbation_sensitivity_distance(x, x_adv).item()
    assert value == pytest.approx(0.3 * 255, rel=1e-6)
    assert perturbation_sensitivity_distance(x, x_adv, sensitivity="std").item() == 0.0


def test_local_std_of_a_checkerboard_by_hand():
    # 3x3 checkerboard, 1 at the corners and centre: the centre's region holds five 1s and four
    # 0s, std = sqrt(5/9 * 4/9) = sqrt(20)/9. Reflection keeps the corners' regions the same.
    board = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]).view(1, 1, 3, 3)
    std = local_std(board, 3)[0, 0]
    assert std[1, 1].item() == pytest.approx(np.sqrt(20) / 9, abs=1e-12)
    assert std[0, 0].item() == pytest.approx(np.sqrt(20) / 9, abs=1e-12)
    # edge pixel (0, 1): reflected region rows (1,0,1)->(0,1,0),(1,0,1),(0,1,0): four 1s, five 0s
    assert std[0, 1].item() == pytest.approx(np.sqrt(20) / 9, abs=1e-12)


@pytest.mark.parametrize("sensitivity", ["inverse-std", "std"])
def test_matches_pixel_loop_reference_on_random_colour_images(sensitivity):
    rng = np.random.default_rng(0)
    x = rng.random((3, 3, 7, 6))
    x[0, :, :3, :3] = 0.25  # a flat patch: the floor must be used there
    x_adv = np.clip(x + rng.uniform(-0.1, 0.1, x.shape), 0, 1)
    got = perturbation_sensitivity_distance(
        torch.from_numpy(x).float(), torch.from_numpy(x_adv).float(), sensitivity=sensitivity
    ).numpy()
    x32, adv32 = x.astype(np.float32).astype(np.float64), x_adv.astype(np.float32)
    expected = [
        reference_psd(a, b.astype(np.float64), 1 / 255, sensitivity == "inverse-std")
        for a, b in zip(x32, adv32, strict=True)
    ]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_zero_perturbation_is_zero_and_psd_is_linear_in_the_perturbation():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.random((2, 1, 6, 6))).float() * 0.5
    delta = torch.from_numpy(rng.uniform(-0.1, 0.1, (2, 1, 6, 6))).float()
    assert (perturbation_sensitivity_distance(x, x) == 0).all()
    once = perturbation_sensitivity_distance(x, x + delta)
    twice = perturbation_sensitivity_distance(x, x + 2 * delta)
    torch.testing.assert_close(twice, 2 * once, rtol=1e-5, atol=0)


def test_metric_averages_over_successful_examples_only():
    # Logits = (pixel 0, pixel 1) of a flat-ish 2x2 image. Sample 0: correct (class 0), flipped
    # by raising pixel 1 by .4 -> successful, PSD = .4 * 255 (flat image). Sample 1: correct,
    # perturbed by .1 but not flipped -> left out. Sample 2: wrong when clean -> left out.
    head = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]))
    predictor = TorchPredictor(nn.Sequential(nn.Flatten(), head), (1, 2, 2), 2, name="pix")
    clean = torch.tensor([[0.5] * 4, [0.6, 0.3, 0.3, 0.3], [0.2, 0.4, 0.4, 0.4]])
    adv = clean.clone()
    adv[0, 1] += 0.4
    adv[1, 1] += 0.1
    adv[2, 0] += 0.3
    clean, adv = clean.view(-1, 1, 2, 2), adv.view(-1, 1, 2, 2)
    data = LoadedDataset("hand", clean, torch.tensor([0, 0, 0]), ("0", "1"))
    ctx = EvaluationContext(predictor, data, lambda s: FixedAttack(clean, adv))
    value = PerturbationSensitivityDistance().compute(ctx, AttackSpec(name="fixed"), 1.0)[0]
    assert value.n_samples == 1
    assert value.value == pytest.approx(0.4 * 255, rel=1e-5)
    assert value.direction.value == "higher"
    chunked = EvaluationContext(predictor, data, lambda s: FixedAttack(clean, adv), batch_size=1)
    again = PerturbationSensitivityDistance().compute(chunked, AttackSpec(name="fixed"), 1.0)[0]
    assert again.value == value.value


def test_even_region_is_a_clear_error():
    with pytest.raises(ConfigError, match="region must be odd"):
        PerturbationSensitivityDistance(region=4)
