"""The joint alpha-CROWN step's memory estimate (``joint_alpha.joint_bytes``) against the
resident growth the search measures, one thread.

    python bench/joint_bytes.py [--nets resnet_4b eran1211 small] [--steps 2] [--one-process]

Per net: CROWN's boxes first (``linear_boxes``, as ``alpha-crown`` has them before the
search), then ``VmHWM`` is reset and the joint search (``joint_alpha.search``, ``--steps``
steps; its first step allocates everything the later ones reuse) runs. Printed: the
estimate, its parts (``joint_alpha.joint_parts``: boxes, what the passes keep until the
gradient, one pass's temporaries), the peak resident growth over the search (``VmHWM``
minus the resident size before it) and their ratio. A tiny search runs first: a process's
first search grows by about 60 MiB once (code and allocator arenas faulted in), whatever
its size. The boxes exist before the search, so the growth leaves out what the estimate
counts for them. Nets: resnet_4b (one CIFAR image, eps 1/255, the benchmark's
normalisation), eran's sigmoid 6x200 on spec 1211, and a small conv net with a residual
block (``aisafety/database/small_residual.py``, as tests/test_joint_bytes.py's). Each net
runs in a process of its own (started by this one), since a freed heap is reused by the next
net (``small`` after ``eran1211`` grew 0.4 MiB instead of 52); ``--one-process`` runs them
all here. Run it alone, one thread.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from aisafety.database.small_residual import small_residual
from aisafety.unit_cost import reset_peak_rss, status_bytes
from aisafety.verification import bounds as b
from aisafety.verification import joint_alpha as ja
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def resnet_4b():
    """resnet_4b on the first shipped CIFAR image at eps 1/255 (tests/test_vnncomp_resnets)."""
    from aisafety.prediction.onnx_model import load_onnx

    mean, std = (0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616)
    folder = shared_data("cifar10-models") / "vnncomp2021_cifar10_resnet"
    predictor = load_onnx(folder / "resnet_4b.onnx", gradients=True, mean=mean, std=std,
                          name="resnet_4b")  # fmt: skip
    data = np.loadtxt(shared_data("eran_test_subsets") / "cifar10_test.csv", delimiter=",")[:1]
    x = torch.tensor(data[:, 1:] / 255.0, dtype=torch.float32).reshape(-1, 32, 32, 3)
    x, y = x.permute(0, 3, 1, 2).contiguous(), torch.tensor(data[:, 0], dtype=torch.long)
    graph = build_graph(predictor.network, predictor.input_shape, "resnet_4b")
    return graph, robustness_property(x, y, 1 / 255, 10)


def eran1211():
    from sshape_touch import eran_sigmoid_spec  # bench/ is on sys.path (main)

    net, prop = eran_sigmoid_spec(1211)
    return net.graph, prop


def small(images: int = 2, eps: float = 0.02, width: int = 8):
    net = small_residual(width)
    x = torch.rand(images, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = net(x).argmax(1)
    return build_graph(net, (3, 16, 16), "small"), robustness_property(x, y, eps, 10)


def measure(graph, prop, steps: int) -> tuple[int, int]:
    """The estimate and the peak resident growth of ``steps`` of the joint search."""
    lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
    spec = prop.spec.to(graph.dtype)
    with torch.no_grad():
        crown = b.linear_boxes(graph, lower, upper)
    found = ja.targets(graph, crown)
    estimate = ja.joint_bytes(graph, spec.shape[0], found, spec.shape[1])
    reset_peak_rss()
    before = status_bytes("VmRSS")
    for _ in ja.search(graph, found, crown, spec, steps, (0.1, 0.03)):
        pass  # a generator (it yields at early stops): run it to its last step
    grown = status_bytes("VmHWM") - before
    return estimate, grown, ja.joint_parts(graph, spec.shape[0], found, spec.shape[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="*", default=["small", "eran1211", "resnet_4b"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="all nets in this process (a later net's growth is understated)",
    )
    parser.add_argument("--net-only", action="store_true", help=argparse.SUPPRESS)  # a child
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from paired import one_thread

    if not args.net_only:
        print(f"joint search, {args.steps} steps; {one_thread()}", flush=True)
    if args.one_process or args.net_only:
        measure_here(args.nets, args.steps)
        return
    for name in args.nets:  # each in a fresh process: a freed heap is not reused
        command = [sys.executable, __file__, "--net-only", "--steps", str(args.steps)]
        subprocess.run([*command, "--nets", name], check=True)


def measure_here(nets: list[str], steps: int) -> None:
    """Measure ``nets`` one after another in this process, after a tiny warm-up search."""
    torch.set_num_threads(1)
    measure(*small(1, 0.02, width=2), 1)  # warm-up: the first search's one-off growth
    makers = {"small": small, "eran1211": eran1211, "resnet_4b": resnet_4b}
    for name in nets:
        graph, prop = makers[name]()
        estimate, grown, split = measure(graph, prop, steps)
        shown = ", ".join(f"{k} {v / MIB:.1f}" for k, v in split.items())
        print(f"{name}: estimate {estimate / MIB:9.1f} MiB ({shown}); peak resident growth "
              f"{grown / MIB:8.1f} MiB; estimate / growth {estimate / max(grown, 1):.2f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
