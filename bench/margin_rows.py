"""Whether refining some intermediate rows in float64 could close CROWN's gap to auto_LiRPA.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/venv-lirpa/bin/python bench/margin_rows.py \
        [--images 8] [--nets 256x2 256x4 256x6 sok-cnn-a-adv1] [--pairs 7]

Our float32 intermediate passes subtract a rigorous rounding margin; auto_LiRPA's do not, and
the margins compound through the boxes (docs/certification.md). Per network of
``bound_speed.py`` (same images, eps, spec), with ``exact`` every pass in float64:

* decisions: the unstable neurons (float32 boxes, as shipped) whose margin alone makes them
  unstable (``l < 0 <= l + margin`` or ``u - margin <= 0 < u``, the margin being the
  float32 box against the same pass without margins) and those whose adaptive lower slope
  (``u > -l``) the float32 box changes against the float64 box of the same pass;
* refinements: the final bound when, at each tightened node in turn, some unstable rows
  take the float64 pass's bound and the others the float32 pass's: every row of one node,
  or per sample the fraction of its most widened rows (chosen by the float64 result: an
  oracle, the best such a choice could do); printed as ``beyond`` (``bound_speed.py``'s
  column: ``max(min(auto_LiRPA, exact) - ours)``) beside auto_LiRPA's own ``over exact``;
  and the same float32 passes with every margin left out (unsound): what a tighter
  rigorous error bound of those products would approach (a margin only lowers the bound,
  up to CROWN's non-monotonicity in its boxes);
* one node's cost: with ``--pairs``, CROWN (``bound_speed.ours``) with the passes of the
  node whose float64 rows help most run in float64, over CROWN as shipped, interleaved,
  paired medians of CPU time;
* products: with ``--pairs``, the matrix products of one shipped CROWN run (their shapes
  recorded by the profiler) timed alone in float32 and in float64, over auto_LiRPA's whole
  CROWN time, interleaved, paired medians: the least any all-float64 CROWN could cost.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bound_speed import (
    bounded_module,
    float64_cases,
    lirpa,
    networks,
    ours,
    plain_module,
    setting,
    unmargined,
)
from paired import interleaved, paired_median

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.verification import bounds as b
from aisafety.verification import rounding

Choose = Callable[[int, torch.Tensor, tuple, tuple, list], torch.Tensor]


def tightened(graph, j: int, boxes, precision: str, margins: bool = True):
    """Node ``j``'s box from ``boxes`` with its passes in ``precision`` (without the
    float32 margins when ``margins`` is False: unsound, to measure them)."""
    original = rounding.exact_shift
    if not margins:
        rounding.exact_shift = lambda *a: (original(*a)[0], original(*a)[1] * 0)
    try:
        with rounding.pass_precision(precision), torch.no_grad():
            return b._tighten(graph, j, list(boxes), "adaptive", True)
    finally:
        rounding.exact_shift = original


def mixed(graph, prop, choose: Choose | None, counts: dict | None = None) -> torch.Tensor:
    """CROWN's final bound (float64 final pass, as shipped) where at each tightened node
    the unstable rows ``choose(j, unstable, box32, box64, boxes)`` picks take the float64 pass's
    bound and the others the float32 pass's; None: every row float64 (exact)."""
    boxes = b.interval_boxes(graph, prop.lower, prop.upper)
    deep = b.depends_on_activation(graph)
    for op in graph.ops:
        if op.kind != "activation" or not deep[op.inputs[0]]:
            continue
        j = op.inputs[0]
        wide = tightened(graph, j, boxes, "float64")
        if choose is None:
            boxes[j] = wide
        else:
            narrow = tightened(graph, j, boxes, "auto")
            unstable = (narrow[0] < 0) & (narrow[1] > 0)
            pick = choose(j, unstable, narrow, wide, boxes) & unstable
            boxes[j] = tuple(torch.where(pick, w, n) for w, n in zip(wide, narrow, strict=True))
            if counts is not None:
                counts["picked"] = counts.get("picked", 0) + int(pick.sum())
                counts["unstable"] = counts.get("unstable", 0) + int(unstable.sum())
        boxes = b.forward_from(graph, boxes, j)
    with torch.no_grad():
        bound = b.spec_lower(graph, boxes, prop.spec)[0]
    return torch.maximum(bound, b.ibp_spec_lower(graph, boxes, prop.spec))


def decisions(graph, prop) -> tuple[int, int, int]:
    """(unstable, made unstable by the margin alone, adaptive slope changed) over the
    tightened nodes of the shipped (float32) boxes."""
    found = [0, 0, 0]

    def count(j, unstable, narrow, wide, boxes):
        (lo, hi), (bare_lo, bare_hi) = narrow, tightened(graph, j, boxes, "auto", False)
        by_margin = ((lo < 0) & (bare_lo >= 0)) | ((hi > 0) & (bare_hi <= 0))
        flips = (hi > -lo) != (wide[1] > -wide[0])
        for k, flags in enumerate((unstable, by_margin & unstable, flips & unstable)):
            found[k] += int(flags.sum())
        return torch.zeros_like(unstable)

    mixed(graph, prop, count)
    return found[0], found[1], found[2]


