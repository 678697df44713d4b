"""Every capability family with ``device: cuda``, its numbers against the same plan on the CPU.

Skipped without a CUDA GPU (marker ``cuda``; ``bench/gpu.sh`` runs these on a GPU machine).
``AISAFETY_TEST_DEVICE=cpu`` runs the same comparisons with the CPU on both sides, which
checks the test's own mechanics on a machine without a GPU.

Random draws are made on the host (``aisafety/randomness.py``), so both runs start their
attacks, noise and corruptions from the same numbers. What may still differ is arithmetic:
cuDNN's convolution algorithms (TF32 by default on Ampere and later) and reduction orders.
Values that do not go through an attack's search must agree within 1e-3 (CA, coverage,
corruptions, certified accuracy: verifiers bound in float64). An attack's search can turn a
sample the other way where a float difference decides a step, so attack-based values may
differ by at most 3 samples' worth (3 / n of the value, n its sample count); the test prints
every difference it allows.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest
import torch
from shapes import build  # testkit/, on the path from conftest.py

import aisafety
from aisafety import memory_budget
from aisafety.attack import base
from aisafety.attack.pgd import PGDLinf
from aisafety.errors import MemoryBudgetError
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.unit_cost import reset_peak_rss, status_bytes

DEVICE = os.environ.get("AISAFETY_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
]
N = 48
# values that an attack's or a boundary search's steps decide (they may flip a few samples)
SEARCHED = {"aaw", "aab", "robust-accuracy", "asr", "acac", "actc", "nte", "ald", "ass", "psd",
            "cav", "crr", "csr", "ccv", "cos", "ebd", "ebd2", "eni", "rdi", "roby",
            "adversarial-hypervolume", "zero-gradient-rate"}  # fmt: skip
SMALL = {"steps": 5, "queries": 60, "restarts": 1, "max_steps": 20, "iterations": 5,
         "population": 20, "n_target_classes": 2, "samples": 16}  # fmt: skip


def small_config(name: str) -> dict:
    """The attack's config with every budget-like field it has set small."""
    fields = default_registry().get("attack", name).Config.model_fields
    return {key: value for key, value in SMALL.items() if key in fields}


def run(plan: dict, device: str, tmp_path) -> tuple[dict[tuple, float], dict[tuple, int]]:
    """The plan's stored values on ``device`` and their sample counts, keyed by what each
    value was computed on."""
    db = tmp_path / f"{device}-{abs(hash(str(plan)))}.db"
    record = aisafety.evaluate({**plan, "device": device}, db=f"sqlite:///{db}")
    assert not record.failed_units, record.failed_units
    seen: Counter = Counter()
    values, counts = {}, {}
    for v in record.values:
        key = (v.metric, v.attack_key or v.attack, v.eps)
        values[(*key, seen[key])] = v.value
        counts[(*key, seen[key])] = max(v.n_samples, 1)
        seen[key] += 1
    return values, counts


def compare(cpu_run: tuple[dict, dict], gpu_run: tuple[dict, dict]) -> None:
    """Every value of the device run against the CPU run's; an attack-decided one may differ
    by 3 of its samples' worth (3 / n of it, n its stored sample count)."""
    (cpu, n), (gpu, _) = cpu_run, gpu_run
    assert cpu.keys() == gpu.keys()
    differing = []
    for key, a in cpu.items():
        b = gpu[key]
        if math.isnan(a) and math.isnan(b):
            continue
        loose = key[0].split("(")[0] in SEARCHED or key[1] is not None
        tolerance = max(3 / n[key], 1e-3) if loose else 1e-3
        assert math.isfinite(b) == math.isfinite(a), (key, a, b)
        assert math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance), (key, a, b)
        if a != b:
            differing.append(f"{key}: cpu {a:.6g} {DEVICE} {b:.6g}")
    print(f"{len(cpu)} values, {len(differing)} differ within tolerance:", *differing, sep="\n  ")


def test_every_attack_on_the_device_matches_the_cpu(tmp_path):
    names = sorted(set(default_registry().names("attack")) - {"transfer"})
    attacks = [{"name": name, "eps": [0.1], "config": small_config(name)} for name in names]
    plan = {"dataset": {"name": "mnist-embedded", "limit": N}, "attacks": attacks,
            "metrics": ["ca", "robust-accuracy"], "seed": 0}  # fmt: skip
    compare(run(plan, "cpu", tmp_path), run(plan, DEVICE, tmp_path))


