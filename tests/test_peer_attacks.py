"""Our attacks are at least as strong as torchattacks', ART's and Foolbox's at identical settings.

For each gradient attack, on the vanilla zoo model and on the PGD-trained one, our robust
accuracy must be no higher than each peer's + 1 point. Peers run on the same network
(normalisation inside); their examples are projected onto the same budget ball (a no-op for
the budgeted peers, the eps-clip for minimum-norm C&W and DeepFool) and scored by us. Peers
draw from torch's and numpy's global generators: both are seeded, so every run compares
the same numbers.

Budgets depend on the model so that neither comparison is saturated: l-inf 0.1 / l2 1.5 /
l1 10 on the vanilla model (at l-inf 0.3 every attack reaches 0 % there), l-inf 0.3 / l2 2 /
l1 15 on the PGD-trained one. Step sizes scale with the budget.

Peers that lack an attack are left out of its row: torchattacks has no l1 attack and its
DeepFool loops over samples (~0.5 s an image; it is compared on 16 images in
tests/test_gradient_attacks.py); ART has no R+FGSM, SLIDE or l-inf DeepFool; Foolbox has no
R+FGSM, MI-FGSM or APGD. torchattacks' C&W has no binary search over c, so it is compared
with our C&W run for one round, ART's and Foolbox's with five.

Cost: the default run (FGSM on both models, PGD l-inf and PGD l2 on the PGD-trained one,
200 images) takes roughly 13 s on 2 idle cores; the rest (``-m slow``, the vanilla model's PGD
rows included) took about 45 minutes on a loaded machine, 15 of them in ART's C&W on the
PGD-trained model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from aisafety.attack.projection import project
from aisafety.database.zoo import load_zoo_model
from aisafety.interfaces import Norm
from aisafety.plugins import default_registry

torchattacks = pytest.importorskip("torchattacks")
art_attacks = pytest.importorskip("art.attacks.evasion")
art_estimators = pytest.importorskip("art.estimators.classification")
foolbox = pytest.importorskip("foolbox")

N = 200  # 1 point = 2 images
# Randomised attacks differ by about 1 point between seeds on 200 images (APGD: ours and
# torchattacks' agree within 0.4 points on 500 images over 3 seeds, but single-seed runs on 200
# differ by up to 2): the slow randomised rows use all 1,000 embedded images.
N_RANDOMISED = 1000
TOLERANCE = 0.01
# model -> budget per norm: unsaturated on both models (see the module docstring)
BUDGETS = {
    "mnist-cnn": {Norm.LINF: 0.1, Norm.L2: 1.5, Norm.L1: 10.0},
    "mnist-cnn-pgd-at": {Norm.LINF: 0.3, Norm.L2: 2.0, Norm.L1: 15.0},
}
Run = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PeerFactory = Callable[[torch.nn.Module, float], Run]


@dataclass(frozen=True)
class Case:
    """Our attack ``attack`` with ``config(eps)`` against each peer's ``peers[name](net, eps)``."""

    attack: str
    norm: Norm
    config: Callable[[float], dict]
    peers: dict[str, PeerFactory] = field(default_factory=dict)
    n: int = N
    seeds: int = 1  # > 1: both sides' robust accuracy is the mean over this many seeds


def _art(make_attack: Callable) -> PeerFactory:
    def factory(network: torch.nn.Module, eps: float) -> Run:
        def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            classifier = art_estimators.PyTorchClassifier(
                network, loss=torch.nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                nb_classes=10, clip_values=(0.0, 1.0),
            )  # fmt: skip
            adversarial = make_attack(classifier, eps).generate(x.numpy(), y=y.numpy())
            return torch.from_numpy(adversarial)

        return run

    return factory


def _foolbox(make_attack: Callable) -> PeerFactory:
    def factory(network: torch.nn.Module, eps: float) -> Run:
        model = foolbox.PyTorchModel(network, bounds=(0, 1))
        return lambda x, y: make_attack(eps)(model, x, y, epsilons=eps)[1]

    return factory


