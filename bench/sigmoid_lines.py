"""Sigmoid line slopes on one layer: ours against auto_LiRPA's CROWN, on eran spec 1211.

    python bench/sigmoid_lines.py [--spec 1211] [--lirpa /work/venv-lirpa/bin/python]
                                  [--whole STEPS] [--all-specs]

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
``--whole``: every layer's width and the spec's bounds by CROWN and alpha-CROWN with the
chord's and CROWN's slopes on every layer (alpha-CROWN from the chord and, with CROWN's
slopes, also from them); ``--all-specs``: CROWN's margin both ways on
all 36 eran sigmoid specs; ``--test-nets``: CROWN both ways on the tests' sigmoid/tanh nets.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from aisafety.database.scaled_mlp import smooth_net, sshape_net
from aisafety.verification import bounds as b
from aisafety.verification import relaxations as r
from aisafety.verification.vnncomp import load_network, rows_property
from aisafety.verification.vnnlib import read_disjuncts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

ERAN = "vnncomp2021_eran"  # in shared/data
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


def crown_start(self: r.SShapeRelaxation, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """alpha-CROWN's start at CROWN's slopes (lower, upper) instead of the chord's."""
    dtype, lo, hi = lo.dtype, lo.double(), hi.double()
    least, most = self.slope_range(lo, hi)
    span = torch.where(most > least, most - least, 1.0)
    return torch.stack([((k - least) / span).clamp(0, 1) for k in self.tangent_slopes(lo, hi)],
                       1).to(dtype)  # fmt: skip


def whole_net(graph, prop, rule: str, steps: int, start: str = "chord") -> None:
    """Every layer's mean box width and the spec bounds with ``rule``'s slopes on every
    sigmoid: CROWN, then alpha-CROWN (``steps`` per intermediate bound and at the output;
    its search starts from the chord, or from CROWN's slopes with ``start='tangent'``)."""
    saved, r.SIGMOID.rule = r.SIGMOID.rule, rule
    initial = r.SShapeRelaxation.initial_alpha
    if start == "tangent":
        r.SShapeRelaxation.initial_alpha = crown_start
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
            print(f"{rule:8s} start {start:8s} {name:15s} bounds {float(bound.min()):9.3f} to "
                  f"{float(bound.max()):9.3f}  widths " + " ".join(f"{w:.3f}" for w in widths)
                  + f"  ({time.process_time() - began:.1f} CPU s)")  # fmt: skip
    finally:
        r.SIGMOID.rule = saved
        r.SShapeRelaxation.initial_alpha = initial


def crown_margins(graph, shape) -> None:
    """CROWN's margin (worst row) on every eran sigmoid spec with each rule."""
    eran = shared_data(ERAN)
    listed = (eran / "eran_instances.csv").read_text().splitlines()
    specs = [line.split(",")[1] for line in listed if NET in line]
    tighter = 0
    for spec in specs:
        box, rows = read_disjuncts(eran / spec, math.prod(shape), 10)
        prop = rows_property(*(x.reshape(1, *shape) for x in box), [row[0] for row in rows])
        lower, upper = prop.lower.to(graph.dtype), prop.upper.to(graph.dtype)
        margins = []
        for rule in ("chord", "tangent"):
            saved, r.SIGMOID.rule = r.SIGMOID.rule, rule
            try:
                boxes = b.linear_boxes(graph, lower, upper)
                bound, _ = b.spec_lower(graph, boxes, prop.spec.to(graph.dtype))
            finally:
                r.SIGMOID.rule = saved
            margins.append(float((bound.double() + prop.offset).min()))
        tighter += margins[1] >= margins[0]
        print(f"{Path(spec).name:42s} CROWN chord {margins[0]:9.3f}  tangent {margins[1]:9.3f}")
    print(f"tangent at least as tight on {tighter} of {len(specs)}")


def small_nets() -> dict[str, nn.Module]:
    """The tests' two sigmoid/tanh nets on 4x4 inputs (aisafety/database/scaled_mlp.py):
    ``sshape_net`` (tests/test_sshape_relaxation.py and others) and the contract's smooth
    net (tests/test_contract.py)."""
    return {"sshape_net": sshape_net(), "contract _smooth_net": smooth_net()}


def test_nets() -> None:
    """CROWN with each rule on the tests' sigmoid/tanh nets, 30 samples per eps: certified
    samples and the new rule's worst-row bound minus the chord's."""
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property

    for name, net in small_nets().items():
        graph = build_graph(net, (1, 4, 4), name)
        x = torch.rand(30, 1, 4, 4, generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            label = net(x).argmax(1)
        for eps in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5):
            prop = robustness_property(x, label, eps, 3).to(graph.dtype)
            worst = []
            for rule in ("chord", "tangent"):
                r.SIGMOID.rule = r.TANH.rule = rule
                boxes = b.linear_boxes(graph, prop.lower, prop.upper)
                worst.append(b.spec_lower(graph, boxes, prop.spec)[0].amin(1))
            r.SIGMOID.rule = r.TANH.rule = "tangent"
            diff = worst[1] - worst[0]
            counts = [int((w > 0).sum()) for w in worst]
            print(f"{name} eps {eps}: certified chord {counts[0]} tangent {counts[1]} of 30;"
                  f" tangent - chord mean {float(diff.mean()):+.4f} min {float(diff.min()):+.4f}"
                  f" max {float(diff.max()):+.4f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=int, default=1211)
    parser.add_argument("--lirpa", default="", help="a Python that imports auto_LiRPA")
    parser.add_argument(
        "--all-specs", action="store_true", help="CROWN's margin by rule on every eran spec"
    )
    parser.add_argument("--test-nets", action="store_true", help="CROWN by rule, tests' nets")
    parser.add_argument(
        "--whole",
        type=int,
        default=-1,
        metavar="STEPS",
        help="also bound the whole net with each rule (alpha-CROWN STEPS)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.test_nets:
        test_nets()
        return
    eran = shared_data(ERAN)
    net = load_network(eran / "nets" / NET)
    graph = net.graph
    vnnlib = eran / "specs" / "mnist" / f"mnist_spec_idx_{args.spec}_eps_0.01200.vnnlib"
    box, rows = read_disjuncts(vnnlib, math.prod(net.shape), 10)
    prop = rows_property(*(x.reshape(1, *net.shape) for x in box), [row[0] for row in rows])
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
    if args.all_specs:
        crown_margins(graph, net.shape)
    if args.whole >= 0:
        for rule, start in (("chord", "chord"), ("tangent", "chord"), ("tangent", "tangent")):
            whole_net(graph, prop, rule, args.whole, start)


if __name__ == "__main__":
    main()