def test_metrics_corruptions_and_defenses_on_the_device_match_the_cpu(tmp_path):
    plan = {
        "model": {"name": "mnist-cnn-pgd-at"},
        "reference_model": {"name": "mnist-cnn"},
        "dataset": {"name": "mnist-embedded", "limit": N},
        "attacks": [
            {"name": "fgsm", "eps": [0.1, 0.3]},
            {"name": "pgd-linf", "eps": [0.1, 0.3], "config": {"steps": 10}},
            {"name": "square-linf", "eps": [0.3], "config": {"queries": 50}},
        ],
        "metrics": [
            "ca",
            "aaw",
            "aab",
            "robust-accuracy",
            "asr",
            "acac",
            "actc",
            "nte",
            {"name": "ald", "config": {"p": "2"}},
            "ass",
            "psd",
            "kmncov",
            "nbcov",
            "snacov",
            "tkncov",
            "mce",
            "rmce",
            {"name": "mfr", "config": {"n_frames": 3, "samples": 16}},
            {"name": "mfp", "config": {"n_frames": 3, "samples": 16}},
            "cav",
            "crr",
            "csr",
            "ccv",
            "cos",
            {"name": "ebd", "config": {"n_directions": 4, "levels": 5, "refine": 2, "samples": 8}},
            {"name": "ebd2", "config": {"step_size": 0.05, "max_steps": 10, "samples": 8}},
            "eni",
            "neuron-sensitivity",
            "neuron-uncertainty",
            "rdi",
            "zero-gradient-rate",
        ],  # fmt: skip
        "seed": 0,
    }
    compare(run(plan, "cpu", tmp_path), run(plan, DEVICE, tmp_path))


@pytest.mark.parametrize("defense", sorted(default_registry().names("defense")))
def test_each_input_defense_on_the_device_matches_the_cpu(tmp_path, defense):
    plan = {"dataset": {"name": "mnist-embedded", "limit": 24},
            "defenses": [{"name": defense}],
            "attacks": [{"name": "pgd-linf", "eps": [0.1], "config": {"steps": 5}}],
            "metrics": ["ca", "robust-accuracy"], "seed": 0}  # fmt: skip
    compare(run(plan, "cpu", tmp_path), run(plan, DEVICE, tmp_path))


def test_verifiers_and_smoothing_on_the_device_match_the_cpu(tmp_path):
    # the SDP verifiers solve on the host (cvxpy) and refuse this model by its size (they are
    # for networks of ~100 neurons: tests/test_sdp.py); the MILP behind 'complete' is HiGHS's
    host_only = {"complete", "sdpverify", "lmiverify"}
    verifiers = [v for v in default_registry().names("verifier") if v not in host_only]
    metrics = [
        {"name": "certified-accuracy",
         "config": {"verifier": v, "eps": 0.02, "attack_config": {"steps": 10}}}
        for v in verifiers
    ]  # fmt: skip
    metrics += [
        {
            "name": "smoothed-certified-accuracy",
            "config": {"n": 200, "n0": 20, "sigma": 0.25, "batch_size": 200},
        },
        {"name": "average-certified-radius", "config": {"verifier": "crown-ibp"}},
    ]
    plan = {"model": {"name": "sok-fcnn-b-adv1"},
            "dataset": {"name": "mnist-embedded", "limit": 16},
            "metrics": ["ca", *metrics], "seed": 0}  # fmt: skip
    compare(run(plan, "cpu", tmp_path), run(plan, DEVICE, tmp_path))


def test_the_report_renders_a_device_run(tmp_path):
    from aisafety.report_page import build_report
    from aisafety.store.results import ResultStore

    plan = {"dataset": {"name": "mnist-embedded", "limit": 16},
            "attacks": [{"name": "pgd-linf", "eps": [0.1, 0.3], "config": {"steps": 5}}],
            "metrics": ["ca", "aaw", "robust-accuracy"], "device": DEVICE}  # fmt: skip
    db = f"sqlite:///{tmp_path / 'report.db'}"
    record = aisafety.evaluate(plan, db=db)
    page = build_report(ResultStore(db), record.run_id)
    assert "robust" in page.lower() and DEVICE in page


