"""CROWN and alpha-CROWN on the eran sigmoid net with CROWN's sigmoid lines kept per (layer,
box) (as shipped) and recomputed in every backward pass (as before), one thread.

    python bench/sshape_line_cache.py [--spec 1211] [--pairs 11] [--alpha-steps 20]

A CROWN pass on eran's 6 sigmoid layers bounds each layer's input by a backward pass
through every layer before it, so without the cache it computes CROWN's lines (tangent
points included) 21 times where 6 differ. Each pair runs the same computation once each
way, interleaved, the order alternating: a CROWN pass (``linear_boxes`` and the spec's
bound) and alpha-CROWN layer by layer (``linear_boxes`` with ``--alpha-steps`` per layer,
then the spec's slopes; its searched passes take their own slopes and keep nothing).
Printed per case: the median CPU seconds per run each way, the paired median of kept /
recomputed, how many times the lines were computed in one run each way, and whether the
bounds are bit-identical (``torch.equal``). Work is bounded by pairs, not time; the CPU
model and the load are printed with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from aisafety.verification import bounds as b
from aisafety.verification import relaxations as r

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from paired import interleaved, one_thread, paired_median  # noqa: E402

WAYS = {"kept": r.SShapeRelaxation.lines, "recomputed": r.SShapeRelaxation._lines}


def crown(graph, prop, steps: int) -> torch.Tensor:
    lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
    boxes = b.linear_boxes(graph, lower, upper)
    return b.spec_lower(graph, boxes, prop.spec.to(graph.dtype))[0]


def alpha_crown(graph, prop, steps: int) -> torch.Tensor:
    lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
    boxes = b.linear_boxes(graph, lower, upper, "adaptive", steps)
    return b.optimise_slopes(graph, boxes, prop.spec.to(graph.dtype), steps, 0.1)[0]


def one_run(case, graph, prop, steps: int, way: str) -> tuple[float, int, torch.Tensor]:
    """CPU seconds, CROWN line computations and the bounds of ``case`` run ``way``."""
    computed = []
    slopes = r.SShapeRelaxation.default_slopes

    def counting(self, lo, hi):
        computed.append(1)
        return slopes(self, lo, hi)

    r.SShapeRelaxation.lines, r.SShapeRelaxation.default_slopes = WAYS[way], counting
    try:
        began = time.process_time()
        bound = case(graph, prop, steps)
        cpu = time.process_time() - began
    finally:
        r.SShapeRelaxation.lines, r.SShapeRelaxation.default_slopes = WAYS["kept"], slopes
    return cpu, len(computed), bound.detach()


def compare(name: str, case, graph, prop, steps: int, pairs: int) -> None:
    runs = interleaved(list(WAYS), lambda way: one_run(case, graph, prop, steps, way), pairs)
    cpu = {way: [run[0] for run in runs[way]] for way in WAYS}
    counts = {way: runs[way][-1][1] for way in WAYS}
    bounds = {way: runs[way][-1][2] for way in WAYS}
    ratio = paired_median(cpu["kept"], cpu["recomputed"])
    same = torch.equal(bounds["kept"], bounds["recomputed"])
    print(f"{name}: kept / recomputed, paired median {ratio:.3f}x; bit-identical bounds: {same}")
    for way in WAYS:
        print(f"  {way:10s} median {statistics.median(cpu[way]) * 1e3:8.1f} ms CPU; "
              f"CROWN lines computed {counts[way]} times per run")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=int, default=1211)
    parser.add_argument("--pairs", type=int, default=11)
    parser.add_argument("--alpha-steps", type=int, default=20)
    parser.add_argument("--only", choices=["crown", "alpha-crown"])
    args = parser.parse_args()
    from sshape_touch import NET, eran_sigmoid_spec

    header = one_thread()
    net, prop = eran_sigmoid_spec(args.spec)
    print(f"eran {NET} spec {args.spec}, {args.pairs} interleaved pairs, {header}")
    cases = {"crown": crown, "alpha-crown": alpha_crown}
    for name, case in cases.items():
        if args.only in (None, name):
            label = name if name == "crown" else f"{name} ({args.alpha_steps} steps a layer)"
            compare(label, case, net.graph, prop, args.alpha_steps, args.pairs)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
