"""Peak resident size of one CROWN verify call on a VNN-COMP CIFAR ResNet, fresh process.

    OMP_NUM_THREADS=1 nice -n 5 python bench/resnet_crown_peak.py resnet_4b [--images 20]
                                       [--eps 1] [--memory-gib 5]

The slow test's CROWN stage (``batch_size`` 20, CPU clock) on the first ``--images`` of the
100 shipped images, under a fixed budget so that the chunks do not follow the free memory.
Prints the CPU seconds, ``ru_maxrss`` before and after the call, the certified count and
every margin (to compare commits bound for bound). To measure an older commit, run this
file with ``PYTHONPATH`` set to that commit's worktree. One run's peak is not a
measurement: the same code and margins peak 1.19-1.90 GiB on resnet_4b at 20 images
(docs/cifar10.md, session 14), so compare medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # resnet_crown_lirpa, beside this

from resnet_crown_lirpa import MEAN, STD, cifar_images, resnet_folder  # noqa: E402

from aisafety.prediction.onnx_model import load_onnx  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402


def gib_peak() -> float:
    """The process's peak resident size so far, GiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net", choices=["resnet_2b", "resnet_4b"])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--eps", type=float, default=1.0, help="in 1/255 pixel units")
    parser.add_argument("--memory-gib", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = load_onnx(
        resnet_folder() / f"{args.net}.onnx", gradients=True, mean=MEAN, std=STD, name=args.net
    )
    x, y = cifar_images(list(range(args.images)))
    graph = build_graph(net.network, net.input_shape, args.net)
    prop = robustness_property(x, y, args.eps / 255, 10)
    config = {"batch_size": 20, "clock": "cpu", "memory_gib": args.memory_gib}
    before, began = gib_peak(), time.process_time()
    result = CrownVerifier(config).verify(graph, prop, net.logits)
    cpu = time.process_time() - began
    print(
        f"{args.net} {args.images} images eps {args.eps:g}/255 under {args.memory_gib:g} GiB: "
        f"{cpu:.1f} CPU s, peak {before:.3f} -> {gib_peak():.3f} GiB, "
        f"certified {int(result.certified.sum())}"
    )
    print("margins", " ".join(f"{float(m):.6e}" for m in result.margins))


if __name__ == "__main__":
    main()
