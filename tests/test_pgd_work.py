"""PGD-l-inf does the floor's work and nothing more, and its results are the textbook loop's.

The floor of an evaluated PGD-k (issue 32, ``bench/cpu_speed.py``): k forward and backward
passes for the input gradient, then one forward pass for the logits of the last iterate.
Counting the model's passes here keeps an extra pass, a parameter gradient or a second clean
pass from slipping into the loop; the result is compared bit for bit with Madry et al.'s
loop written out by hand (sign step, clamp to the eps-ball intersected with [0, 1]), then
the base class's containment that every attack's result passes through.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aisafety.attack.pgd import PGDLinf
from aisafety.prediction.footprint import image_bytes

EPS, STEPS = 0.05, 7


def _passes(predictor) -> tuple[list[bool], object]:
    """A list that records, for each forward pass of the network, whether grad was on."""
    seen: list[bool] = []
    hook = predictor.network.register_forward_pre_hook(
        lambda _m, _args: seen.append(torch.is_grad_enabled())
    )
    return seen, hook


def test_pgd_runs_k_gradient_passes_and_one_final_forward(zoo_predictor, mnist_subset):
    data = mnist_subset(16)
    with torch.no_grad():
        clean = zoo_predictor.network(data.x)
    image_bytes(zoo_predictor, grad=True)  # the memory probe: one pass per predictor, cached
    seen, hook = _passes(zoo_predictor)
    try:
        PGDLinf(steps=STEPS, step_size=EPS / 4)(
            zoo_predictor, data.x, data.y, EPS, clean_logits=clean
        )
    finally:
        hook.remove()
    assert seen == [True] * STEPS + [False]  # no clean pass: the caller handed its logits
    assert all(p.grad is None for p in zoo_predictor.network.parameters())


def test_pgd_equals_the_textbook_loop_bit_for_bit(zoo_predictor, mnist_subset):
    data = mnist_subset(16)
    x, y, alpha = data.x, data.y, EPS / 4
    result = PGDLinf(steps=STEPS, step_size=alpha, random_start=False)(zoo_predictor, x, y, EPS)
    network = zoo_predictor.network
    x_adv = x.clone()
    for _ in range(STEPS):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(network(x_adv), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x_adv)
        stepped = x_adv.detach() + alpha * grad.sign()
        x_adv = torch.min(torch.max(stepped, (x - EPS).clamp(0, 1)), (x + EPS).clamp(0, 1))
    # the base class's guarantee on every result: the perturbation clipped to the ball, then
    # the box (threat.py: it can move a coordinate by one rounding)
    x_adv = (x + (x_adv - x).clamp(-EPS, EPS)).clamp(0, 1)
    with torch.no_grad():
        logits = network(x_adv)
    assert torch.equal(result.x_adv, x_adv)
    assert torch.equal(result.adv_logits, logits)
    assert torch.equal(result.success, logits.argmax(1) != y)
    assert 0 < int(result.success.sum()) < len(y)  # the case is not degenerate