def _pgd_art(**settings) -> Callable:
    """ART's PGD with step sizes given relative to eps (``eps_step_ratio``)."""
    ratio = settings.pop("eps_step_ratio")
    return lambda c, eps: art_attacks.ProjectedGradientDescent(
        c, eps=eps, eps_step=ratio * eps, batch_size=256, verbose=False, **settings
    )


def _apgd_art(norm, loss_type: str) -> Callable:
    return lambda c, eps: art_attacks.AutoProjectedGradientDescent(
        c, norm=norm, eps=eps, eps_step=2 * eps, max_iter=20, nb_random_init=1,
        loss_type=loss_type, batch_size=256, verbose=False,
    )  # fmt: skip


class _APGDMargin(torchattacks.APGD):
    """torchattacks' APGD with its DLR loss replaced by the margin max_{i!=y} z_i - z_y."""

    def dlr_loss(self, x, y):
        x_sorted, ind_sorted = x.sort(dim=1)
        ind = (ind_sorted[:, -1] == y).float()
        return -(
            x[torch.arange(x.shape[0]), y] - x_sorted[:, -2] * ind - x_sorted[:, -1] * (1.0 - ind)
        )


def _apgd_case(name: str, norm: Norm, loss: str) -> Case:
    ta_norm = "Linf" if norm is Norm.LINF else "L2"
    art_norm = "inf" if norm is Norm.LINF else 2
    ta_class = _APGDMargin if loss == "margin" else torchattacks.APGD
    ta_loss = "dlr" if loss == "margin" else loss
    peers: dict[str, PeerFactory] = {
        "torchattacks": lambda net, eps: ta_class(
            net, norm=ta_norm, eps=eps, steps=20, loss=ta_loss
        )
    }
    if loss != "margin":
        art_loss = {"ce": "cross_entropy", "dlr": "difference_logits_ratio"}[loss]
        peers["ART"] = _art(_apgd_art(art_norm, art_loss))
    config = {"steps": 20, "n_restarts": 1, "rho": 0.75}
    return Case(name, norm, lambda eps: config, peers, n=N_RANDOMISED)


def _targeted_case(name: str, norm: Norm, attack: str) -> Case:
    """APGD-T / FAB-T against torchattacks' APGDT / FAB(multi_targeted) at AutoAttack's
    settings (9 target classes, one restart) with 20 iterations."""
    ta_norm = "Linf" if norm is Norm.LINF else "L2"

    def peer(network: torch.nn.Module, eps: float) -> Run:
        if attack == "apgd":
            return torchattacks.APGDT(network, norm=ta_norm, eps=eps, steps=20, n_classes=10)
        return torchattacks.FAB(
            network, norm=ta_norm, eps=eps, steps=20, multi_targeted=True, n_classes=10
        )

    config = {"steps": 20, "n_restarts": 1, "n_target_classes": 9, "early_stop": True}
    return Case(name, norm, lambda eps: config, {"torchattacks": peer}, n=N_RANDOMISED)


_CW_ROUND = {"c": 1.0, "kappa": 0.0, "steps": 100, "lr": 0.1}
_ta, _fa = torchattacks, foolbox.attacks

