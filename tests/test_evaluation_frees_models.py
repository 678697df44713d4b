"""Nothing of a model outlives its evaluation, family by family (testkit/model_leaks.py).

A notebook evaluating 20 models on a GPU ran out of memory: the memory probe kept every
evaluated model's weights alive (tests/test_probe_frees_the_model.py; on an NVIDIA H200 the
card grew by about each model's weights per ``aisafety.evaluate`` call). Each test here
evaluates a fresh tiny net (and, where the plan has one, a reference net built by the
checker's factory) with one family's plans, drops it, collects, and asserts that no weight
and no tensor with an autograd node is left. With the probe's old pack hook put back, every
With the probe's old pack hook put back (the saved tensor returned itself), the run of one
of each family fails (5 of its 11 weights, the reference net's 5 and 8 tensors with a graph
left). The runs take 4 images of 3x8x8 and the smallest budgets: about 1 s on one thread
for the two quick runs once the modules are imported; every member of each family
(``PLANS``) under -m slow."""

from __future__ import annotations

import pytest
import torch
from model_leaks import REFERENCE, evaluate_and_drop, tiny_net

from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.integrity import RunIntegrity
from aisafety.prediction.torch_module import TorchPredictor

EPS = [0.03]


def attack(name: str, **config) -> dict:
    return {"name": name, "eps": EPS, "config": config}


def certified(verifier: str, eps: float = 0.01, **config) -> dict:
    return {"name": "certified-accuracy",
            "config": {"eps": eps, "verifier": verifier, "verifier_config": config}}  # fmt: skip


SMOOTHING = {"n": 16, "n0": 4, "batch_size": 16}
PLANS = {
    # each kind of attack: gradient, score-based, decision-based, the ensemble, bf16 search
    "attacks": {"attacks": [
        attack("fgsm"), attack("pgd-linf", steps=2), attack("apgd-ce", steps=2),
        attack("cw-l2", steps=2), attack("deepfool-linf"), attack("fab-t"),
        attack("square-linf", queries=5), attack("spsa", steps=1), attack("nattack"),
        attack("boundary", steps=5), attack("standard", steps=2, queries=5),
        attack("pgd-l2", steps=2, precision="bf16"),
    ], "metrics": ["ca", "robust-accuracy", "aab", "aaw", "asr", "acac", "actc", "nte",
                   {"name": "ald", "config": {"p": "2"}}, "ass", "psd"]},
    # examples/full.yaml's other metrics: corruptions, coverage, structure, the reference
    "metrics": {"reference_model": REFERENCE, "corruptions": {"severities": [1]},
                "attacks": [attack("fgsm")], "metrics": [
        "mce", "rmce", {"name": "mfr", "config": {"n_frames": 2, "samples": 2}},
        {"name": "mfp", "config": {"n_frames": 2, "samples": 2}},
        "cav", "crr", "csr", "ccv", "cos", "kmncov", "nbcov", "snacov", "tkncov",
        "neuron-sensitivity", "neuron-uncertainty", "eni", "rdi", "roby", "zero-gradient-rate",
        {"name": "ebd", "config": {"n_directions": 2, "levels": 2, "refine": 1, "samples": 2}},
        {"name": "ebd2", "config": {"step_size": 0.05, "max_steps": 2, "samples": 2}},
        "adversarial-hypervolume"]},
    # the verifiers (margins.py's graphs of ibp-certified-accuracy too), smoothing certificates
    "certificates": {"metrics": [
        certified("ibp"), certified("crown"), certified("alpha-crown", steps=2),
        certified("bab", steps=2), certified("complete", alpha_steps=2),
        {"name": "ibp-certified-accuracy", "config": {"eps": 0.001}},
        {"name": "average-certified-radius", "config": {"verifier": "crown"}},
        {"name": "smoothed-certified-accuracy", "config": SMOOTHING},
        {"name": "smoothed-average-certified-radius", "config": SMOOTHING}]},
    # the input defenses: randomized smoothing's votes, an EOT attacker's passes
    "smoothing": {"defenses": [{"name": "randomized-smoothing", "config": {"samples": 4}}],
                  "attacks": [attack("pgd-linf", steps=2)], "metrics": ["ca", "robust-accuracy"]},
    "eot": {"defenses": [{"name": "jpeg", "config": {"eot_samples": 2}}],
            "attacks": [attack("pgd-linf", steps=2)], "metrics": ["ca", "robust-accuracy"]},
}  # fmt: skip