def most_widened(fraction: float) -> Choose:
    """Per sample, its ``fraction`` most widened unstable rows (float32 box against float64)."""

    def choose(j, unstable, narrow, wide, boxes):
        width = torch.maximum(wide[0] - narrow[0], narrow[1] - wide[1]).flatten(1)
        width = torch.where(unstable.flatten(1), width, -1.0)
        k = max(1, round(fraction * int(unstable.flatten(1).sum(1).max())))
        picked = torch.zeros_like(width, dtype=torch.bool)
        picked.scatter_(1, width.topk(k, 1).indices, True)
        return picked.reshape(unstable.shape)

    return choose


def only_nodes(nodes: set[int]) -> Choose:
    return lambda j, unstable, narrow, wide, boxes: torch.full_like(unstable, j in nodes)


def node_cost(graph, prop, node: int, pairs: int) -> float:
    """Paired median of CROWN's CPU time with node ``node``'s passes in float64 over
    CROWN as shipped."""
    original = b._tighten

    def wide(graph_, j, boxes, *args, **kwargs):
        if j != node:
            return original(graph_, j, boxes, *args, **kwargs)
        with rounding.pass_precision("float64"):
            return original(graph_, j, boxes, *args, **kwargs)

    def run(way: str) -> float:
        b._tighten = wide if way == "float64 node" else original
        try:
            return ours(graph, prop)[0]
        finally:
            b._tighten = original

    times = interleaved(("float64 node", "shipped"), run, pairs)
    return paired_median(times["float64 node"], times["shipped"])


def product_shapes(graph, prop) -> list[tuple[str, list]]:
    """The float32 pass products (mm, addmm, bmm; at least 8 on every side, so not the
    float64 margin dots of one to three columns) of one shipped CROWN run."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as run:
        ours(graph, prop)
    found = []
    for event in run.events():
        shapes = [s for s in event.input_shapes if s]
        if event.name in {"aten::mm", "aten::bmm", "aten::addmm"} and len(shapes) >= 2:
            first, second = shapes[-2], shapes[-1]
            if min(first[-2], first[-1], second[-1]) >= 8:
                found.append((event.name, [first, second]))
    return found


def products(shapes, dtype) -> float:
    """CPU seconds of the products ``shapes`` on random ``dtype`` operands."""
    operands = [[torch.randn(*s, dtype=dtype) for s in pair] for _, pair in shapes]
    start = time.process_time()
    for x, y in operands:
        torch.matmul(x, y)
    return time.process_time() - start


def floor(graph, prop, module, shape, pairs: int) -> str:
    """The pass products alone, float32 and float64, over auto_LiRPA's time (paired)."""
    shapes = product_shapes(graph, prop)
    bounded = bounded_module(module, shape)
    ratios: dict[str, list[float]] = {"float32": [], "float64": []}
    for r in range(pairs + 1):
        their = lirpa(bounded, prop)[0]
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64))[
            :: 1 if r % 2 else -1
        ]:
            if r:  # the first round warms up
                ratios[name].append(products(shapes, dtype) / their)
    f32, f64 = (statistics.median(ratios[k]) for k in ("float32", "float64"))
    return f"{len(shapes)} products: float32 {f32:.2f}x auto_LiRPA's CROWN, float64 {f64:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--nets", nargs="*", default=["256x2", "256x4", "256x6", "sok-cnn-a-adv1"])
    parser.add_argument("--pairs", type=int, default=0, help="time the products, N pairs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(setting())
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[: args.images], data.y[: args.images]
    nets = {name: (network, shape) for name, network, shape, _ in networks()}
    for name, graph, prop in float64_cases(x, y):
        if name not in args.nets:
            continue
        network, shape = nets[name]
        module = plain_module(network, shape, name)
        theirs = lirpa(bounded_module(module, shape), prop)[1].double()
        exact = mixed(graph, prop, None)
        unstable, by_margin, flips = decisions(graph, prop)
        print(f"== {name}: auto_LiRPA over exact {float((theirs - exact).max()):.2e}; "
              f"{unstable} unstable rows: made unstable by the margin alone {by_margin}, "
              f"adaptive slope changed {flips}")  # fmt: skip
        deep = b.depends_on_activation(graph)
        nodes = [op.inputs[0] for op in graph.ops if op.kind == "activation" and deep[op.inputs[0]]]
        ways = {"all float32 (shipped)": only_nodes(set())}
        ways |= {f"node {j} float64": only_nodes({j}) for j in nodes}
        ways |= {f"most widened {f:.0%}": most_widened(f) for f in (0.1, 0.25, 0.5, 0.75)}
        best = (float("inf"), -1)
        for label, choose in ways.items():
            counts: dict[str, int] = {}
            bound = mixed(graph, prop, choose, counts)
            beyond = float((torch.minimum(theirs, exact) - bound).max())
            if label.startswith("node "):
                best = min(best, (beyond, int(label.split()[1])))
            print(f"  {label:<24} beyond {beyond:.2e}, below exact "
                  f"{float((exact - bound).max()):.2e}; float64 rows "
                  f"{counts['picked']} of {counts['unstable']}", flush=True)  # fmt: skip
        bare = float((torch.minimum(theirs, exact) - unmargined(graph, prop)).max())
        print(f"  {'no margins (unsound)':<24} beyond {bare:.2e}: what a tighter error bound "
              "of these float32 products approaches")  # fmt: skip
        if args.pairs:
            cost = node_cost(graph, prop, best[1], args.pairs)
            print(f"  node {best[1]} in float64: CROWN {cost:.2f}x as shipped", flush=True)
            print(f"  {floor(graph, prop, module, shape, args.pairs)}", flush=True)
    print(setting())


if __name__ == "__main__":
    main()
