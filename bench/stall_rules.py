"""The joint alpha-CROWN stall rule (#33): the batch cost of the default with no stall rule,
the tenth session's (best lead flat over ``STALL_STEPS`` steps) and the shipped one (also
the search not climbing back to its best), against the old default (layerwise, 20 steps).

    python bench/stall_rules.py [--pairs 5] [--samples 12]

``tests/test_sshape_relaxation.py``'s net at eps 0.2 and 0.3 (``bench/joint_alpha_small.py``'s
cases that never certify every sample), interleaved rounds, paired median CPU ratios, one
thread. Printed per rule: certified samples, sum of margins, sample-steps of the joint search
(deterministic: its cost without the timer's noise) and the CPU ratio to layerwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside this

from joint_alpha_small import NETS, around, timed  # noqa: E402
from paired import interleaved, one_thread, paired_median  # noqa: E402

from aisafety.verification import joint_alpha as ja  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402

SHIPPED = ja._stalled
RULES = {
    "no stall": lambda best, leads: torch.zeros(best.shape[1], dtype=torch.bool),
    "best flat (s10)": lambda best, leads: SHIPPED(best, torch.zeros_like(leads)),
    "shipped": SHIPPED,
}
counted = {"sample_steps": 0}


def run(net, graph, prop, way: str):
    """One ``alpha-crown`` run: the old default (``layerwise``) or the joint one under a rule."""
    counted["sample_steps"] = 0
    if way == "layerwise":
        return (*timed(net, graph, prop, 0, False), 0)
    rule = RULES[way]

    def stalled(best, leads):
        counted["sample_steps"] += best.shape[1]
        return rule(best, leads)

    ja._stalled = stalled
    try:
        return (*timed(net, graph, prop, 0, True), counted["sample_steps"])
    finally:
        ja._stalled = SHIPPED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=12)
    args = parser.parse_args()
    print(f"sshape_net, {args.samples} samples, {args.pairs} interleaved rounds, {one_thread()}")
    net = NETS["sshape_net"]
    graph = build_graph(net, (1, 4, 4), "sshape_net")
    ways = ["layerwise", *RULES]
    for eps in (0.2, 0.3):
        _, prop = around(net, eps, args.samples)
        runs = interleaved(ways, lambda way, prop=prop: run(net, graph, prop, way), args.pairs)
        cpu = {way: [r[2] for r in runs[way]] for way in ways}
        for way in ways:
            margins, certified, _, steps = runs[way][0]
            ratio = paired_median(cpu[way], cpu["layerwise"])
            print(f"eps {eps}  {way:<16} certified {certified:2d}  sum {float(margins.sum()):+8.4f}"
                  f"  sample-steps {steps:4d}  CPU / layerwise {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