CASES: dict[str, Case] = {
    "fgsm": Case("fgsm", Norm.LINF, lambda eps: {}, {
        "torchattacks": lambda net, eps: _ta.FGSM(net, eps=eps),
        "ART": _art(lambda c, eps: art_attacks.FastGradientMethod(c, eps=eps)),
        "Foolbox": _foolbox(lambda eps: _fa.FGSM()),
    }),
    "r-fgsm": Case("r-fgsm", Norm.LINF, lambda eps: {"alpha_ratio": 0.5}, {
        "torchattacks": lambda net, eps: _ta.RFGSM(net, eps=eps, alpha=eps / 2, steps=1),
    }, n=N_RANDOMISED),
    "bim": Case("bim", Norm.LINF, lambda eps: {"steps": 20, "step_size": eps / 15}, {
        "torchattacks": lambda net, eps: _ta.BIM(net, eps=eps, alpha=eps / 15, steps=20),
        "ART": _art(_pgd_art(eps_step_ratio=1 / 15, max_iter=20)),
        "Foolbox": _foolbox(
            lambda eps: _fa.LinfBasicIterativeAttack(abs_stepsize=eps / 15, steps=20)
        ),
    }),
    "pgd-linf": Case("pgd-linf", Norm.LINF, lambda eps: {"steps": 40, "step_size": eps / 30}, {
        "torchattacks": lambda net, eps: _ta.PGD(net, eps=eps, alpha=eps / 30, steps=40),
        "ART": _art(_pgd_art(eps_step_ratio=1 / 30, max_iter=40, num_random_init=1)),
        "Foolbox": _foolbox(
            lambda eps: _fa.LinfPGD(steps=40, abs_stepsize=eps / 30, random_start=True)
        ),
    }),
    "mi-fgsm": Case("mi-fgsm", Norm.LINF,
                    lambda eps: {"steps": 10, "step_size": eps / 10, "decay": 1.0}, {
        "torchattacks": lambda net, eps: _ta.MIFGSM(net, eps=eps, alpha=eps / 10, steps=10),
        "ART": _art(_pgd_art(eps_step_ratio=1 / 10, max_iter=10, decay=1.0)),
    }),
    # a default row on 200 images: one seed's random start moves it by up to 2 points either
    # way (ours 0.655-0.685 over 4 seeds on mnist-cnn-pgd-at, torchattacks 0.665-0.675; means
    # 0.670 and 0.670), so it compares the mean of 3 seeds
    "pgd-l2": Case("pgd-l2", Norm.L2, lambda eps: {"steps": 20, "step_size": eps / 8}, {
        "torchattacks": lambda net, eps: _ta.PGDL2(
            net, eps=eps, alpha=eps / 8, steps=20, random_start=True
        ),
        "ART": _art(_pgd_art(norm=2, eps_step_ratio=1 / 8, max_iter=20, num_random_init=1)),
        "Foolbox": _foolbox(lambda eps: _fa.L2PGD(steps=20, abs_stepsize=eps / 8)),
    }, seeds=3),
    "pgd-l1": Case("pgd-l1", Norm.L1, lambda eps: {"steps": 20, "step_size": eps / 10}, {
        "Foolbox": _foolbox(
            lambda eps: _fa.SparseL1DescentAttack(quantile=0.99, abs_stepsize=eps / 10, steps=20)
        ),
    }),
    "apgd-ce": _apgd_case("apgd-ce", Norm.LINF, "ce"),
    "apgd-dlr": _apgd_case("apgd-dlr", Norm.LINF, "dlr"),
    "apgd-mar": _apgd_case("apgd-mar", Norm.LINF, "margin"),
    "apgd-ce-l2": _apgd_case("apgd-ce-l2", Norm.L2, "ce"),
    "apgd-dlr-l2": _apgd_case("apgd-dlr-l2", Norm.L2, "dlr"),
    "apgd-mar-l2": _apgd_case("apgd-mar-l2", Norm.L2, "margin"),
    "apgd-t": _targeted_case("apgd-t", Norm.LINF, "apgd"),
    "apgd-t-l2": _targeted_case("apgd-t-l2", Norm.L2, "apgd"),
    "fab-t": _targeted_case("fab-t", Norm.LINF, "fab"),
    "fab-t-l2": _targeted_case("fab-t-l2", Norm.L2, "fab"),
    "cw-l2/1-round": Case("cw-l2", Norm.L2,
                          lambda eps: {**_CW_ROUND, "binary_search_steps": 1}, {
        "torchattacks": lambda net, eps: _ta.CW(net, **_CW_ROUND),
    }),
    "cw-l2": Case("cw-l2", Norm.L2, lambda eps: {**_CW_ROUND, "binary_search_steps": 5}, {
        "ART": _art(lambda c, eps: art_attacks.CarliniL2Method(
            c, confidence=0.0, learning_rate=0.1, binary_search_steps=5, max_iter=100,
            initial_const=1.0, batch_size=256, verbose=False,
        )),
        "Foolbox": _foolbox(lambda eps: _fa.L2CarliniWagnerAttack(
            binary_search_steps=5, steps=100, stepsize=0.1, initial_const=1.0
        )),
    }),
    "deepfool-l2": Case("deepfool-l2", Norm.L2, lambda eps: {"steps": 50, "overshoot": 0.02}, {
        "ART": _art(lambda c, eps: art_attacks.DeepFool(
            c, max_iter=50, epsilon=0.02, nb_grads=10, batch_size=256, verbose=False
        )),
        "Foolbox": _foolbox(
            lambda eps: _fa.L2DeepFoolAttack(steps=50, candidates=10, overshoot=0.02)
        ),
    }),
    "deepfool-linf": Case("deepfool-linf", Norm.LINF,
                          lambda eps: {"steps": 50, "overshoot": 0.02}, {
        "Foolbox": _foolbox(
            lambda eps: _fa.LinfDeepFoolAttack(steps=50, candidates=10, overshoot=0.02)
        ),
    }),
}  # fmt: skip

