"""How far HiGHS's MILP bounds in ``refine.py`` sit from the exact extremes they bound.

Small fully connected ReLU nets with two inputs (2-10-9-8-3, weights scaled by
``--scale``; ``tests/test_refine_bounds.py``'s), a random box per net: every hidden
pre-activation's exact min and max over the box in rationals
(``tests/exact_regions.py``), against what HiGHS returns for the MILPs that
``refine_boxes`` solves (its options: 1% gap) and for the same MILPs solved to optimality
(gap 0, where a tolerance error would show). Prints, per mode, the most any HiGHS bound
exceeded the exact extreme (a positive figure is an unsound bound before ``SAFETY``) and
the least room ``SAFETY`` left.

    PYTHONPATH=$PWD python3 bench/refine_slack.py --nets 40
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction

import numpy as np

from aisafety.verification import bounds as b
from aisafety.verification import refine
from aisafety.verification.deadline import CLOCKS, Deadline
from aisafety.verification.graph import build_graph
from aisafety.verification.milp import solve
from tests.exact_regions import extremes
from tests.test_refine_bounds import small_net_and_box


def run(seed: int, scale: float, exact_mip: bool) -> list[tuple[float, float, float]]:
    """(HiGHS bound - exact, the same over 1 + |exact| (SAFETY's scale), SAFETY's room:
    exact - the refined bound) per MILP solved."""
    net, lower, upper = small_net_and_box(seed, scale)
    graph = build_graph(net, (2,), "small")
    truth = {len(layer): layer for layer in extremes(net, lower, upper)}
    boxes = b.linear_boxes(graph, lower[None], upper[None])
    found = []

    def recording(enc, cost, const, *args, options=None, **kwargs):
        if exact_mip:
            options = {"mip_rel_gap": 0.0, "mip_abs_gap": 1e-9}
        solved = solve(enc, cost, const, *args, options=options, **kwargs)
        width = enc.out_matrix.shape[1]  # the hidden widths differ: it names the layer
        for u in range(width):
            for sign in (1.0, -1.0):
                if np.array_equal(cost, sign * enc.out_matrix[:, u]):
                    low, top = truth[width][u]
                    exact = low if sign > 0 else -top
                    if np.isfinite(solved.bound):
                        moved = solved.bound - refine.SAFETY * (1 + abs(solved.bound))
                        over = Fraction(solved.bound) - exact
                        room = exact - Fraction(moved)
                        found.append((float(over), float(over / (1 + abs(exact))), float(room)))
                    return solved
        raise AssertionError("an objective that is no neuron's")

    original = refine.solve
    refine.solve = recording
    try:
        clock = CLOCKS["cpu"]
        refine.refine_boxes(graph, boxes, Deadline(clock() + 60, clock), 5.0)
    finally:
        refine.solve = original
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", type=int, default=40)
    parser.add_argument("--scale", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    args = parser.parse_args()
    for exact_mip in (False, True):
        rows = []
        for scale in args.scale:
            for seed in range(args.nets):
                rows += run(seed, scale, exact_mip)
        over = max(r[0] for r in rows)
        relative = max(r[1] for r in rows)
        room = min(r[2] for r in rows)
        mode = "gap 0" if exact_mip else "refine's 1% gap"
        print(f"{mode}: {len(rows)} MILP bounds; HiGHS above the exact extreme by at most "
              f"{over:.3e} ({sum(r[0] > 0 for r in rows)} above; relative to 1 + |exact| "
              f"{relative:.3e}, SAFETY is 1e-5); least room after SAFETY "
              f"{room:.3e}; median below {np.median([-r[0] for r in rows]):.3e}")  # fmt: skip
        if not math.isfinite(over):
            print("  (a non-finite figure)")


if __name__ == "__main__":
    main()
