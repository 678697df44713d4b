"""Domains per CPU second of ``bab``'s search on one fixed mnistfc instance, one thread.

    python bench/bab_speed.py [--net 256x4] [--prop prop_0_0.03] [--rounds 12] [--pairs 3]
                              [--config domain_batch=64 ...]

The root (box-PGD is skipped; CROWN and alpha-CROWN) is bounded once; then the search runs
``--rounds`` rounds (``domain_batch`` x 2 domains bounded per round) with
``rounding.dots`` as shipped and with the per-sample loop it replaced
(``rounding.per_sample_dots``, the reference), interleaved, ``--pairs`` times each, the
order alternating.
Printed: domains per CPU second of each (median), the paired median ratio, and whether
both searches ended with the same open bounds bit for bit (the vectorised products must
not change a single bound). Work is bounded by rounds, not time; the CPU model and the
load are printed with it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "testkit")]
from shared_location import shared_data  # noqa: E402
from verification import parse_verifier  # noqa: E402


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))  # fmt: skip
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def setup(net: str, prop_name: str, config: dict):
    """The graph, the property, the root bound and boxes, and the bab config."""
    from aisafety.plugins import default_registry
    from aisafety.verification.registry import make_verifier
    from aisafety.verification.vnncomp import load_network, rows_property
    from aisafety.verification.vnnlib import read_disjuncts

    mnistfc = shared_data("vnncomp2021_mnistfc")
    network = load_network(str(mnistfc / f"mnist-net_{net}.onnx"))
    box, disjuncts = read_disjuncts(mnistfc / f"{prop_name}.vnnlib", math.prod(network.shape), 10)
    lower, upper = (b.reshape(1, *network.shape) for b in box)
    prop = rows_property(lower, upper, [r[0] for r in disjuncts]).to(network.graph.dtype)
    verifier = make_verifier(default_registry(), "bab", config)
    verifier.prepare()
    with torch.no_grad():
        bound, _, boxes, _ = verifier.bounds_and_boxes(network.graph, prop)
    return network, prop, (bound[0] + prop.offset[0]).detach(), boxes, verifier.config


def search_once(network, prop, root, boxes, config, rounds: int):
    """CPU seconds of ``rounds`` rounds of the search, domains bounded, the open bounds."""
    from aisafety.verification.bab import Search
    from aisafety.verification.deadline import CLOCKS, Deadline

    class Capped(Search):
        bounded = 0

        def _bound_and_prune(self, todo):
            self.bounded += len(todo)
            return super()._bound_and_prune(todo)

        def _next_round(self):
            return None if self.rounds >= rounds else super()._next_round()

        def _attack_from(self, picked):  # the same work in both variants: bounds only
            return None

    deadline = Deadline(CLOCKS["cpu"]() + 1e6, CLOCKS["cpu"])
    search = Capped(config, network.graph, prop, boxes, network.run, deadline)
    start = time.process_time()
    search.run(root)
    seconds = time.process_time() - start
    open_bounds = search.open.bound.sort().values if search.open is not None else torch.empty(0)
    return seconds, search.bounded, open_bounds


def main() -> None:
    from aisafety.verification import rounding

    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="256x4")
    parser.add_argument("--prop", default="prop_0_0.03")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--config", default="", help="bab options, key=value,key=value")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, config = parse_verifier(f"bab:{args.config}")
    config = {"clock": "cpu", "attack_steps": 0, **config}
    network, prop, root, boxes, cfg = setup(args.net, args.prop, config)
    print(f"{args.net} {args.prop}, {args.rounds} rounds, {cfg.domain_batch} domains split "
          f"per round, one thread; CPU {cpu_model()}; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    shipped = rounding.dots
    rate = {"batched": [], "loop": []}
    ratios, same = [], True
    for pair in range(args.pairs):
        order = ["batched", "loop"] if pair % 2 == 0 else ["loop", "batched"]
        got = {}
        for name in order:
            rounding.dots = shipped if name == "batched" else rounding.per_sample_dots
            try:
                seconds, bounded, open_bounds = search_once(network, prop, root, boxes, cfg,
                                                            args.rounds)  # fmt: skip
            finally:
                rounding.dots = shipped
            rate[name].append(bounded / seconds)
            got[name] = open_bounds
            print(f"  {name:<8} {bounded} domains in {seconds:.2f} CPU s: "
                  f"{bounded / seconds:.0f} per CPU s", flush=True)  # fmt: skip
        ratios.append(rate["batched"][-1] / rate["loop"][-1])
        same &= torch.equal(got["batched"], got["loop"])
    for name, values in rate.items():
        print(f"{name:<8} median {statistics.median(values):.0f} domains per CPU s")
    print(
        f"batched / loop domains per CPU s, paired median: {statistics.median(ratios):.3f}; "
        f"open bounds equal bit for bit: {same}; load at end {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