# the shapes users evaluate, random weights; images per run on the device and on the CPU check
AT_SIZE = {"wrn-28-10": (256, 8), "resnet-50": (48, 4)}


def peak_growth(work) -> tuple[int, int]:
    """(bytes, reserved bytes) the device's allocations peaked above what was held before
    ``work``: the caching allocator's count on CUDA (cuDNN's and cuBLAS's workspaces come
    from it too), the resident size's peak on the CPU (both numbers)."""
    if DEVICE == "cpu":
        reset_peak_rss()
        before = status_bytes("VmRSS")
        work()
        grown = status_bytes("VmHWM") - before
        return grown, grown
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    work()
    torch.cuda.synchronize()
    return (
        torch.cuda.max_memory_allocated() - allocated,
        torch.cuda.max_memory_reserved() - reserved,
    )


def at_size(shape: str, n: int) -> tuple[TorchPredictor, torch.Tensor, torch.Tensor]:
    module, input_shape, classes = build(shape)
    model = TorchPredictor(module, input_shape, classes, name=shape, device=DEVICE)
    x = torch.rand(n, *input_shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    return model, x, model.predict(x)


@pytest.mark.parametrize("shape", sorted(AT_SIZE))
def test_an_attack_keeps_its_memory_budget_on_the_device(shape):
    """PGD on the WRN-28-10 and ResNet-50 shapes under a budget of a quarter of its images
    (and the result it keeps): it chunks, and the device's peak allocation stays under the
    budget. The estimate (``prediction/footprint.py``) was checked against the CPU's resident
    size only; a GPU adds cuDNN's workspaces, which this measures."""
    n = AT_SIZE[shape][DEVICE == "cpu"]
    model, x, y = at_size(shape, n)
    attack = PGDLinf(steps=2)
    one = attack.image_memory(model)  # its one-image probe runs here, before the measurement
    held = base.RESULT_COPIES * x.numel() * 4
    budget = held + one * max(1, n // 4)
    with memory_budget.memory_limit(budget):
        chunk = attack._budget_chunk(model, n, held)
        peak, reserved = peak_growth(lambda: attack(model, x, y, 8 / 255, chunk_size=n))
    print(f"{shape} on {DEVICE}: {n} images in chunks of {chunk}; one image {one / 2**20:.1f} "
          f"MiB, budget {budget / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB "
          f"({peak / budget:.3f} of it), reserved {reserved / 2**20:.1f} MiB")  # fmt: skip
    assert 1 <= chunk < n
    assert peak <= budget


def test_an_attack_over_the_budget_on_the_device_is_refused_before_it_allocates():
    model, x, y = at_size("resnet-50", 2)
    attack = PGDLinf(steps=2)
    one = attack.image_memory(model)

    def refused() -> None:
        with memory_budget.memory_limit(one // 2), pytest.raises(MemoryBudgetError) as caught:
            attack(model, x, y, 8 / 255)
        assert "memory_gib" in str(caught.value), caught.value

    peak, _ = peak_growth(refused)
    print(f"refused on {DEVICE}: peak growth {peak} bytes")
    # the input checks' scalars may come first (3,072 bytes on an H200, 2026-11-28), nothing
    # of one image's size (602,112 bytes here)
    assert DEVICE == "cpu" or peak < x[0].numel() * x.element_size()


@pytest.mark.skipif(DEVICE == "cpu", reason="the default budget of a GPU: its free memory")
def test_the_default_budget_of_the_device_chunks_a_large_batch():
    """Without a plan budget, half of the card's free memory: 1,024 ResNet-50 images in one
    call chunk under it and finish (no CUDA out-of-memory error)."""
    model, x, y = at_size("resnet-50", 1024)
    attack = PGDLinf(steps=1)
    budget = memory_budget.default_budget(DEVICE)
    chunk = attack._budget_chunk(model, len(x), base.RESULT_COPIES * x.numel() * 4)
    peak, reserved = peak_growth(lambda: attack(model, x, y, 8 / 255))
    print(f"default budget {budget / 2**30:.2f} GiB: chunks of {chunk}, peak "
          f"{peak / 2**30:.2f} GiB, reserved {reserved / 2**30:.2f} GiB")  # fmt: skip
    assert peak <= budget
