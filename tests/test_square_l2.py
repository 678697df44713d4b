"""Square Attack, l2: its building blocks by hand and against the reference port, and the
attack on a linear model, the zoo MNIST model and a small colour model.

Independent checks: perturbation norms measured here with ``torch.linalg.vector_norm``,
success recomputed from the network itself, the bump pattern against torchattacks' port of
the reference (``eta_rectangles`` / ``eta``), and robust accuracy no worse than
``torchattacks.Square(norm='L2')`` at the same budget, queries and ``p_init``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.attack.square_l2 import (
    SquareL2,
    bump,
    centred_squares,
    square_pair_update,
    to_sphere,
)
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import AISafetyError, CapabilityError, InputError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor

ZOO_N, ZOO_EPS, ZOO_QUERIES = 64, 2.0, 300


def _norms(delta: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(delta.flatten(1), ord=2, dim=1)


def _labels(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Labels straight from the network, bypassing the predictor and the attack code."""
    with torch.inference_mode():
        return net(x).argmax(1)


class _Wrapped(Predictor):
    """Another predictor's scores behind a chosen capability set; counts samples queried."""

    def __init__(self, inner: Predictor, capabilities: set[Capability]):
        self.inner, self.seen = inner, 0
        self.name, self.num_classes = inner.name, inner.num_classes
        self.input_shape, self.device = inner.input_shape, inner.device
        self.capabilities = frozenset(capabilities)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += len(x)
        return self.inner.logits(x)


@pytest.fixture(scope="module")
def mnist():
    return EmbeddedMnist().load(None, "test")


@pytest.fixture(scope="module")
def linear(mnist) -> TorchPredictor:
    """A least-squares linear classifier fitted on the embedded MNIST set (fast to query)."""
    features = torch.cat([mnist.x.flatten(1), torch.ones(len(mnist), 1)], 1).double()
    targets = nn.functional.one_hot(mnist.y, 10).double()
    gram = features.T @ features + torch.eye(features.shape[1], dtype=torch.double)
    solution = torch.linalg.solve(gram, features.T @ targets).float()
    layer = nn.Linear(784, 10)
    with torch.no_grad():
        layer.weight.copy_(solution[:784].T)
        layer.bias.copy_(solution[784])
    return TorchPredictor(nn.Sequential(nn.Flatten(), layer), (1, 28, 28), 10, name="linear")


# -- building blocks -----------------------------------------------------------------------


