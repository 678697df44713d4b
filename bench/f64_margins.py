"""What session 13's float64 rounding margins cost: each with and without, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/f64_margins.py [--pairs 5]
                                                                   [--only split,sigmoid,wk]

* split: ``bab``'s search on mnistfc 256x4 prop_0_0.03 (``bab_speed.py``'s 12 rounds, no
  attack), with and without ``split_backward``'s float64 margin; domains per CPU second.
* sigmoid: one CROWN pass on eran's sigmoid 6x200 (spec 1211) and ``complete`` on three
  eran sigmoid instances, with and without IBP's outward widening of sigmoid boxes.
* wk: the dual network's bounds on 8 MNIST images (mnistfc 256x2 at 0.03), with and
  without its float64 margin.

Each "without" swaps the module's reference for the margin out at run time; the two ways
run interleaved, the order alternating (``paired.py``), one thread, CPU time. Printed per
case: the paired median ratio new/old of CPU time, and how far the results moved.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import types
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "testkit")]
from paired import interleaved, one_thread, paired_median  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

from aisafety.verification import dual_network, float64_margin, ops, split_bounds  # noqa: E402

OFF = types.SimpleNamespace(**{**vars(float64_margin), "applies": lambda a: False})


@contextmanager
def without(way: str, module, name: str, replacement):
    """``module.name`` replaced while ``way`` is "old"."""
    saved = getattr(module, name)
    if way == "old":
        setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, saved)


def report(case: str, runs: dict, moved: str) -> None:
    new, old = [r[0] for r in runs["new"]], [r[0] for r in runs["old"]]
    ratios = sorted(n / o for n, o in zip(new, old, strict=True))
    print(f"{case}: new/old CPU {paired_median(new, old):.3f} (range {ratios[0]:.3f}-"
          f"{ratios[-1]:.3f}); old median {statistics.median(old):.3f} s; {moved}",
          flush=True)  # fmt: skip


def split_case(pairs: int) -> None:
    from bab_speed import search_once, setup

    config = {"clock": "cpu", "attack_steps": 0}
    network, prop, root, boxes, cfg = setup("256x4", "prop_0_0.03", config)
    calls = {"float64": 0}
    real = split_bounds.split_backward

    def counted(graph, domains, *args, **kwargs):
        rounded = kwargs.get("rounded", len(args) > 3 and args[3])
        calls["float64"] += graph.dtype == torch.float64 and not rounded
        return real(graph, domains, *args, **kwargs)

    def run(way: str):
        with without(way, split_bounds, "float64_margin", OFF):
            seconds, bounded, open_bounds = search_once(network, prop, root, boxes, cfg, 12)
        return seconds / bounded, open_bounds

    split_bounds.split_backward = counted
    try:
        runs = interleaved(["new", "old"], run, pairs)
    finally:
        split_bounds.split_backward = real
    new, old = runs["new"][-1][1], runs["old"][-1][1]
    same = new.shape == old.shape
    moved = (old - new) if same else None
    text = (f"open bounds moved down by {float(moved.min()):.2g} .. {float(moved.max()):.2g}"
            if same and len(new) else f"open domains {len(old)} -> {len(new)}")  # fmt: skip
    report("split (bab 256x4 prop_0_0.03, CPU s per domain)", runs,
           f"{text}; float64 split passes {calls['float64']}")  # fmt: skip


def sigmoid_case(pairs: int) -> None:
    from sshape_touch import eran_sigmoid_spec

    from aisafety.plugins import default_registry
    from aisafety.verification import bounds as b
    from aisafety.verification.vnncomp import verify_instance

    same = lambda lo, hi: (lo, hi)  # noqa: E731
    net, prop = eran_sigmoid_spec(1211)
    graph = net.graph

    def crown(way: str):
        with without(way, ops, "widen_evaluated", same), torch.no_grad():
            began = time.process_time()
            boxes = b.linear_boxes(graph, prop.lower.to(graph.dtype), prop.upper.to(graph.dtype))
            bound, _ = b.spec_lower(graph, boxes, prop.spec.to(graph.dtype))
            return time.process_time() - began, bound.double() + prop.offset

    runs = interleaved(["new", "old"], crown, pairs)
    moved = runs["old"][-1][1] - runs["new"][-1][1]
    text = f"bounds moved down by {float(moved.min()):.2g} .. {float(moved.max()):.2g}"
    report("sigmoid CROWN (eran 6x200 spec 1211)", runs, text)
    eran = shared_data("vnncomp2021_eran")
    onnx = eran / "nets" / "ffnnSIGMOID__Point_6x200.onnx"
    specs = [eran / "specs" / "mnist" / f"mnist_spec_idx_{i}_eps_0.01200.vnnlib"
             for i in (7167, 7955, 56)]  # fmt: skip
    registry = default_registry()

    def complete(way: str):
        with without(way, ops, "widen_evaluated", same):
            began = time.process_time()
            found = [verify_instance(registry, onnx, s, "complete", 60.0, {"clock": "cpu"})
                     for s in specs]  # fmt: skip
            return time.process_time() - began, [(r.status, r.margin) for r in found]

    runs = interleaved(["new", "old"], complete, pairs)
    answers = f"new {runs['new'][-1][1]}, old {runs['old'][-1][1]}"
    report("sigmoid complete (eran 7167, 7955, 56)", runs, answers)


def wk_case(pairs: int) -> None:
    from bound_speed import networks, normalised, plain_module

    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property

    data = EmbeddedMnist().load(None, "test")
    name, network, shape, eps = networks()[0]  # 256x2
    prop = robustness_property(data.x[:8].reshape(-1, *shape), data.y[:8], eps, 10)
    prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
    graph = build_graph(module, shape, name, dtype=torch.float64)
    verifier = dual_network.DualNetworkVerifier()

    def run(way: str):
        with without(way, dual_network, "float64_margin", OFF), torch.no_grad():
            began = time.process_time()
            bound, _ = verifier.lower_bounds(graph, prop.to(torch.float64))
            return time.process_time() - began, bound.double()

    runs = interleaved(["new", "old"], run, pairs)
    old, new = runs["old"][-1][1], runs["new"][-1][1]
    moved = old - new
    rel = float((moved / (1 + old.abs())).max())
    report(f"wk ({name} at {eps}, 8 images)", runs,
           f"bounds moved down by {float(moved.min()):.2g} .. {float(moved.max()):.2g} "
           f"(<= {rel:.2g} of 1 + |bound|)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", default="split,sigmoid,wk")
    args = parser.parse_args()
    print(f"{args.pairs} interleaved pairs, {one_thread()}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC", flush=True)  # fmt: skip
    cases = {"split": split_case, "sigmoid": sigmoid_case, "wk": wk_case}
    for name in args.only.split(","):
        cases[name](args.pairs)
    print(f"load at end {math.floor(__import__('os').getloadavg()[0] * 10) / 10}")


if __name__ == "__main__":
    main()
