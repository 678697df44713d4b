"""Certified metrics against a closed form, the plan check, and `aisafety list verifiers`.

On a single linear layer every bound method is exact, so the largest certified l-inf radius
of a sample has a closed form: the smallest r where min over the clipped box
[max(0, x - r), min(1, x + r)] of some margin row (w_y - w_j) . x + (b_y - b_j) reaches 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.cli import main
from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.context import EvaluationContext
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.verification.graph import VerificationError


def linear_model() -> TorchPredictor:
    torch.manual_seed(3)
    layer = nn.Linear(6, 3)
    with torch.no_grad():
        layer.weight.mul_(4)
    return TorchPredictor(nn.Sequential(nn.Flatten(), layer), (1, 2, 3), 3, name="linear")


def exact_radius(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: int, grid: np.ndarray):
    """The largest grid radius whose clipped box keeps every margin row positive (0 if the
    sample is misclassified): the exact minimum of a linear row is at a corner."""
    rows = w[y] - np.delete(w, y, 0), b[y] - np.delete(b, y)
    best = 0.0
    for r in grid:
        lo, hi = np.clip(x - r, 0, 1), np.clip(x + r, 0, 1)
        low = (np.where(rows[0] > 0, lo, hi) * rows[0]).sum(1) + rows[1]
        if (low <= 0).any():
            return best
        best = r
    return best


def context(model: TorchPredictor, n: int = 12) -> EvaluationContext:
    generator = torch.Generator().manual_seed(4)
    x = torch.rand(n, 1, 2, 3, generator=generator)
    with torch.no_grad():
        y = model.logits(x).argmax(1)
    y[0] = (y[0] + 1) % 3  # one misclassified sample: radius 0 on both sides
    data = LoadedDataset("random", x, y, ("a", "b", "c"))
    return EvaluationContext(
        model, data, lambda s: default_registry().create("attack", s.name, s.config)
    )


@pytest.mark.parametrize("verifier", ["ibp", "crown", "alpha-crown"])
def test_average_certified_radius_matches_the_closed_form_on_a_linear_layer(verifier):
    model = linear_model()
    ctx = context(model)
    metric = default_registry().create("metric", "average-certified-radius",
                                       {"verifier": verifier})  # fmt: skip
    value = metric.compute(ctx)[0]
    layer = model.module[1]
    w, b = layer.weight.double().numpy(), layer.bias.double().numpy()
    grid = np.arange(0, 0.5 + 1e-9, 1e-4)
    exact = np.array([
        exact_radius(w, b, ctx.x[i].flatten().double().numpy(), int(ctx.y[i]), grid)
        for i in range(len(ctx.y))
    ])  # fmt: skip
    samples = value.verdicts
    certified = np.array([s.margin for s in samples])
    attacked = np.array([s.attack["attack_radius"] for s in samples])
    # bisection to 0.01: the certified radius is within one step below the exact one
    assert (certified <= exact + 1e-4).all() and (certified >= exact - 0.01 - 1e-4).all()
    assert (attacked >= exact - 1e-4).all()  # no point closer than the exact radius breaks it
    assert (attacked <= exact + 0.01 + 1e-4).all()  # PGD finds the corner on a linear model
    assert certified[0] == 0 and attacked[0] == 0
    assert 0 < (exact > 0).sum() < len(exact)  # the data covers both cases
    assert value.value == pytest.approx(certified.mean())
    assert value.details["attack_upper_bound"] == pytest.approx(attacked.mean())
    # certified-accuracy at an eps between two samples' exact radii: exactly those above it
    radii = np.unique(exact[exact > 0])
    eps = float(radii[len(radii) // 2 - 1] + radii[len(radii) // 2]) / 2
    accuracy = default_registry().create(
        "metric", "certified-accuracy", {"verifier": verifier, "eps": eps}
    )
    verdicts = [s.verdict for s in accuracy.compute(ctx)[0].verdicts]
    assert [v == "certified" for v in verdicts] == list(exact > eps)


def test_an_unsupported_op_fails_at_the_plan_check_before_any_work(tmp_path, capsys):
    from aisafety.config import plan_from_dict
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    plan = {
        "model": {"name": "mnist-cnn"},  # max-pools: the zonotope / dual verifiers cannot bound it
        "dataset": {"name": "mnist-embedded", "limit": 4},
        "metrics": ["ca", {"name": "certified-accuracy", "config": {"verifier": "deepz"}}],
    }
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    runner = Runner(plan_from_dict(plan), store, quiet=True)
    with pytest.raises(VerificationError, match=r"deepz.*maxpool.*'mnist-cnn'"):
        runner.prepare()
    with pytest.raises(VerificationError):
        runner.run()
    assert store.query("select count(*) from runs")[1] == [(0,)]  # nothing started
    radius = {**plan, "metrics": [{"name": "average-certified-radius",
                                   "config": {"verifier": "wk"}}]}  # fmt: skip
    with pytest.raises(VerificationError, match=r"wk.*maxpool.*'mnist-cnn'"):
        Runner(plan_from_dict(radius), store, quiet=True).prepare()
    config = tmp_path / "plan.yaml"
    config.write_text(json.dumps(plan))
    assert main(["evaluate", str(config), "--db", f"sqlite:///{tmp_path / 'c.db'}"]) == 2
    err = capsys.readouterr().err
    assert "maxpool" in err and "mnist-cnn" in err and "Traceback" not in err


def test_list_verifiers_json_names_every_verifier_and_the_complete_one(capsys):
    assert main(["list", "verifiers", "--format", "json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert {"ibp", "crown", "fast-lin", "crown-ibp", "alpha-crown", "complete"} <= set(listed)
    assert [n for n, e in listed.items() if e["complete"]] == ["bab", "complete"]
    assert all(e["description"] and e["plugin"] for e in listed.values())
    assert listed["complete"]["config"]["timeout"] == 60.0


@pytest.mark.parametrize("verifier", ["crown", "complete"])
def test_attack_first_verifies_only_what_the_attack_left_with_the_same_certified_set(verifier):
    ctx = context(linear_model(), n=24)
    eps = 0.05
    runs = {
        first: default_registry()
        .create("metric", "certified-accuracy",
                {"verifier": verifier, "eps": eps, "attack_first": first})
        .compute(ctx)[0]
        for first in (True, False)
    }  # fmt: skip
    every, first = runs[False].details, runs[True].details
    every_samples, first_samples = runs[False].verdicts, runs[True].verdicts
    broken = [s.attack["attack_broken"] for s in every_samples]
    assert broken[0] and 0 < sum(broken) < len(broken)  # sample 0 is misclassified
    # a sound verifier certifies no broken sample, so skipping them changes no certificate
    assert runs[True].value == runs[False].value > 0
    certified = [[s.verdict == "certified" for s in d] for d in (every_samples, first_samples)]
    assert certified[0] == certified[1]
    assert every["verified_samples"] == 24 and first["verified_samples"] == 24 - sum(broken)
    for s, was_broken in zip(first_samples, broken, strict=True):
        if was_broken:  # the attack's counterexample stands; the verifier never ran
            assert s.verdict == "falsified" and s.attack["attack_first"] and s.seconds is None
        else:
            assert "attack_first" not in s.attack and s.seconds >= 0
    assert all(s.seconds is not None for s in every_samples)
    assert first["falsified"] == pytest.approx(sum(broken) / 24)
    assert first["unknown"] + first["timeout"] + first["falsified"] + runs[True].value == (
        pytest.approx(1.0)
    )


def test_without_attack_first_a_certificate_on_a_broken_sample_is_a_soundness_error():
    from aisafety.errors import AISafetyError
    from aisafety.verification.result import Verdict, VerificationResult

    ctx = context(linear_model())
    metric = default_registry().create(
        "metric", "certified-accuracy", {"verifier": "ibp", "attack_first": False}
    )

    def certify_everything(graph, prop, model=None):  # an unsound verifier
        n = len(prop)
        return VerificationResult("ibp", [Verdict.CERTIFIED] * n, torch.ones(n),
                                  torch.zeros(n), torch.zeros_like(prop.lower))  # fmt: skip

    metric.verifier.verify = certify_everything
    with pytest.raises(AISafetyError, match="soundness bug"):
        metric.compute(ctx)[0]


def test_a_timed_out_sample_is_stored_as_timeout_never_certified():
    torch.manual_seed(5)
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    ctx = context(TorchPredictor(net, (1, 2, 3), 3, name="relu"))  # slopes to optimise
    # out of time in the verifier's first phase, its box-PGD given all of the limit
    # (``attack_share`` 1), before any bound completed (out of time later, alpha-CROWN
    # answers what its CROWN bound proved: anytime, #33)
    metric = default_registry().create(
        "metric", "certified-accuracy",
        {"verifier": "alpha-crown", "eps": 0.01,
         "verifier_config": {"attack_steps": 1_000_000, "timeout": 0.05,
                             "attack_share": 1.0}},
    )  # fmt: skip
    value = metric.compute(ctx)[0]
    samples = value.verdicts
    assert value.value == 0 and value.details["timeout"] > 0
    assert {s.verdict for s in samples} <= {"timeout", "falsified"}
    assert all(s.margin is None for s in samples)  # nothing proved: no margin stored


def exact_robust(model: TorchPredictor, x: torch.Tensor, y: torch.Tensor, eps: float):
    """Per sample, whether every margin row stays > 0 on the clipped eps-box (float64): the
    minimum of a linear row is at the corner its signs pick, so this is exact."""
    layer = model.module[1]
    w, b = layer.weight.double().numpy(), layer.bias.double().numpy()
    robust = []
    for xi, yi in zip(x.flatten(1).double().numpy(), y.tolist(), strict=True):
        rows, offsets = w[yi] - np.delete(w, yi, 0), b[yi] - np.delete(b, yi)
        lo, hi = np.clip(xi - eps, 0, 1), np.clip(xi + eps, 0, 1)
        robust.append(bool(((np.where(rows > 0, lo, hi) * rows).sum(1) + offsets > 0).all()))
    return np.array(robust)


# an attack that does not move (one step of 1e-9 from the image): it breaks only sample 0,
# the misclassified one, so the verifier's counterexamples are all that lower its bound
STILL = {"attack": "pgd-linf",
         "attack_config": {"steps": 1, "step_size": 1e-9, "random_start": False}}  # fmt: skip


@pytest.mark.parametrize("first", [True, False])
def test_the_upper_bound_counts_the_verifiers_replayed_counterexamples_sample_by_sample(first):
    """On a linear layer ``crown`` is exact: it certifies or falsifies every sample. The
    upper bound is the closed form's robust fraction, below the attack's alone (11 of 12);
    before session 21 it was the attack's (0.8 stored where the verifiers gave 0.75)."""
    model, eps = linear_model(), 0.6  # sample 3's lowest row -0.30 there, the others >= 0.059
    ctx = context(model)
    config = {"verifier": "crown", "eps": eps, "attack_first": first, **STILL}
    value = default_registry().create("metric", "certified-accuracy", config).compute(ctx)[0]
    robust = exact_robust(model, ctx.x, ctx.y, eps)
    assert value.details["attack_robust_accuracy"] == pytest.approx(11 / 12)
    assert 0 < robust.mean() < 11 / 12  # the verifier refutes some sample the attack left
    assert value.details["attack_upper_bound"] == pytest.approx(robust.mean())
    assert value.value == pytest.approx(robust.mean())  # exact: the two bounds meet


def test_a_falsified_verdict_whose_point_does_not_replay_lowers_no_upper_bound():
    """A verifier's word is not a counterexample: a ``falsified`` verdict at the image itself
    (correctly classified there) is checked here and not counted."""
    from aisafety.verification.result import Verdict, VerificationResult

    ctx = context(linear_model())
    config = {"verifier": "ibp", "eps": 0.05, **STILL}
    metric = default_registry().create("metric", "certified-accuracy", config)

    def falsify_everything(graph, prop, model=None):  # points that break nothing
        n, centre = len(prop), ((prop.lower + prop.upper) / 2).float()
        return VerificationResult("ibp", [Verdict.FALSIFIED] * n, torch.zeros(n),
                                  torch.zeros(n), centre)  # fmt: skip

    metric.verifier.verify = falsify_everything
    details = metric.compute(ctx)[0].details
    assert details["attack_upper_bound"] == details["attack_robust_accuracy"] == 11 / 12
