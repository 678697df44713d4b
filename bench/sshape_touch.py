"""CROWN on the eran sigmoid net with the tangent points found by Newton (as shipped) and by
the 50-step bisection it replaced, one thread.

    python bench/sshape_touch.py [--spec 1211] [--pairs 15]

``SShapeRelaxation.tangent_slopes`` (CROWN's slopes; on intervals across 0, tangents
through an end) runs on every S-shape layer of every backward pass. Each pair runs one
whole CROWN pass (``linear_boxes`` and the spec's bound) with the shipped one and with
the one it replaced (the bisection on every interval, kept in testkit/sshape_bisection.py),
interleaved, the order alternating. Printed: each one's median CPU seconds per pass, the
paired median ratio, ``tangent_slopes``' share of a pass with each (its own CPU, summed
over the pass), and the largest difference between the two passes' bounds (the slopes
agree to about 1e-12, so the bounds should too). Work is bounded by pairs, not time; the
CPU model and the load are printed with it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from aisafety.verification import bounds as b
from aisafety.verification import relaxations as r
from aisafety.verification.vnncomp import load_network, rows_property
from aisafety.verification.vnnlib import read_disjuncts

ROOT = Path(__file__).resolve().parents[1]
NET = "ffnnSIGMOID__Point_6x200.onnx"
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "testkit")]
from paired import interleaved, one_thread, paired_median  # noqa: E402
from shared_location import shared_data  # noqa: E402
from sshape_bisection import bisection_slopes  # noqa: E402


def timed(slopes, spent: list[float]):
    """``slopes`` adding its own CPU seconds to ``spent``."""

    def run(self, lo, hi):
        began = time.process_time()
        out = slopes(self, lo, hi)
        spent.append(time.process_time() - began)
        return out

    return run


def one_pass(graph, prop, slopes) -> tuple[float, float, torch.Tensor]:
    """One CROWN pass with ``slopes``: CPU seconds, their share of it, the bounds."""
    spent: list[float] = []
    saved = r.SShapeRelaxation.tangent_slopes
    r.SShapeRelaxation.tangent_slopes = timed(slopes, spent)
    try:
        began = time.process_time()
        lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
        boxes = b.linear_boxes(graph, lower, upper)
        bound, _ = b.spec_lower(graph, boxes, prop.spec.to(graph.dtype))
        cpu = time.process_time() - began
    finally:
        r.SShapeRelaxation.tangent_slopes = saved
    return cpu, sum(spent) / cpu, bound.double() + prop.offset


def eran_sigmoid_spec(spec: int):
    """eran's sigmoid 6x200 network and its spec ``spec`` at eps 0.012 as one property."""
    eran = shared_data("vnncomp2021_eran")
    net = load_network(eran / "nets" / NET)
    vnnlib = eran / "specs" / "mnist" / f"mnist_spec_idx_{spec}_eps_0.01200.vnnlib"
    box, rows = read_disjuncts(vnnlib, math.prod(net.shape), 10)
    return net, rows_property(*(x.reshape(1, *net.shape) for x in box), [row[0] for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=int, default=1211)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    header = one_thread()
    net, prop = eran_sigmoid_spec(args.spec)
    ways = {"newton": r.SShapeRelaxation.tangent_slopes, "bisection": bisection_slopes}
    runs = interleaved(list(ways), lambda way: one_pass(net.graph, prop, ways[way]), args.pairs)
    cpu = {way: [run[0] for run in runs[way]] for way in ways}
    share = {way: [run[1] for run in runs[way]] for way in ways}
    bounds = {way: runs[way][-1][2] for way in ways}
    ratio = paired_median(cpu["bisection"], cpu["newton"])
    print(f"eran {NET} spec {args.spec}, CROWN, {args.pairs} interleaved pairs, {header}")
    for name in ways:
        print(f"{name:9s} median {statistics.median(cpu[name]) * 1e3:7.1f} ms CPU per pass; "
              f"tangent_slopes {statistics.median(share[name]):.1%} of it")  # fmt: skip
    print(f"bisection / newton, paired median: {ratio:.2f}x; largest bound difference "
          f"{float((bounds['newton'] - bounds['bisection']).abs().max()):.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
