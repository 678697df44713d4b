"""The AutoAttack-style ensembles (``standard``, ``rand``): members run in order on what is
still robust, the worst case per sample, who broke what, configuration, database rows, and
the VNN-COMP check (every counterexample any single attack of ours finds, the ensemble finds).

The comparison with torchattacks' AutoAttack on 1,000 images is ``-m slow`` at the end.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import pytest
import torch

from aisafety.database.zoo import load_zoo_model
from aisafety.errors import ConfigError
from aisafety.interfaces import Norm
from aisafety.plugins import default_registry
from aisafety.runner import Runner
from aisafety.store.results import ResultStore
from tests.shared_data import absent, located

# cheap members: a few iterations and queries (the defaults are AutoAttack's 100 and 5,000)
FAST = {"steps": 5, "queries": 100}


@pytest.fixture(scope="module")
def robust_model():
    return load_zoo_model("mnist-cnn-pgd-at")


@pytest.fixture(scope="module")
def run(robust_model, mnist_subset):
    data = mnist_subset(48)
    attack = default_registry().create("attack", "standard", FAST)
    return data, attack(robust_model, data.x, data.y, 0.3)


def test_members_run_in_order_on_what_is_left_and_the_worst_case_is_kept(robust_model, run):
    (data, result), net = run, robust_model.network
    x, y = data.x, data.y
    assert result.members == ("apgd-ce", "apgd-t", "fab-t", "square-linf")
    with torch.no_grad():
        clean_correct = net(x).argmax(1) == y
        adv_pred = net(result.x_adv).argmax(1)
    assert float((result.x_adv - x).abs().max()) <= 0.3 + 1e-6
    assert torch.equal(result.success, adv_pred != y)  # confirmed by the network itself
    # a sample is broken by exactly the member recorded, or was misclassified to begin with
    broken = result.broken_by >= 0
    assert torch.equal(result.success, broken | ~clean_correct)
    # the first member runs on every correctly classified sample, each next one only on the
    # samples no earlier member broke
    attacked = result.member_attacked
    assert torch.equal(attacked[:, 0], clean_correct)
    for j in range(1, len(result.members)):
        still_robust = clean_correct & ~((result.broken_by >= 0) & (result.broken_by < j))
        assert torch.equal(attacked[:, j], still_robust), result.members[j]
    assert (result.member_steps[~attacked] == 0).all()
    assert torch.equal(result.steps, result.member_steps.sum(1))
    assert 0 < result.robust_accuracy < float(clean_correct.double().mean())
    assert len(result.member_seconds) == 4
    assert result.breakers[int(broken.nonzero()[0])] in result.members


def test_no_weaker_than_its_first_member_alone(robust_model, run):
    """The ensemble's robust accuracy is at most that of APGD-CE run alone at its settings
    (different batch composition draws other random starts: within one image of 48)."""
    data, result = run
    alone = default_registry().create("attack", "apgd-ce", {"steps": 5, "early_stop": True})
    single = alone(robust_model, data.x, data.y, 0.3)
    assert result.robust_accuracy <= single.robust_accuracy + 1 / 48


def test_order_restarts_and_member_settings_are_configurable():
    registry = default_registry()
    attack = registry.create(
        "attack", "standard",
        {"attacks": ["square-linf", "apgd-ce"], "steps": 7, "n_restarts": 2, "queries": 300,
         "attack_configs": {"apgd-ce": {"rho": 0.5}}, "seed": 3},
    )  # fmt: skip
    square, apgd = attack.members
    assert (square.name, apgd.name) == ("square-linf", "apgd-ce")
    assert square.config.queries == 300 and square.config.seed == 3
    assert (apgd.config.steps, apgd.config.n_restarts, apgd.config.rho) == (7, 2, 0.5)
    assert apgd.config.early_stop and apgd.config.eot_iter == 1
    rand = registry.create("attack", "rand")
    assert [m.name for m in rand.members] == ["apgd-ce", "apgd-dlr"]
    assert all(m.config.eot_iter == 20 for m in rand.members)
    l2 = registry.create("attack", "standard-l2")
    assert [m.norm for m in l2.members] == [Norm.L2] * 4


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"attacks": ["apgd-ce-l2"]}, "l-linf ensemble but member 'apgd-ce-l2'"),
        ({"attacks": ["standard"]}, "member 'standard' is an ensemble"),
        ({"attacks": ["fog"]}, "'fog' is a corruption, not an attack.*corruptions:"),
        ({"attacks": []}, "attacks"),
        ({"attack_configs": {"pgd-linf": {}}}, "not members"),
        ({"attacks": ["no-such-attack"]}, "no-such-attack"),
    ],
)
def test_bad_ensembles_are_config_errors_naming_the_problem(config, message):
    with pytest.raises(ConfigError, match=message):
        default_registry().create("attack", "standard", config)


def test_rand_averages_gradients_over_draws(robust_model, mnist_subset):
    """EOT with a deterministic model: the averaged gradient equals one draw's, so rand with
    2 draws gives exactly the same examples as with 1."""
    data = mnist_subset(16)
    one = default_registry().create("attack", "rand", {"steps": 3, "eot_iter": 1})
    two = default_registry().create("attack", "rand", {"steps": 3, "eot_iter": 2})
    a, b = (attack(robust_model, data.x, data.y, 0.3) for attack in (one, two))
    assert torch.allclose(a.x_adv, b.x_adv, atol=1e-6)
    assert int(b.member_steps.sum()) == int(a.member_steps.sum())


def test_member_contributions_are_database_rows(tmp_path):
    """``ensemble_members`` has one row per member; ``sample_outcomes.broken_by`` names the
    member per sample; the two agree, and with the attack run's robust accuracy."""
    from aisafety.config import plan_from_dict

    plan = plan_from_dict({
        "model": {"name": "mnist-cnn-pgd-at"},
        "dataset": {"name": "mnist-embedded", "limit": 30},
        "attacks": [{"name": "standard", "config": FAST, "eps": [0.3]}],
        "metrics": ["ca", "robust-accuracy"],
    })  # fmt: skip
    store = ResultStore(f"sqlite:///{tmp_path / 'ensemble.db'}")
    Runner(plan, store, quiet=True).run()
    _, members = store.query(
        "SELECT position, member, n_attacked, n_broken, steps, seconds FROM ensemble_members "
        "ORDER BY position"
    )
    assert [m[1] for m in members] == ["apgd-ce", "apgd-t", "fab-t", "square-linf"]
    assert [m[0] for m in members] == [1, 2, 3, 4]
    attacked = [m[2] for m in members]
    assert attacked == sorted(attacked, reverse=True) and attacked[0] > 0
    for (_, _, n_attacked, n_broken, _, _), (_, _, n_next, *_) in zip(
        members, members[1:], strict=False
    ):
        assert n_next == n_attacked - n_broken  # the next member gets exactly what is left
    _, per_member = store.query(
        "SELECT broken_by, COUNT(*) FROM sample_outcomes WHERE broken_by IS NOT NULL "
        "GROUP BY broken_by"
    )
    assert dict(per_member) == {m[1]: m[3] for m in members if m[3]}
    _, [(robust, n, wrong_clean, broken)] = store.query(
        "SELECT ar.robust_accuracy, ar.n_samples, "
        "SUM(so.clean_pred <> so.label), SUM(so.broken_by IS NOT NULL) "
        "FROM attack_runs ar JOIN sample_outcomes so ON so.attack_run_id = ar.id"
    )
    assert math.isclose(robust, 1 - (wrong_clean + broken) / n)


