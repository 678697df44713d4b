"""Sigmoid line slopes on one layer: ours against auto_LiRPA's CROWN, on eran spec 1211.

    python bench/sigmoid_lines.py [--spec 1211] [--lirpa /work/venv-lirpa/bin/python]

The eran sigmoid net's (ffnnSIGMOID__Point_6x200) second pre-activation box depends only
on the first sigmoid layer's lines: the first layer's box is exact (IBP of an affine map).
So each slope rule is applied to that one layer, with our exact outward-rounded intercepts
(``SShapeRelaxation.gaps``), and the second layer's box is tightened by one backward pass
(``bounds._tighten``). Printed per rule: the mean width of layer 2's box, and per class of
layer-1 interval (u <= 0, l >= 0, mixed) the mean slopes and the mean vertical gap of each
line to f (the largest distance between the line and f on [l, u]).

With ``--lirpa`` (a Python that imports auto_LiRPA) the same intervals go through
auto_LiRPA's ``BoundSigmoid`` (its vanilla CROWN relaxation); its lines are taken both as
they are and with our exact intercepts for its slopes (so the slopes alone compare).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from aisafety.verification import bounds as b
from aisafety.verification import relaxations as r
from aisafety.verification.vnncomp import _property, load_network
from aisafety.verification.vnnlib import read_disjuncts

ERAN = Path(__file__).resolve().parents[2] / "shared" / "data" / "vnncomp2021_eran"
NET = "ffnnSIGMOID__Point_6x200.onnx"
FIRST, SECOND = 6, 8  # the graph's first and second dense nodes
DENSE = (6, 8, 10, 12, 14, 16)  # the pre-activation nodes

LIRPA = """
import sys, json, torch
from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
class Sig(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)
lo, hi = (torch.tensor(v).reshape(1, -1) for v in json.load(open(sys.argv[1])))
model = BoundedModule(Sig(), torch.zeros_like(lo), device="cpu")
box = BoundedTensor((lo + hi) / 2, PerturbationLpNorm(x_L=lo, x_U=hi))
model.compute_bounds(x=(box,), method="CROWN")
node = [n for n in model.nodes() if type(n).__name__ == "BoundSigmoid"][0]
lines = [t.reshape(-1).double().tolist() for t in (node.lw, node.lb, node.uw, node.ub)]
json.dump(lines, open(sys.argv[2], "w"))
"""


def lirpa_lines(python: str, lo: torch.Tensor, hi: torch.Tensor) -> r.Lines:
    """auto_LiRPA's CROWN lines (lw, lb, uw, ub) for sigmoid on [lo, hi] (float32 there)."""
    with tempfile.TemporaryDirectory() as tmp:
        given, got = Path(tmp, "in.json"), Path(tmp, "out.json")
        given.write_text(json.dumps([lo.flatten().tolist(), hi.flatten().tolist()]))
        subprocess.run([python, "-c", LIRPA, str(given), str(got)], check=True,
                       capture_output=True)  # fmt: skip
        return tuple(torch.tensor(v, dtype=torch.float64).reshape(lo.shape)
                     for v in json.loads(got.read_text()))  # fmt: skip


def exact(fn: r.SShapeRelaxation, lo, hi, down, up) -> r.Lines:
    """Our exact intercepts for the slopes ``down`` (lower line) and ``up`` (upper line)."""
    low, _ = fn.gaps(lo, hi, down)
    _, high = fn.gaps(lo, hi, up)
    return down, low, up, high


def layer2_width(graph, boxes, lines: r.Lines) -> float:
    """Mean width of layer 2's box after one backward pass with ``lines`` on layer 1."""
    saved = r.SShapeRelaxation.lines
    r.SShapeRelaxation.lines = lambda self, lower, upper, slope=None: lines
    try:
        lo, hi = b._tighten(graph, SECOND, boxes, "adaptive", False)
    finally:
        r.SShapeRelaxation.lines = saved
    return float((hi - lo).mean())