# one of each family in one run, and one input defense (random, EOT) in another: the
# default suite's check; every family's members run under -m slow (PLANS)
QUICK = {
    "one of each": {"reference_model": REFERENCE, "corruptions": {"severities": [1]},
                    "attacks": [attack("fgsm"), attack("square-linf", queries=5),
                                attack("boundary", steps=5),
                                attack("standard", steps=2, queries=5)],
                    "metrics": [
        "ca", "robust-accuracy", "aab", "mce", "cav", "kmncov", "neuron-sensitivity",
        {"name": "mfr", "config": {"n_frames": 2, "samples": 2}},
        {"name": "ebd", "config": {"n_directions": 2, "levels": 2, "refine": 1, "samples": 2}},
        certified("ibp"), certified("crown"),
        {"name": "ibp-certified-accuracy", "config": {"eps": 0.001}},
        {"name": "smoothed-certified-accuracy", "config": SMOOTHING}]},
    "randomized smoothing with EOT": {
        "defenses": [{"name": "randomized-smoothing", "config": {"samples": 4, "eot_samples": 2}}],
        "attacks": [attack("pgd-linf", steps=2)], "metrics": ["ca", "robust-accuracy"]},
}  # fmt: skip


@pytest.mark.parametrize("plan", sorted(QUICK))
def test_an_evaluation_leaves_nothing_of_its_models(plan, tmp_path):
    plan = {"seed": 0, "batch_size": 4, **QUICK[plan]}
    assert evaluate_and_drop(plan, f"sqlite:///{tmp_path / 'r.db'}") == []


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PLANS))
def test_no_family_keeps_anything_of_its_models(family, tmp_path):
    """Every member of each family (the quick test above runs one of each)."""
    plan = {"seed": 0, "batch_size": 4, **PLANS[family]}
    assert evaluate_and_drop(plan, f"sqlite:///{tmp_path / 'r.db'}") == []


def test_the_pristine_copies_are_on_the_host_and_weigh_the_shared_state():
    """RunIntegrity's copies (to restore after a tampering plugin) live in host memory: on a
    GPU a second model in the card's memory for the whole run, which a plan's budget did not
    count. On the CPU, what they hold is every weight and buffer, the images, the labels and
    the clean outputs, each once (tensor byte counts: tracemalloc does not see torch)."""
    torch.manual_seed(0)
    module = tiny_net()
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    data = LoadedDataset("four", x, y, tuple("0123456789"))
    predictor = TorchPredictor(module, (3, 8, 8), 10)
    ctx = EvaluationContext(predictor, data, lambda spec: None, 4)
    integrity = RunIntegrity(ctx)
    # the network with its normalisation (mean and std: 24 bytes), the images, the labels
    network = sum(t.nbytes for t in predictor.network.state_dict().values())
    shared = network + x.nbytes + y.nbytes
    assert integrity.pristine_bytes() == {"cpu": shared}
    ctx.clean_logits  # noqa: B018 - computed since: copied at the next check
    integrity.check("test")
    assert integrity.pristine_bytes() == {"cpu": shared + 4 * 10 * 4}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_card_holds_no_pristine_copy_and_a_restore_puts_the_weights_back():
    """On a GPU the copies took a second model's weights of the card's memory; a restore
    puts the host copies back on the card, and the clean outputs where they were."""
    torch.manual_seed(0)
    module = tiny_net().cuda()
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    predictor = TorchPredictor(module, (3, 8, 8), 10, device="cuda")
    ctx = EvaluationContext(predictor, LoadedDataset("four", x, y, tuple("0123456789")),
                            lambda spec: None, 4)  # fmt: skip
    held = torch.cuda.memory_allocated()
    integrity = RunIntegrity(ctx)
    assert torch.cuda.memory_allocated() == held
    assert set(integrity.pristine_bytes()) == {"cpu"}
    before = {k: v.clone() for k, v in module.state_dict().items()}
    ctx.clean_logits  # noqa: B018 - copied at the next check
    integrity.check("test")
    logits = ctx.clean_logits.clone()
    with torch.no_grad():
        module[0].weight.mul_(0)
    ctx.__dict__["clean_logits"] = torch.zeros_like(logits)
    integrity.restore()
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    assert module[0].weight.device.type == "cuda"
    assert torch.equal(ctx.clean_logits, logits) and ctx.clean_logits.device == logits.device
