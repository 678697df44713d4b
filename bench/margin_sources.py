"""Where CROWN's float32 rounding margin comes from, and how large auto_LiRPA's own error is.

    /work/venv-lirpa/bin/python bench/margin_sources.py [--images 8] [--nets 256x4 256x6]

Per network of ``bound_speed.py`` (same images, eps and spec), with ``exact`` the bound of
the relaxation computed with every pass in float64 (``pass_precision("float64")``):

* final bound: how far below ``exact`` our bound with every pass in float32 is (``auto``
  runs a final pass this small in float64), split into the final pass's
  own margin (float64 boxes, float32 final pass) and the intermediate boxes' (float32
  boxes, float64 final pass); and how far auto_LiRPA's float32 bound is *above* ``exact``
  (its own rounding, which it neither bounds nor subtracts);
* per activation layer: the intermediate box's loss against the float64 box, local (the
  float32 pass from the float64 boxes of the earlier layers) and compounded (as shipped);
* per op of the intermediate passes: the mean margin it adds per neuron row (the term
  ``rounding.exact_shift`` returns), by op index.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from bound_speed import bounded_module, lirpa, networks, normalised, plain_module

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.verification import bounds as b
from aisafety.verification import rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property


def boxes_at(graph, prop, precision: str):
    with rounding.pass_precision(precision), torch.no_grad():
        return b.linear_boxes(graph, prop.lower, prop.upper)


def final(graph, boxes, prop, precision: str) -> torch.Tensor:
    with rounding.pass_precision(precision), torch.no_grad():
        bound = b.spec_lower(graph, boxes, prop.spec)[0]
    return torch.maximum(bound, b.ibp_spec_lower(graph, boxes, prop.spec))


def layer_losses(graph, exact, shipped) -> list[tuple[int, float, float, float, float]]:
    """Per tightened node: (node, local mean, local max, compounded mean, compounded max)
    of the widening against the float64 box, lower and upper sides together."""
    rows = []
    deep = b.depends_on_activation(graph)
    for op in graph.ops:
        if op.kind != "activation" or not deep[op.inputs[0]]:
            continue
        j = op.inputs[0]
        local = list(exact)
        local[j] = graph.ops[j].interval(*(exact[i] for i in graph.ops[j].inputs))
        with rounding.pass_precision("float32"), torch.no_grad():
            lo, hi = b._tighten(graph, j, local, "adaptive", True)
        near, far = _widening(exact[j], (lo, hi)), _widening(exact[j], shipped[j])
        rows.append((j, float(near.mean()), float(near.max()), float(far.mean()), float(far.max())))
    return rows


def _widening(exact, box) -> torch.Tensor:
    return torch.cat([exact[0] - box[0], box[1] - exact[1]])


def op_margins(graph, boxes) -> dict[tuple[int, str, str], list[float]]:
    """(start node, op name, kind) -> mean margin per row, over the intermediate passes (a
    cropped convolution's ops are the crop's, named after the network's)."""
    found: dict[tuple[int, int], list[float]] = defaultdict(list)
    original = rounding.exact_shift
    start = {"node": -1}

    def recording(wide, a, back, in_boxes):
        shift, err = original(wide, a, back, in_boxes)
        found[(start["node"], wide.name, wide.kind)].append(float(err.mean()))
        return shift, err

    deep = b.depends_on_activation(graph)
    rounding.exact_shift = recording
    try:
        for op in graph.ops:
            if op.kind != "activation" or not deep[op.inputs[0]]:
                continue
            start["node"] = op.inputs[0]
            with rounding.pass_precision("float32"), torch.no_grad():
                b._tighten(graph, op.inputs[0], list(boxes), "adaptive", True)
    finally:
        rounding.exact_shift = original
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--nets", nargs="*", default=["256x4", "256x6"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[: args.images], data.y[: args.images]
    for name, network, shape, eps in networks():
        if name not in args.nets:
            continue
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        prop = prop.to(torch.float64)
        wide, narrow = boxes_at(graph, prop, "float64"), boxes_at(graph, prop, "float32")
        exact = final(graph, wide, prop, "float64")
        shipped = final(graph, narrow, prop, "float32")
        last_only = final(graph, wide, prop, "float32")
        boxes_only = final(graph, narrow, prop, "float64")
        their = lirpa(bounded_module(module, shape), prop)[1].double()
        print(f"== {name}: final bound below exact (max over rows / at that row's bound)")
        for label, bound in (("all passes float32", shipped), ("final-pass margin only", last_only),
                             ("intermediate boxes only", boxes_only)):  # fmt: skip
            gap = exact - bound
            row = float(exact.flatten()[int(gap.argmax())])
            print(f"  {label:<24} {float(gap.max()):.2e} (row bound {row:.3g})")
        over = their - exact
        print(f"  auto_LiRPA above exact: max {float(over.max()):.2e}, "
              f"rows above {int((over > 0).sum())} of {over.numel()}; auto_LiRPA above "
              f"all-float32: max {float((their - shipped).max()):.2e}")  # fmt: skip
        print("  node  local mean   local max  compounded mean  compounded max")
        for j, lm, lx, cm, cx in layer_losses(graph, wide, narrow):
            print(f"  {j:>4} {lm:>11.2e} {lx:>11.2e} {cm:>16.2e} {cx:>15.2e}")
        print("  mean margin per row, by pass start node and op (kind), rounded ops only:")
        for (start, op, kind), values in op_margins(graph, wide).items():
            if kind not in {"reshape", "input", "add"}:
                mean = sum(values) / len(values)
                print(f"    start {start:>2} {op:<24} {kind:<10} {mean:.2e}")


if __name__ == "__main__":
    main()
