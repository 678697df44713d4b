"""Every registered capability at the sizes users run (issue 32), slow: the WRN-28-10 shape
(36.5 M weights, 3x32x32) on the shipped CIFAR-10 subset and the ResNet-50 shape (25.6 M,
3x224x224) on foolbox's ImageNet samples, random weights (``testkit/shapes.py``: the mechanics
and memory do not depend on the weights' values), two images and few iterations.

Each run must end without a failed unit and store finite values (a verifier's ``timeout``
verdicts included: a sound answer; NaN only where it is the metric's documented value for
an undefined case, ``undefined``, printed as ``UNDEFINED``); the peak resident growth
of each run is printed (``PEAK`` lines; docs/memory.md records them). A capability that
cannot apply to a shape is named with its reason, never skipped silently: ``transfer`` (its
surrogate is a 1x28x28 zoo net); a verifier outside ``MUST_ANSWER`` may refuse the
architecture before any work, naming what it cannot bound (a residual net or max-pooling
for the chain-only verifiers), or refuse by its memory budget before any allocation, naming
the estimate and the budget (the LP / MILP verifiers, whose rows are dense in the inputs);
the refusal is printed.

``AISAFETY_TEST_DEVICE=cuda`` runs the same on a GPU (``device: cuda``; the verifiers bound on
the host either way) and prints the card's peak allocation beside the resident growth."""

from __future__ import annotations

import math
import os

import pytest
import torch
from at_size_plan import METRICS, metric_plan
from shapes import build

import aisafety
from aisafety.corruption import CORRUPTIONS
from aisafety.database.datasets.labelled_files import LabelledFilesDataset
from aisafety.errors import MemoryBudgetError
from aisafety.interfaces import DatasetSpec
from aisafety.loading import load_data
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.unit_cost import reset_peak_rss, status_bytes
from aisafety.verification.graph import VerificationError
from tests.shared_data import shared_folder

pytestmark = pytest.mark.slow
DEVICE = os.environ.get("AISAFETY_TEST_DEVICE", "cpu")
N = 2
SMALL = {"steps": 2, "queries": 10, "restarts": 1, "max_steps": 2, "iterations": 2,
         "population": 4, "n_target_classes": 1, "samples": 4, "nb_samples_per_step": 2,
         "eot_iter": 1, "n_iter": 2, "max_iter": 2}  # fmt: skip
# not run on these shapes: the surrogate of 'transfer' is a zoo MNIST net (1x28x28)
NOT_HERE = {"transfer": "its surrogate is a 1x28x28 zoo net; the shapes take 3-channel images"}
REGISTRY = default_registry()
# verifiers that must answer on each shape (the others answer or refuse with the reason)
# (ResNet-50's stem max-pools: the CROWN family bounds it, ops.MaxPool)
CROWN_FAMILY = {"ibp", "crown", "fast-lin", "crown-ibp", "alpha-crown", "deeppoly"}
MUST_ANSWER = {"wrn-28-10": CROWN_FAMILY, "resnet-50": CROWN_FAMILY}


def small_config(kind: str, name: str) -> dict:
    fields = REGISTRY.get(kind, name).Config.model_fields
    return {key: value for key, value in SMALL.items() if key in fields}


def evaluate(shape: str, plan: dict, tmp_path, own_labels: bool = False):
    """Run ``plan`` on the shape's net and data; print its peak resident growth.

    ``own_labels``: label the images with the net's own predictions. A random net is wrong
    on both images, and the metrics over the clean-correct samples are then undefined (NaN,
    n_samples 0, docs/metrics.md); with its own labels they have samples to average."""
    plan = dict(plan)
    label = plan.pop("label")
    net, input_shape, classes = build(shape)
    if shape == "resnet-50":
        imagenet = shared_folder("imagenet-samples-foolbox")
        data = LabelledFilesDataset().load(imagenet, "test")
        extra = {"data": (data.x[:N], data.y[:N])}
    else:
        plan = {**plan, "dataset": {"name": "cifar10-embedded", "limit": N}}
        extra = {}
    if own_labels:
        x = extra["data"][0] if extra else load_data(DatasetSpec(**plan["dataset"]), REGISTRY).x
        with torch.no_grad():
            extra = {"data": (x, net(x).argmax(1))}
    reset_peak_rss()  # the peak resident size (VmHWM) := the current one
    before = status_bytes("VmRSS")
    held = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    record = aisafety.evaluate(
        {**plan, "seed": 0, "batch_size": N, "device": DEVICE},
        db=f"sqlite:///{tmp_path / 'at-size.db'}",
        model=TorchPredictor(net, input_shape, classes, name=shape, device=DEVICE),
        **extra,
    )
    peak = status_bytes("VmHWM") - before
    card = (torch.cuda.max_memory_allocated() - held) / 2**30 if DEVICE == "cuda" else None
    on_card = f", card {card:.2f} GiB above {held / 2**30:.2f} held" if card is not None else ""
    print(f"PEAK {shape} {label}: {peak / 2**30:.2f} GiB{on_card}", flush=True)
    assert not record.failed_units, record.failed_units
    assert record.values, f"{label}: no value stored"
    nan = [v for v in record.values if not math.isfinite(v.value)]
    bad = [(v.metric, v.attack, v.value, v.n_samples) for v in nan if not undefined(v)]
    assert not bad, bad
    for v in nan:
        print(f"UNDEFINED {shape} {v.metric} {v.attack}: {undefined(v)}")
    return record