# The default run: FGSM on both models, PGD l-inf and PGD l2 on the PGD-trained one; the
# rest is slow (test_no_weaker_than_peers says what covers the vanilla model's PGD rows).
DEFAULT = {
    ("mnist-cnn", "fgsm"),
    ("mnist-cnn-pgd-at", "fgsm"),
    ("mnist-cnn-pgd-at", "pgd-linf"),
    ("mnist-cnn-pgd-at", "pgd-l2"),
}
PARAMS = [  # model-major, with ids "<model>-<label>" as when the model was a fixture's param
    pytest.param(model, label, id=f"{model}-{label}",
                 marks=() if (model, label) in DEFAULT else pytest.mark.slow)
    for model in sorted(BUDGETS) for label in CASES
]  # fmt: skip


def _seeded(run: Run, x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``run(x, y)`` with torch's and numpy's global generators seeded (ART uses numpy's)."""
    state = np.random.get_state()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            np.random.seed(seed)
            return run(x, y).detach().float()
    finally:
        np.random.set_state(state)


@pytest.mark.parametrize(("model", "label"), PARAMS)
def test_no_weaker_than_peers(model, label, mnist_subset):
    """The vanilla model's PGD rows (~6-7 s each, idle) are slow since session 17; in the
    default run the same attacks meet the same three peers on mnist-cnn-pgd-at, and on
    mnist-cnn ours meet torchattacks' at the same budgets in cheaper tests:
    tests/test_attacks.py::test_pgd_robust_accuracy_no_worse_than_torchattacks[0.1] (PGD
    l-inf, 40 steps, random start) and tests/test_gradient_attacks.py::
    test_robust_accuracy_no_worse_than_torchattacks[pgd-l2] (l2 1.5)."""
    predictor, case = load_zoo_model(model), CASES[label]
    data = mnist_subset(case.n)
    x, y = data.x, data.y
    eps = BUDGETS[predictor.name][case.norm]
    registry = default_registry()
    config = case.config(eps)
    configs = [{**config, "seed": seed} if case.seeds > 1 else config for seed in range(case.seeds)]
    ours = statistics.mean(
        registry.create("attack", case.attack, c)(predictor, x, y, eps).robust_accuracy
        for c in configs
    )
    network = predictor.network
    for peer, factory in case.peers.items():
        accuracies = []
        for seed in range(case.seeds):
            x_adv = project(_seeded(factory(network, eps), x, y, seed), x, eps, case.norm)
            with torch.no_grad():
                accuracies.append((network(x_adv).argmax(1) == y).float().mean().item())
        theirs = statistics.mean(accuracies)
        assert ours <= theirs + TOLERANCE, (
            f"{label} at eps={eps} on {predictor.name}: ours {ours:.3f} > {peer} {theirs:.3f}"
            f" (mean of {case.seeds} seeds)"
        )