def vertical_gaps(fn, lo, hi, lines: r.Lines) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest distance of each line to f on [lo, hi] (from f - k z's range)."""
    lw, lb, uw, ub = lines
    _, low_top = fn.gaps(lo, hi, lw)
    up_bottom, _ = fn.gaps(lo, hi, uw)
    return low_top - lb, ub - up_bottom


def report(name: str, fn, lo, hi, lines: r.Lines, width: float) -> None:
    below, above = vertical_gaps(fn, lo, hi, lines)
    print(f"{name:34s} layer-2 width {width:.4f}")
    for label, part in (("u <= 0", hi <= 0), ("l >= 0", lo >= 0), ("mixed", (lo < 0) & (hi > 0))):
        if part.any():
            k = [float(t[part].mean()) for t in (lines[0], lines[2])]
            g = [float(t[part].mean()) for t in (below, above)]
            print(f"   {label:7s} n={int(part.sum()):3d} slopes lower {k[0]:.4f} upper {k[1]:.4f}"
                  f"  gaps lower {g[0]:.4f} upper {g[1]:.4f}")  # fmt: skip


def whole_net(graph, prop, rule: str, steps: int) -> None:
    """Every layer's mean box width and the spec bounds with ``rule``'s slopes on every
    sigmoid: CROWN, then alpha-CROWN (``steps`` per intermediate bound and at the output;
    its search starts from the rule's slopes)."""
    saved, r.SIGMOID.rule = r.SIGMOID.rule, rule
    try:
        lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
        spec = prop.spec.to(graph.dtype)
        for name, alpha in (("CROWN", 0), (f"alpha-CROWN {steps}", steps)):
            began = time.process_time()
            boxes = b.linear_boxes(graph, lower, upper, "adaptive", alpha)
            if alpha:
                bound, _ = b.optimise_slopes(graph, boxes, spec, alpha)
            else:
                bound, _ = b.spec_lower(graph, boxes, spec)
            bound = bound.double() + prop.offset
            widths = [float((boxes[j][1] - boxes[j][0]).mean()) for j in DENSE]
            print(f"{rule:8s} {name:15s} bounds {float(bound.min()):9.3f} to "
                  f"{float(bound.max()):9.3f}  widths " + " ".join(f"{w:.3f}" for w in widths)
                  + f"  ({time.process_time() - began:.1f} CPU s)")  # fmt: skip
    finally:
        r.SIGMOID.rule = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=int, default=1211)
    parser.add_argument("--lirpa", default="", help="a Python that imports auto_LiRPA")
    parser.add_argument(
        "--whole",
        type=int,
        default=-1,
        metavar="STEPS",
        help="also bound the whole net with each rule (alpha-CROWN STEPS)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = load_network(ERAN / "nets" / NET)
    graph = net.graph
    vnnlib = ERAN / "specs" / "mnist" / f"mnist_spec_idx_{args.spec}_eps_0.01200.vnnlib"
    box, rows = read_disjuncts(vnnlib, math.prod(net.shape), 10)
    prop = _property(*(x.reshape(1, *net.shape) for x in box), [row[0] for row in rows])
    boxes = b.interval_boxes(graph, prop.lower.to(graph.dtype), prop.upper.to(graph.dtype))
    lo, hi = (t.double() for t in boxes[FIRST])
    fn = r.SIGMOID
    print(f"spec {args.spec}: layer-1 mean width {float((hi - lo).mean()):.4f}")
    chord = fn.chord(lo, hi)
    rules = {"chord (both lines)": (chord, chord)}
    down, up = rules["CROWN + smoothness (ours, exact)"] = fn.tangent_slopes(lo, hi)
    mixed = (lo < 0) & (hi > 0)
    rules["  CROWN's on one-sided, chord mixed"] = (torch.where(mixed, chord, down),
                                                  torch.where(mixed, chord, up))  # fmt: skip
    rules["  chord on one-sided, CROWN's mixed"] = (torch.where(mixed, down, chord),
                                                  torch.where(mixed, up, chord))  # fmt: skip
    rules["  CROWN's lower lines, chord upper"] = (down, chord)
    rules["  chord lower lines, CROWN's upper"] = (chord, up)
    for name, (down, up) in rules.items():
        lines = exact(fn, lo, hi, down, up)
        report(name, fn, lo, hi, lines, layer2_width(graph, boxes, lines))
    if args.lirpa:
        theirs = lirpa_lines(args.lirpa, lo.float(), hi.float())
        report("auto_LiRPA's lines as they are", fn, lo, hi, theirs,
               layer2_width(graph, boxes, theirs))  # fmt: skip
        ours = exact(fn, lo, hi, theirs[0], theirs[2])
        report("auto_LiRPA's slopes, exact b", fn, lo, hi, ours, layer2_width(graph, boxes, ours))
    if args.whole >= 0:
        for rule in ("chord", "tangent"):
            whole_net(graph, prop, rule, args.whole)


if __name__ == "__main__":
    main()
