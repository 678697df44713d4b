"""Every registered metric on the WRN-28-10 and ResNet-50 shapes, one plan per metric: the
CPU seconds and the peak resident growth of each (docs/scale.md).

    OMP_NUM_THREADS=1 nice -n 5 python bench/metrics_at_size.py --shape resnet-50 \
        [--only ebd2 mfr] [--memory-gib 4]

The plan is ``tests/test_at_size.py``'s every-metric plan (testkit/at_size_plan.py), with
its per-metric settings: the parameters a user sets at this size (noise draws of the
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from at_size_plan import METRICS, metric_plan  # noqa: E402
from shapes import build  # noqa: E402
from shared_location import shared_data  # noqa: E402

import aisafety  # noqa: E402
from aisafety.database.datasets.labelled_files import LabelledFilesDataset  # noqa: E402
from aisafety.errors import AISafetyWarning  # noqa: E402
from aisafety.interfaces import DatasetSpec  # noqa: E402
from aisafety.loading import load_data  # noqa: E402
from aisafety.plugins import default_registry  # noqa: E402
from aisafety.prediction.torch_module import TorchPredictor  # noqa: E402
from aisafety.unit_cost import reset_peak_rss, status_bytes  # noqa: E402

IMAGENET = "imagenet-samples-foolbox"  # in shared/data
N = 2  # images


def own_labelled_data(shape: str, net: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The shape's ``N`` images labelled with the net's predictions (a random net is wrong on
    both shipped labels, and the metrics over clean-correct samples would have none)."""
    if shape == "resnet-50":
        x = LabelledFilesDataset().load(shared_data(IMAGENET), "test").x[:N]
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
    plan = metric_plan(args.shape, shared_data(IMAGENET))
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
