"""Our attacks are at least as strong as torchattacks', ART's and Foolbox's at identical settings.

For each gradient attack, on the vanilla zoo model and on the PGD-trained one, our robust
accuracy must be no higher than each peer's + 1 point. Peers run on the same network
(normalisation inside) and their adversarial examples are scored by us.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from aisafety.database.zoo import load_zoo_model
from aisafety.plugins import default_registry

torchattacks = pytest.importorskip("torchattacks")
art_attacks = pytest.importorskip("art.attacks.evasion")
art_estimators = pytest.importorskip("art.estimators.classification")
foolbox = pytest.importorskip("foolbox")

N = 200
TOLERANCE = 0.01
Peer = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def _art(network, make_attack) -> Peer:
    def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        classifier = art_estimators.PyTorchClassifier(
            network, loss=torch.nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
            nb_classes=10, clip_values=(0.0, 1.0),
        )  # fmt: skip
        return torch.from_numpy(make_attack(classifier).generate(x.numpy(), y=y.numpy()))

    return run


def _foolbox(network, attack, eps) -> Peer:
    model = foolbox.PyTorchModel(network, bounds=(0, 1))
    return lambda x, y: attack(model, x, y, epsilons=eps)[1]


def peers_for(case: str, network) -> dict[str, Peer]:
    """Each peer's implementation of ``case`` at the settings of CASES[case]."""
    ta = torchattacks
    if case == "fgsm":
        return {
            "torchattacks": lambda x, y: ta.FGSM(network, eps=0.3)(x, y),
            "ART": _art(network, lambda c: art_attacks.FastGradientMethod(c, eps=0.3)),
            "Foolbox": _foolbox(network, foolbox.attacks.FGSM(), 0.3),
        }
    if case == "pgd-linf":
        return {
            "torchattacks": lambda x, y: ta.PGD(network, eps=0.3, alpha=0.01, steps=40)(x, y),
            "ART": _art(
                network,
                lambda c: art_attacks.ProjectedGradientDescent(
                    c, eps=0.3, eps_step=0.01, max_iter=40, num_random_init=1, verbose=False
                ),
            ),
            "Foolbox": _foolbox(
                network,
                foolbox.attacks.LinfPGD(steps=40, abs_stepsize=0.01, random_start=True),
                0.3,
            ),
        }
    raise KeyError(case)


# our attack name -> (config, eps)
CASES = {
    "fgsm": ({}, 0.3),
    "pgd-linf": ({"steps": 40, "step_size": 0.01}, 0.3),
}


@pytest.fixture(scope="module", params=["mnist-cnn", "mnist-cnn-pgd-at"])
def model(request, mnist_subset):
    predictor = load_zoo_model(request.param)
    data = mnist_subset(N)
    return predictor, data.x, data.y


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_weaker_than_peers(case, model):
    predictor, x, y = model
    config, eps = CASES[case]
    ours = default_registry().create("attack", case, config)(predictor, x, y, eps)
    network = predictor.network
    for peer, run in peers_for(case, network).items():
        x_adv = run(x, y).detach().float()
        assert (x_adv - x).abs().max() <= eps + 1e-5, f"{peer} left the budget"
        with torch.no_grad():
            theirs = (network(x_adv).argmax(1) == y).float().mean().item()
        assert ours.robust_accuracy <= theirs + TOLERANCE, (
            f"{case} on {predictor.name}: ours {ours.robust_accuracy:.3f} > {peer} {theirs:.3f}"
        )