def undefined(value) -> str:
    """Why a NaN is the metric's documented value (docs/metrics.md), or "" if it is not:
    no sample to average over, a reference that never flips (mfr), one predicted class
    (roby; a random net of these shapes predicts one class for every image)."""
    details = value.details
    if value.n_samples == 0:
        return "no sample to average over (n_samples 0)"
    if details.get("undefined") and not details.get("per_sequence"):
        return f"the reference flips on no sequence ({', '.join(details['undefined'])})"
    if details.get("classes", 2) < 2:
        return f"{details['classes']} predicted class"
    return ""


SHAPES = ("wrn-28-10", "resnet-50")
ATTACKS = [a for a in REGISTRY.names("attack") if a not in NOT_HERE]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("attack", ATTACKS)
def test_every_attack(shape, attack, tmp_path):
    spec = {"name": attack, "eps": [2 / 255], "config": small_config("attack", attack)}
    evaluate(shape, {"label": f"attack {attack}", "attacks": [spec],
                     "metrics": ["ca", "robust-accuracy"]}, tmp_path)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_every_corruption(shape, corruption, tmp_path):
    evaluate(shape, {"label": f"corruption {corruption}", "metrics": ["ca", "mce"],
                     "corruptions": {"names": [corruption], "severities": [3]}},
             tmp_path)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("defense", REGISTRY.names("defense"))
def test_every_input_defense(shape, defense, tmp_path):
    config = {"samples": 8, "batch_size": 8} if defense == "randomized-smoothing" else {}
    evaluate(shape, {"label": f"defense {defense}",
                     "defenses": [{"name": defense, "config": config}],
                     "attacks": [{"name": "fgsm", "eps": [2 / 255]}],
                     "metrics": ["ca", "robust-accuracy"]}, tmp_path)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_every_metric(shape, tmp_path):
    names = {m if isinstance(m, str) else m["name"] for m in METRICS}
    verifier_metrics = {"certified-accuracy", "ibp-certified-accuracy", "average-certified-radius"}
    assert names | verifier_metrics == set(REGISTRY.names("metric"))
    # the plan, with the per-metric parameters of a user at this size, is shared with
    # bench/metrics_at_size.py (testkit/at_size_plan.py; the CPU seconds and peak of each
    # metric, docs/scale.md)
    # the WRN's profile data is the shipped CIFAR-10 subset: it runs without shared/
    imagenet = shared_folder("imagenet-samples-foolbox") if shape == "resnet-50" else None
    plan = {"label": "metrics", **metric_plan(shape, imagenet)}
    record = evaluate(shape, plan, tmp_path, own_labels=True)
    valued = {v.metric.split("(")[0] for v in record.values}  # 'mfr(n_frames=2,...)' is mfr
    assert names <= valued, f"no value from {sorted(names - valued)}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("verifier", REGISTRY.names("verifier"))
def test_every_verifier(shape, verifier, tmp_path):
    config = {"verifier": verifier, "eps": 1 / 255, "verifier_config": {"timeout": 5},
              "attack_config": {"steps": 2}}  # fmt: skip
    metrics = [{"name": "certified-accuracy", "config": config}]
    if verifier == "ibp":
        metrics += ["ibp-certified-accuracy",
                    {"name": "average-certified-radius",
                     "config": {"verifier": "ibp", "attack_steps": 2}}]  # fmt: skip
    plan = {"label": f"verifier {verifier}", "metrics": metrics}
    if verifier in MUST_ANSWER[shape]:
        evaluate(shape, plan, tmp_path)
        return
    # a verifier may not take the architecture (the chain-only verifiers refuse residual
    # nets and max-pooling): then it refuses before any work, naming the node or the shape
    # it cannot bound; the LP / MILP ones refuse by their memory budget at these sizes
    try:
        evaluate(shape, plan, tmp_path)
    except VerificationError as refusal:
        print(f"REFUSED {shape} verifier {verifier}: {str(refusal)[:160]}")
        chain_only = "needs a sequential ReLU network" in str(refusal)  # sdpverify's form
        assert ("cannot" in str(refusal) or chain_only) and shape in str(refusal)
    except MemoryBudgetError as refusal:  # before any allocation: the estimate and budget
        print(f"REFUSED {shape} verifier {verifier}: {str(refusal)[:240]}")
        assert "needs about" in str(refusal) and "memory budget" in str(refusal)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_report(shape, tmp_path):
    from aisafety.report_page import build_report
    from aisafety.store.results import ResultStore

    plan = {"label": "report", "attacks": [{"name": "fgsm", "eps": [1 / 255, 2 / 255]}],
            "metrics": ["ca", "robust-accuracy", "aaw"]}  # fmt: skip
    record = evaluate(shape, plan, tmp_path)
    page = build_report(ResultStore(f"sqlite:///{tmp_path / 'at-size.db'}"), record.run_id)
    assert "robust" in page.lower() and shape in page