# --- VNN-COMP: the ensemble finds every counterexample any single attack of ours finds ------

SHARED = located("vnncomp2021_mnistfc")


def _vnncomp_groups():
    """The mnistfc instances grouped by (network, eps): centres, labels, properties."""
    from aisafety.prediction.onnx_model import load_onnx
    from aisafety.verification.vnnlib import read_vnnlib

    groups: dict[tuple[str, float], list] = {}
    with (SHARED / "mnistfc_instances.csv").open() as f:
        for net, spec, _ in csv.reader(f):
            eps = float(Path(spec).stem.rsplit("_", 1)[1])
            prop = read_vnnlib(SHARED / spec, 784, 10)
            prop.lower = prop.lower.reshape(1, 1, 28, 28)
            prop.upper = prop.upper.reshape(1, 1, 28, 28)
            x = torch.where(prop.upper < 1, prop.upper - eps, prop.lower + eps).clamp(0, 1)
            x = x.float()[0]
            label = int((prop.spec[0] > 0).float().sum(0).argmax())
            groups.setdefault((net, eps), []).append((x, label, prop, spec))
    for (net, eps), items in sorted(groups.items()):
        predictor = load_onnx(SHARED / net, gradients=True, input_shape=(1, 28, 28))
        yield predictor, eps, items


def _single_attacks() -> list[str]:
    """Every registered l-inf attack that runs on a model alone (no ensemble, surrogate,
    corruption or noise baseline)."""
    registry = default_registry()
    names = []
    for name in registry.names("attack"):
        cls = registry.get("attack", name)
        if cls.norm is Norm.LINF and name not in ("standard", "rand", "transfer", "random-noise"):
            names.append(name)
    return names


