"""Every registered metric on the WRN-28-10 and ResNet-50 shapes, one plan per metric: the
CPU seconds and the peak resident growth of each (docs/scale.md).

    OMP_NUM_THREADS=1 nice -n 5 python bench/metrics_at_size.py --shape resnet-50 \
        [--only ebd2 mfr] [--memory-gib 4]

The plan is ``tests/test_at_size.py``'s every-metric plan (``METRICS``, ``metric_plan``),
with its per-metric settings: the parameters a user sets at this size (noise draws of the
smoothing metrics, frames of ``mfr``/``mfp``, EBD's directions, EBD-2's steps), and the same
two images labelled with the net's own predictions. Each metric runs in a plan of its own
with the same attacks and reference model, one after another in one process: its CPU
seconds include the plan's attacks, the reference model and their passes, the same for
every row; its peak is the growth of the peak resident size over the size before the plan,
a lower bound of a fresh process's (freed memory is reused across plans).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import build  # noqa: E402

import aisafety  # noqa: E402
from aisafety.database.datasets.labelled_files import LabelledFilesDataset  # noqa: E402
from aisafety.errors import AISafetyWarning  # noqa: E402
from aisafety.interfaces import DatasetSpec  # noqa: E402
from aisafety.loading import load_data  # noqa: E402
from aisafety.plugins import default_registry  # noqa: E402
from aisafety.prediction.torch_module import TorchPredictor  # noqa: E402
from aisafety.unit_cost import reset_peak_rss, status_bytes  # noqa: E402

BENCH = Path(__file__).resolve().parent
IMAGENET = BENCH.parents[1] / "shared/data/imagenet-samples-foolbox"
N = 2  # images
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


def metric_plan(shape: str) -> dict:
    """The every-metric plan of ``shape``: the attacks, a reference model (another random
    net of the shape, for the metrics that compare with an undefended model) and profile
    data for the coverage metrics' neuron bounds (the train split by default, which
    neither shipped set has: the shipped images stand in for it)."""
    factory, input_shape, classes = {
        "wrn-28-10": ("shapes:wide_resnet", [3, 32, 32], 10),
        "resnet-50": ("shapes:resnet50", [3, 224, 224], 1000),
    }[shape]
    reference = {"source": "python", "name": f"{shape}-reference", "factory": factory,
                 "python_path": [str(BENCH)], "input_shape": input_shape,
                 "num_classes": classes}  # fmt: skip
    profile = {
        "wrn-28-10": {"name": "cifar10-embedded", "split": "test", "limit": 8},
        "resnet-50": {"name": "imagenet-samples", "path": str(IMAGENET), "split": "test",
                      "limit": 8},
    }[shape]  # fmt: skip
    return {"attacks": ATTACKS, "metrics": METRICS, "reference_model": reference,
            "profile_dataset": profile}  # fmt: skip


def own_labelled_data(shape: str, net: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The shape's ``N`` images labelled with the net's predictions (a random net is wrong on
    both shipped labels, and the metrics over clean-correct samples would have none)."""
    if shape == "resnet-50":
        x = LabelledFilesDataset().load(IMAGENET, "test").x[:N]
    else:
        x = load_data(DatasetSpec(name="cifar10-embedded", limit=N), default_registry()).x
    with torch.no_grad():
        return x, net(x).argmax(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("wrn-28-10", "resnet-50"), default="resnet-50")
    parser.add_argument("--only", nargs="*", help="these metrics (default: all)")
    parser.add_argument("--memory-gib", type=float, help="the plan's limits.memory_gib")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # a plan of one metric leaves its attacks without an accuracy metric: warned, expected
    warnings.simplefilter("ignore", AISafetyWarning)
    net, input_shape, classes = build(args.shape)
    model = TorchPredictor(net, input_shape, classes, name=args.shape)
    data = own_labelled_data(args.shape, net)
    plan = metric_plan(args.shape)
    if args.memory_gib:
        plan["limits"] = {"memory_gib": args.memory_gib}
    print(f"{args.shape}, {N} images; load before {os.getloadavg()[0]:.1f}")
    print("| metric | CPU s | peak growth GiB | value(s) |\n|---|---|---|---|")
    for metric in METRICS:
        name = metric if isinstance(metric, str) else metric["name"]
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            reset_peak_rss()
            before, started = status_bytes("VmRSS"), time.process_time()
            one = {**plan, "metrics": [metric], "seed": 0, "batch_size": N}
            record = aisafety.evaluate(one, db=f"sqlite:///{tmp}/m.db", model=model, data=data)
            seconds = time.process_time() - started
            peak = (status_bytes("VmHWM") - before) / 2**30
        failed = f" FAILED {record.failed_units}" if record.failed_units else ""
        mine = [f"{v.value:.3g}" for v in record.values if v.metric.startswith(name)]
        values = ", ".join(mine[:3]) + (f" ... ({len(mine)} values)" if len(mine) > 3 else "")
        print(f"| {name} | {seconds:.1f} | {peak:.2f} | {values or 'none'}{failed} |", flush=True)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"load after {os.getloadavg()[0]:.1f}; the process's largest resident size "
        f"{peak_rss:.2f} GiB"
    )


if __name__ == "__main__":
    main()
