"""Joint against layerwise alpha-CROWN on one eran sigmoid/ReLU spec (#32, #33).

    python bench/joint_alpha.py [--spec 1211] [--steps 20 75] [--lr 0.1 0.01] [--relu-lr 0.1]
                                [--net ffnnSIGMOID__Point_6x200] [--search float32 float64 ...]

Per run: the spec rows' bounds (least and largest) and the CPU seconds of CROWN
(``crown``), alpha-CROWN layer by layer (``bounds.linear_boxes`` with ``alpha_steps``, then
the spec rows' slopes) and joint alpha-CROWN (``joint_alpha.py``) for each step count and
learning rate (``--lr``: the layerwise search's, and the joint one's for sigmoid/tanh
slopes; ``--relu-lr``: the joint one's for ReLU slopes). ``--search``: the joint search's
dtypes (``bounds.SEARCH_DTYPE``), one run each in that order (``float32 float64 float64
float32``: two interleaved pairs). Every bound printed is the sound one (the re-bounded
pass); run it alone with OMP_NUM_THREADS=1 (one thread is set here).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

from aisafety.verification import bounds as b
from aisafety.verification.joint_alpha import joint_alpha
from aisafety.verification.vnncomp import load_network, rows_property
from aisafety.verification.vnnlib import read_disjuncts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def show(name: str, bound: torch.Tensor, began: float) -> None:
    print(f"{name:<34} least {float(bound.min()):+9.4f}  largest {float(bound.max()):+9.4f}"
          f"  {time.process_time() - began:7.1f} CPU s", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default="1211")
    parser.add_argument("--net", default="ffnnSIGMOID__Point_6x200")
    parser.add_argument("--steps", type=int, nargs="*", default=[20, 75])
    parser.add_argument("--lr", type=float, nargs="*", default=[0.1, 0.01])
    parser.add_argument("--relu-lr", type=float, default=0.1, help="joint: ReLU slopes' lr")
    parser.add_argument("--no-layerwise", action="store_true")
    parser.add_argument("--search", nargs="*", choices=["float32", "float64"], default=["float32"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    eran = shared_data("vnncomp2021_eran")
    net = load_network(eran / "nets" / f"{args.net}.onnx")
    graph = net.graph
    vnnlib = eran / "specs" / "mnist" / f"mnist_spec_idx_{args.spec}_eps_0.01200.vnnlib"
    if not vnnlib.exists():
        vnnlib = eran / "specs" / "mnist" / f"mnist_spec_idx_{args.spec}_eps_0.01500.vnnlib"
    box, rows = read_disjuncts(vnnlib, math.prod(net.shape), 10)
    prop = rows_property(*(x.reshape(1, *net.shape) for x in box), [row[0] for row in rows])
    lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
    spec = prop.spec.to(graph.dtype)
    print(f"{args.net} spec {args.spec} ({vnnlib.name}); load {os.getloadavg()[0]:.1f}")
    with torch.no_grad():
        began = time.process_time()
        crown_boxes = b.linear_boxes(graph, lower, upper)
        crown, _ = b.spec_lower(graph, crown_boxes, spec)
        show("crown", crown + prop.offset, began)
        for steps in args.steps:
            for lr in args.lr:
                if not args.no_layerwise:
                    began = time.process_time()
                    boxes = b.linear_boxes(graph, lower, upper, "adaptive", steps)
                    bound, _ = b.optimise_slopes(graph, boxes, spec, steps, lr)
                    show(f"layerwise {steps} steps lr {lr}", bound + prop.offset, began)
                for search in args.search:
                    b.SEARCH_DTYPE = getattr(torch, search)
                    began = time.process_time()
                    crown_boxes = b.linear_boxes(graph, lower, upper)
                    bound, _, _ = joint_alpha(graph, crown_boxes, spec, steps, args.relu_lr, lr)
                    show(f"joint {steps} steps lr {lr} {search}", bound + prop.offset, began)


if __name__ == "__main__":
    main()
