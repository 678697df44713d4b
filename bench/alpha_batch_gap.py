"""alpha-CROWN alone against batched on the tests' small nets (docs/certification.md, "A
tie at the search's start", session 19).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/alpha_batch_gap.py sshape \
        0.17 0.2 0.3 [--samples 12] [--joint auto|true] [--search float32|float64] [--pairs N]

Per eps: the largest gap between a sample's bound alone and in the batch (and which
sample), the batch's margin sum (each sample's worst row), its row sum and how many it
certifies, with the slope search in ``--search``'s dtype. With ``--pairs N``: the CPU time
of the batch's bound with the search in float64 over float32, N interleaved pairs in this
process, median and range. Nets: ``tests/test_joint_alpha.py``'s ``NETS`` (relu, sshape,
conv), samples from ``tests/test_sshape_relaxation.around``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from aisafety.verification import bounds as b
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier
from tests.test_joint_alpha import NETS
from tests.test_sshape_relaxation import around

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def batch_seconds(verifier, graph, prop) -> float:
    began = time.process_time()
    verifier.bounds_and_boxes(graph, prop)
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(NETS))
    parser.add_argument("eps", type=float, nargs="+")
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--joint", choices=["auto", "true"], default="true")
    parser.add_argument("--search", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--pairs", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = NETS[args.kind][0]()
    graph = build_graph(net, (1, 4, 4), args.kind)
    verifier = AlphaCrownVerifier(steps=20, joint=True if args.joint == "true" else "auto")
    print(f"{args.kind}, {args.samples} samples, joint {args.joint}, search {args.search}")
    for eps in args.eps:
        p = around(net, eps, args.samples)[1].to(graph.dtype)
        b.SEARCH_DTYPE = DTYPES[args.search]
        batched = verifier.bounds_and_boxes(graph, p).bound
        alone = torch.cat([verifier.bounds_and_boxes(graph, p[[s]]).bound for s in range(len(p))])
        gap, worst = (batched - alone).abs().amax(1), (batched + p.offset).amin(1)
        print(f"eps {eps}: gap {float(gap.max()):.2e} (sample {int(gap.argmax())}), margin sum "
              f"{float(worst.sum()):.4f}, row sum {float((batched + p.offset).sum()):.4f}, "
              f"certified {int((worst > 0).sum())}", flush=True)  # fmt: skip
        ratios = []
        for k in range(args.pairs):
            seconds = {}
            for name in ("float32", "float64")[:: 1 if k % 2 == 0 else -1]:
                b.SEARCH_DTYPE = DTYPES[name]
                seconds[name] = batch_seconds(verifier, graph, p)
            ratios.append(seconds["float64"] / seconds["float32"])
        if ratios:
            ratios.sort()
            print(f"  float64 / float32 CPU: median {ratios[len(ratios) // 2]:.3f} "
                  f"({ratios[0]:.3f}-{ratios[-1]:.3f}, {len(ratios)} pairs); load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