def test_centred_squares_by_hand():
    # 1 x 3: centre (0, 1); square 0 covers the centre (+1), square 1 everything (+1/4).
    expected = torch.tensor([[0.25, 1.25, 0.25]], dtype=torch.float64)
    assert torch.allclose(centred_squares(1, 3), expected / expected.norm())
    # 3 x 3: centre 1 + 1/4, border 1/4.
    expected = torch.full((3, 3), 0.25, dtype=torch.float64)
    expected[1, 1] = 1.25
    assert torch.allclose(centred_squares(3, 3), expected / expected.norm())
    # The bump: positive top half, negative bottom half, unit norm, for odd and even sides.
    for side in (1, 2, 3, 5, 9):
        pattern = bump(side)
        assert torch.isclose(torch.linalg.vector_norm(pattern), torch.tensor(1.0))
        assert bool((pattern[: side // 2] > 0).all()) and bool((pattern[side // 2 :] < 0).all())


def test_bump_equals_torchattacks_port_of_the_reference():
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is not installed")
    peer = torchattacks.Square(nn.Identity(), norm="L2", eps=1.0)
    for rows in range(1, 10):
        for cols in range(1, 10):
            assert torch.allclose(
                centred_squares(rows, cols).float(), peer.eta_rectangles(rows, cols), atol=1e-6
            ), (rows, cols)
    for side in range(1, 12):
        theirs = peer.eta(side)  # transposed at random
        ours = bump(side)
        assert torch.allclose(theirs, ours, atol=1e-6) or torch.allclose(theirs, ours.T, atol=1e-6)


def test_square_pair_update_moves_mass_and_stays_on_the_sphere():
    gen = torch.Generator().manual_seed(0)
    m, c, h, w, side, eps = 32, 3, 11, 13, 5, 1.7
    delta = torch.randn(m, c, h, w, generator=gen)
    delta = delta / _norms(delta).view(-1, 1, 1, 1) * eps
    first = (torch.randint(0, h - side, (m,), generator=gen),
             torch.randint(0, w - side, (m,), generator=gen))  # fmt: skip
    second = (torch.randint(0, h - side, (m,), generator=gen),
              torch.randint(0, w - side, (m,), generator=gen))  # fmt: skip
    signs = torch.randint(0, 2, (m, c, 1, 1), generator=gen) * 2 - 1
    pattern = bump(side) * signs
    updated = square_pair_update(delta, first, second, side, pattern, eps)
    # Masks of the two windows, built with a per-sample Python loop (independent of the code).
    in_1 = torch.zeros(m, 1, h, w, dtype=torch.bool)
    in_2 = torch.zeros(m, 1, h, w, dtype=torch.bool)
    for i in range(m):
        in_1[i, :, first[0][i] : first[0][i] + side, first[1][i] : first[1][i] + side] = True
        in_2[i, :, second[0][i] : second[0][i] + side, second[1][i] : second[1][i] + side] = True
    outside = ~(in_1 | in_2).expand_as(delta)
    assert torch.equal(updated[outside], delta[outside])  # the rest is untouched
    assert bool((updated[(in_2 & ~in_1).expand_as(delta)] == 0).all())  # window 2 emptied
    # Per channel, window 1 now holds all the mass the union held: norm eps is kept.
    union = (in_1 | in_2).float()
    before = (delta.square() * union).sum((2, 3))
    after = (updated.square() * in_1.float()).sum((2, 3))
    assert torch.allclose(after, before, rtol=1e-4)
    assert torch.allclose(_norms(updated), torch.full((m,), eps), rtol=1e-5)
    # Window 1's new content: old direction plus the bump, per channel.
    i = 0
    window = (slice(first[0][i], first[0][i] + side), slice(first[1][i], first[1][i] + side))
    old = delta[i, :, window[0], window[1]]
    direction = pattern[i] + old / old.flatten(1).norm(dim=1).view(c, 1, 1)
    new = updated[i, :, window[0], window[1]]
    cosine = nn.functional.cosine_similarity(new.flatten(1), direction.flatten(1), dim=1)
    assert torch.allclose(cosine, torch.ones(c), atol=1e-5)
    # Unused budget is handed out: a short perturbation comes back with norm eps.
    short = square_pair_update(delta * 0.5, first, second, side, pattern, eps)
    assert torch.allclose(_norms(short), torch.full((m,), eps), rtol=1e-5)
    # to_sphere scales onto the sphere (here the box does not bind).
    x = torch.full((m, c, h, w), 0.5)
    assert torch.allclose(_norms(to_sphere(x, delta * 0.01, 0.3) - x), torch.full((m,), 0.3))


# -- the attack ------------------------------------------------------------------------------


def test_descriptor_and_config():
    assert SquareL2.name == "square-l2"
    assert (SquareL2.family, SquareL2.norm) == (AttackFamily.SCORE, Norm.L2)
    assert SquareL2.requires == Capability.SCORES
    config = SquareL2().config
    assert (config.queries, config.p_init, config.seed) == (1000, 0.1, 0)
    with pytest.raises(AISafetyError, match="queries"):
        SquareL2(queries=0)
    with pytest.raises(AISafetyError, match="p_init"):
        SquareL2(p_init=1.5)


def test_properties_on_a_linear_model(linear, mnist):
    data = mnist.balanced_subset(40, seed=2)
    x, y, queries, eps = data.x, data.y, 100, 1.5
    counting = _Wrapped(linear, {Capability.SCORES})  # scores only: enough for Square
    attack = SquareL2(queries=queries, seed=3)
    result = attack(counting, x, y, eps)
    net = linear.network
    clean_correct = _labels(net, x) == y
    # Budget and box, measured here.
    assert float(_norms(result.x_adv - x).max()) <= eps + 1e-5
    assert float(result.x_adv.min()) >= 0 and float(result.x_adv.max()) <= 1
    # Success recomputed from the network; a real attack on a fragile model.
    success = _labels(net, result.x_adv) != y
    assert torch.equal(result.success, success)
    assert float((~success).float().mean()) < float(clean_correct.float().mean()) - 0.2
    # The search stays on the sphere, up to what the [0, 1] clip cuts off (measured: the
    # shortest perturbation has norm 1.48 of 1.5).
    assert float(_norms(result.x_adv - x)[clean_correct].min()) > 0.8 * eps
    # Query accounting: at most `queries`, fooled samples stop early, misclassified ones get
    # none, and the model saw the reported queries + one clean pass + the base re-check.
    steps = result.steps
    assert int(steps.max()) <= queries
    assert bool((steps[clean_correct & ~success] == queries).all())
    assert bool((steps[clean_correct & success] < queries).all())
    assert bool((steps[~clean_correct] == 0).all())
    assert torch.equal(result.x_adv[~clean_correct], x[~clean_correct])
    assert counting.seen == int(steps.sum()) + 2 * len(x)  # + one clean pass, one final check
    # Deterministic for a seed; another seed draws other windows.
    again = attack(linear, x, y, eps)
    assert torch.equal(again.x_adv, result.x_adv) and torch.equal(again.steps, result.steps)
    other = SquareL2(queries=queries, seed=4)(linear, x, y, eps)
    assert not torch.equal(other.x_adv, result.x_adv)


def test_zero_budget_infinite_budget_and_capabilities(linear, mnist):
    data = mnist.balanced_subset(20, seed=5)
    x, y = data.x, data.y
    result = SquareL2(queries=20)(linear, x, y, 0.0)
    assert torch.equal(result.x_adv, x) and int(result.steps.sum()) == 0
    assert torch.equal(result.success, _labels(linear.network, x) != y)  # nothing new fooled
    with pytest.raises(InputError, match="finite"):
        SquareL2(queries=5)(linear, x, y, float("inf"))
    with pytest.raises(CapabilityError, match="square-l2"):
        SquareL2(queries=5)(_Wrapped(linear, {Capability.LABELS}), x, y, 1.0)


def test_colour_non_square_images():
    """Three channels, h != w, and images too small for the scheduled window (side clamped)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 9, 5))
    predictor = TorchPredictor(net.eval(), (3, 7, 11), 5, name="tiny")
    x = torch.rand(16, 3, 7, 11, generator=torch.Generator().manual_seed(1))
    y = predictor.predict(x)
    eps = 0.5
    result = SquareL2(queries=40, p_init=0.5, seed=1)(predictor, x, y, eps)
    assert float(_norms(result.x_adv - x).max()) <= eps + 1e-5
    assert float(result.x_adv.min()) >= 0 and float(result.x_adv.max()) <= 1
    assert torch.equal(result.success, _labels(net, result.x_adv) != y)
    assert bool((result.x_adv != x).flatten(1).any(1).all())  # every sample was perturbed


# -- zoo model and the peer library ---------------------------------------------------------


@pytest.fixture(scope="module")
def zoo_run(mnist):
    zoo = load_zoo_model("mnist-cnn")
    data = mnist.balanced_subset(ZOO_N, seed=0)
    result = SquareL2(queries=ZOO_QUERIES, seed=0)(zoo, data.x, data.y, ZOO_EPS)
    return zoo, data.x, data.y, result


def test_zoo_model(zoo_run):
    zoo, x, y, result = zoo_run
    net = zoo.network
    assert float(_norms(result.x_adv - x).max()) <= ZOO_EPS + 1e-5
    assert float(result.x_adv.min()) >= 0 and float(result.x_adv.max()) <= 1
    adv_labels = _labels(net, result.x_adv)
    assert torch.equal(result.success, adv_labels != y)
    clean_correct = _labels(net, x) == y
    clean = float(clean_correct.float().mean())
    robust = float((adv_labels == y).float().mean())
    assert robust == pytest.approx(result.robust_accuracy)
    assert not bool(clean_correct.all())  # one misclassified sample: left alone, no queries
    assert bool((result.steps[~clean_correct] == 0).all())
    assert torch.equal(result.x_adv[~clean_correct], x[~clean_correct])
    assert int(result.steps.max()) <= ZOO_QUERIES
    # Score-based with 300 queries at l2 = 2 is far weaker than PGD-l2 on this model (about
    # 0.14), but still fools a clear share: measured 0.84 against 0.98 clean.
    assert robust <= clean - 0.1, (robust, clean)


def test_at_least_as_strong_as_torchattacks(zoo_run):
    """torchattacks' Square (AutoAttack's port of the reference) draws one window pair and
    one bump orientation per iteration for the whole batch, and gets one extra query (its
    n_queries iterations follow the initial query); on one-channel MNIST its window norms
    equal the reference's per-channel ones. Same eps, queries, p_init: ours must fool at
    least as many samples, up to noise. One seed's robust accuracy moves by a sample or two
    (+-0.03 on 64 images): the means over seeds 0, 1, 2 are compared (over seeds 0-4 both
    measured 0.853 with per-sample streams; seed 0 alone 0.875 against 0.844)."""
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is not installed")
    zoo, x, y, result = zoo_run
    net = zoo.network
    ours, peers = [result.robust_accuracy], []
    for seed in (0, 1, 2):
        if seed:
            ours.append(
                SquareL2(queries=ZOO_QUERIES, seed=seed)(zoo, x, y, ZOO_EPS).robust_accuracy
            )
        peer_attack = torchattacks.Square(
            net, norm="L2", eps=ZOO_EPS, n_queries=ZOO_QUERIES, p_init=0.1, seed=seed
        )
        x_peer = peer_attack(x, y)
        assert float(_norms(x_peer - x).max()) <= ZOO_EPS + 1e-4
        peers.append(float((_labels(net, x_peer) == y).float().mean()))
    peer = sum(peers) / len(peers)
    clean = float((_labels(net, x) == y).float().mean())
    assert peer < clean  # the peer attack works here, so the comparison means something
    assert sum(ours) / len(ours) <= peer + 0.03, (ours, peers)
