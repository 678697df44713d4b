"""SmoothAdv and ADRE against hand-computed losses and steps, on nets small enough to do by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aisafety.defense.training.adre import adre_loss
from aisafety.defense.training.base import TrainingStep
from aisafety.defense.training.smoothadv import (
    SmoothAdv,
    smoothadv_examples,
    soft_smoothed_loss,
)


def linear_net(w: list[list[float]]) -> nn.Module:
    """Two logits w x of a flattened (1, 1, 2) input, no bias."""
    layer = nn.Linear(2, len(w), bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(w))
    return nn.Sequential(nn.Flatten(), layer)


def test_soft_smoothed_loss_by_hand():
    """Logits (x0 + d0, 0) for draws d = +-0.5 at x0 = 0: softmax_0 = 1/(1 + e^{-0.5}) and
    1/(1 + e^{0.5}), whose mean is exactly 1/2; the loss is log 2 (and the mean is taken
    before the log: each draw's own loss would average to more)."""
    net = linear_net([[1.0, 0.0], [0.0, 0.0]])
    x = torch.zeros(1, 1, 1, 2)
    noise = torch.tensor([[[[[0.5, 0.0]]]], [[[[-0.5, 0.0]]]]])
    got = soft_smoothed_loss(net, x, torch.tensor([0]), noise)
    assert got.item() == pytest.approx(math.log(2), rel=1e-6)
    each = [math.log1p(math.exp(-0.5)), math.log1p(math.exp(0.5))]
    assert sum(each) / 2 > got.item()


def test_smoothadv_step_moves_against_the_label_direction():
    """For logits w_c . x the soft loss falls as (w_y - w_other) . x grows, so its gradient
    points along -(w_y - w_other) whatever the draws: one step of 2 eps (T = 1) from x lands
    at x - 2 eps u, u the unit vector, then back on the ball: x - eps u (inside [0, 1])."""
    net = linear_net([[3.0, 4.0], [0.0, 0.0]])
    x = torch.full((1, 1, 1, 2), 0.5)
    noise = torch.randn(3, 1, 1, 1, 2, generator=torch.Generator().manual_seed(0)) * 0.1
    x_adv = smoothadv_examples(net, x, torch.tensor([0]), noise, eps=0.2, steps=1)
    expected = x - 0.2 * torch.tensor([0.6, 0.8]).view(1, 1, 1, 2)
    assert torch.allclose(x_adv, expected, atol=1e-6)
    # two steps of eps each: the first reaches the sphere, the second leaves and comes back
    x_two = smoothadv_examples(net, x, torch.tensor([0]), noise, eps=0.2, steps=2)
    assert torch.allclose(x_two, expected, atol=1e-6)


def test_smoothadv_loss_is_the_cross_entropy_of_the_noisy_adversarial_copies():
    """The training loss is the mean cross-entropy of f(x_adv + delta_i) with the draws the
    attack used: recomputed here from the same generator."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 3))
    x, y = torch.rand(4, 1, 1, 2), torch.tensor([0, 1, 2, 1])
    defense = SmoothAdv({"sigma": 0.3, "l2_eps": 0.25, "steps": 3, "noise_samples": 2})
    got = defense.loss(net, x, y, TrainingStep(0.0, 1, torch.Generator().manual_seed(7)))
    noise = 0.3 * torch.randn(2, 4, 1, 1, 2, generator=torch.Generator().manual_seed(7))
    x_adv = smoothadv_examples(net, x, y, noise, 0.25, 3)
    assert (x_adv - x).flatten(1).norm(dim=1).max() <= 0.25 + 1e-6
    logits = net((x_adv + noise).flatten(0, 1))
    expected = nn.functional.cross_entropy(logits, y.repeat(2))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_adre_loss_by_hand():
    """Two copies, three classes. Image 0 (label 0): logits (2, 0, 0) and (0, 0, 0); the
    strongest wrong class of G is class 1 (tied with 2). Image 1 (label 2): G's top is class 0,
    so the term is log G_0: the wrong winner is pushed down."""
    logits = torch.tensor(
        [[[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], [1.0, 0.0, -1.0]]]
    )  # (copies, batch, classes)
    y = torch.tensor([0, 2])
    e = math.e
    g0 = [(e**2 / (e**2 + 2) + 1 / 3) / 2, (1 / (e**2 + 2) + 1 / 3) / 2]
    z1 = e + 1 + 1
    z2 = e + 1 + 1 / e
    g1 = [(e / z1 + e / z2) / 2, ((1 / z1) + (1 / e) / z2) / 2]
    ce0 = (-math.log(e**2 / (e**2 + 2)) - math.log(1 / 3)) / 2
    ce1 = (-math.log(1 / z1) - math.log((1 / e) / z2)) / 2
    expected = (ce0 + ce1) / 2 + 0.7 * (math.log(g0[1]) + math.log(g1[0])) / 2
    assert adre_loss(logits, y, 0.7).item() == pytest.approx(expected, rel=1e-6)
    assert adre_loss(logits, y, 0.0).item() == pytest.approx((ce0 + ce1) / 2, rel=1e-6)


def test_shipped_recipe_entries():
    """One MNIST zoo model per recipe; the pretrained one fine-tunes the shipped
    Fashion-MNIST model (pinned by sha256), so ``zoo train --recipe-of`` rebuilds each."""
    from aisafety.database.zoo import list_models

    models = {name: entry for name, (entry, _) in list_models().items()}
    smoothadv = models["mnist-cnn-smoothadv-0.25"].recipe
    assert smoothadv.defense == "smoothadv" and smoothadv.init_from is None
    assert models["mnist-cnn-adre-0.25"].recipe.defense == "adre"
    pretrained = models["mnist-cnn-smoothadv-pretrained-0.25"].recipe
    assert pretrained.defense_config == smoothadv.defense_config
    assert pretrained.init_from == "fashion-mnist-cnn"
    assert pretrained.init_sha256 == models["fashion-mnist-cnn"].sha256
    assert models["fashion-mnist-cnn"].dataset == "fashion-mnist"
