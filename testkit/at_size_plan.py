"""The every-metric plan at the sizes users run, with the per-metric settings of a user at
this size (noise draws of the smoothing metrics, frames of ``mfr``/``mfp``, EBD's directions,
EBD-2's steps): tests/test_at_size.py checks that every metric gives a value under it, and
bench/metrics_at_size.py measures each metric's CPU seconds and peak (docs/scale.md)."""

from __future__ import annotations

from pathlib import Path

TESTKIT = Path(__file__).resolve().parent
METRICS = [
    "ca", "aaw", "aab", "robust-accuracy", "asr", "acac", "actc", "nte", "ald", "ass", "psd",
    "kmncov", "nbcov", "snacov", "tkncov", "neuron-sensitivity", "neuron-uncertainty",
    "mce", "rmce", "cav", "crr", "csr", "ccv", "cos", "eni", "rdi", "roby",
    "zero-gradient-rate", "adversarial-hypervolume",
    {"name": "mfr", "config": {"n_frames": 2, "samples": 2}},
    {"name": "mfp", "config": {"n_frames": 2, "samples": 2}},
    {"name": "ebd", "config": {"n_directions": 2, "levels": 2, "refine": 1, "samples": 2}},
    # every class is a target (1,000 on ResNet-50): the rows stop once a count cannot fall
    {"name": "ebd2", "config": {"step_size": 0.05, "max_steps": 2, "samples": 2}},
    {"name": "smoothed-certified-accuracy", "config": {"n": 16, "n0": 4, "batch_size": 16}},
    # n and n0 are the noise draws per image ('samples' is a subset of the images: with it
    # alone, the default 10,100 draws per image kept this plan from finishing in 43 minutes)
    {"name": "smoothed-abstention-rate", "config": {"n": 16, "n0": 4, "batch_size": 16}},
    {"name": "smoothed-average-certified-radius",
     "config": {"n": 16, "n0": 4, "batch_size": 16}},
]  # fmt: skip
# a white-box attack for the attack metrics, and a score attack for 'aab' (black-box only)
ATTACKS = [{"name": "fgsm", "eps": [2 / 255]},
           {"name": "pgd-linf", "eps": [2 / 255], "config": {"steps": 2}},
           {"name": "square-linf", "eps": [2 / 255], "config": {"queries": 10}}]  # fmt: skip


def metric_plan(shape: str, imagenet: Path | None) -> dict:
    """The every-metric plan of ``shape``: the attacks, a reference model (another random
    net of the shape, testkit/shapes.py, for the metrics that compare with an undefended
    model) and profile data for the coverage metrics' neuron bounds (the train split by
    default, which neither shipped set has: the shipped images stand in for it; ResNet-50's
    are the ``imagenet`` folder, foolbox's samples in shared/data; unused for the WRN)."""
    factory, input_shape, classes = {
        "wrn-28-10": ("shapes:wide_resnet", [3, 32, 32], 10),
        "resnet-50": ("shapes:resnet50", [3, 224, 224], 1000),
    }[shape]
    reference = {"source": "python", "name": f"{shape}-reference", "factory": factory,
                 "python_path": [str(TESTKIT)], "input_shape": input_shape,
                 "num_classes": classes}  # fmt: skip
    profile = (
        {"name": "cifar10-embedded", "split": "test", "limit": 8}
        if shape == "wrn-28-10"
        else {"name": "imagenet-samples", "path": str(imagenet), "split": "test", "limit": 8}
    )
    return {"attacks": ATTACKS, "metrics": METRICS, "reference_model": reference,
            "profile_dataset": profile}  # fmt: skip