def _broken(attack, predictor, x, y, eps, items) -> list[bool]:
    """Per instance, whether the attack's point, put into the property's box, violates it."""
    from aisafety.verification.falsify import into_box

    result = attack(predictor, x, y, eps)
    flags = []
    for point, (_, _, prop, _) in zip(result.x_adv, items, strict=True):
        with torch.no_grad():
            rows = prop.rows(predictor.logits(into_box(point[None], prop)).double())
        flags.append(bool((rows <= 0).any()))
    return flags


@pytest.mark.slow
@pytest.mark.skipif(SHARED is None, reason=absent("vnncomp2021_mnistfc"))
def test_ensemble_finds_every_vnncomp_counterexample_a_single_attack_finds():
    registry = default_registry()
    singles = _single_attacks()
    assert {"pgd-linf", "apgd-ce", "apgd-t", "fab-t", "square-linf"} <= set(singles)
    missed, found_by_any, found = [], 0, 0
    for predictor, eps, items in _vnncomp_groups():
        x = torch.stack([i[0] for i in items])
        y = torch.tensor([i[1] for i in items])

        ours = _broken(registry.create("attack", "standard"), predictor, x, y, eps, items)
        single = {
            name: _broken(registry.create("attack", name), predictor, x, y, eps, items)
            for name in singles
        }
        group_any = 0
        for i, (_, _, _, spec) in enumerate(items):
            by = [name for name, flags in single.items() if flags[i]]
            found_by_any += bool(by)
            group_any += bool(by)
            found += ours[i]
            if by and not ours[i]:
                missed.append((spec, by))
        counts = {name: sum(flags) for name, flags in single.items()}
        print(f"\n{predictor.name} eps {eps}: {len(items)} instances, standard {sum(ours)}, "
              f"any single attack {group_any}; per attack {counts}")  # fmt: skip
    print(f"\nall groups: standard {found}, any single attack {found_by_any}, missed {missed}")
    assert not missed, missed
    assert found >= found_by_any > 0


# --- strength: no weaker than torchattacks' AutoAttack at identical budgets (slow) -----------


def standard_and_autoattack(model: str, x: torch.Tensor, y: torch.Tensor, eps: float) -> dict:
    """Ours (``standard``, steps 10, 5,000 queries) and torchattacks 3.5.1's
    ``AutoAttack('standard')`` (APGD-CE, APGD-T and FAB-T with its default 10 iterations,
    Square with 5,000 queries) on the same inputs: each side's robust mask, scored by the
    network itself on its examples in the budget, our result and both times (s)."""
    import torchattacks

    from aisafety.attack.projection import project

    predictor = load_zoo_model(model)
    attack = default_registry().create("attack", "standard", {"steps": 10, "queries": 5000})
    started = time.perf_counter()
    result = attack(predictor, x, y, eps)
    ours_seconds = time.perf_counter() - started
    net = predictor.network.eval()
    peer = torchattacks.AutoAttack(net, norm="Linf", eps=eps, version="standard", seed=0)
    started = time.perf_counter()
    x_peer = project(peer(x, y), x, eps, Norm.LINF)
    theirs_seconds = time.perf_counter() - started
    with torch.no_grad():
        peer_robust = net(x_peer).argmax(1) == y
    return {"ours": ~result.success, "theirs": peer_robust, "result": result,
            "x_peer": x_peer, "seconds": (ours_seconds, theirs_seconds)}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mnist-cnn-pgd-at-ft2", "mnist-cnn-trades-5", "mnist-cnn-ah"])
def test_standard_no_weaker_than_torchattacks_autoattack(model, embedded_mnist):
    """All 1,000 embedded images at l-inf 0.3, identical budgets: ours may be at most 0.3
    points less strong than torchattacks' AutoAttack. Prints both robust accuracies, the
    samples only one side breaks, our members' breaks and the times (``pytest -m slow -s``:
    the numbers in docs/attacks.md)."""
    pytest.importorskip("torchattacks")
    run = standard_and_autoattack(model, embedded_mnist.x, embedded_mnist.y, 0.3)
    result, ours_robust, peer_robust = run["result"], run["ours"], run["theirs"]
    ours, theirs = result.robust_accuracy, float(peer_robust.double().mean())
    breaks = {name: int((result.broken_by == j).sum()) for j, name in enumerate(result.members)}
    print(
        f"\n{model}: robust ours {ours:.3f} ({run['seconds'][0]:.0f} s), torchattacks "
        f"{theirs:.3f} ({run['seconds'][1]:.0f} s); broken only by ours "
        f"{int((ours_robust < peer_robust).sum())}, only by torchattacks "
        f"{int((peer_robust < ours_robust).sum())}; our breaks {breaks}"
    )
    assert ours <= theirs + 0.003, (model, ours, theirs)
