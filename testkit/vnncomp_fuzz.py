"""Differential fuzzing of the VNN-COMP route (``vnncomp.verify_disjuncts``): random small
networks and VNN-LIB-like properties, a disjunction of unsafe regions, each a conjunction
of output atoms (docs/certification.md, "Fuzzing the VNN-COMP route").

A case is a network of testkit/verifier_fuzz.py's generator (its bound graph in float64, as
``vnncomp.load_network`` builds it; its replay in the network's own dtype, as onnxruntime
runs a float32 file) and 1-4 disjuncts of 1-4 atoms ``c . y + d <= 0`` in three families:
``targeted`` (one disjunct: class t is the largest, Marabou's shape), ``rows`` (2-4 one-atom
disjuncts: ``_verify_rows``) and ``mixed`` (2-3 disjuncts of 1-3 random integer atoms);
offsets put each atom near the edge at the box's centre. The objective is
v(x) = min_d max_k row_dk(x): the property is violated where v <= 0. Reference values are
v at the box's centre, corners, random points, box-PGD's minimiser of each disjunct's
largest row and, for a small ReLU net, the MILP's exact minimiser of each disjunct's
max_k row_dk (one variable t >= row_dk, minimised by HiGHS): every one is a point's value,
replayed in float64, so each is at least the true minimum. The invariants: ``unsat`` only
where no reference point has v <= 0 and with margin > 0; the margin at most every
reference value; a ``sat`` counterexample in the box, replayed, with some disjunct holding;
a positive margin only with ``unsat``.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from max_row_milp import with_max_row
from torch import nn
from verifier_fuzz import FAST, MILP_MAX_UNSTABLE, Finding, choice, random_net, uniform

from aisafety.verification import deadline
from aisafety.verification.bounds import interval_boxes
from aisafety.verification.falsify import pgd_on_rows
from aisafety.verification.graph import BoundGraph, VerificationError, build_graph
from aisafety.verification.milp import encode, solve
from aisafety.verification.property import Property
from aisafety.verification.vnncomp import rows_property, verify_disjuncts

FAMILIES = ("targeted", "rows", "mixed")
# the route's verifiers: bound-only, complete (bab family: the joint search) and MILP
VERIFIERS = ("alpha-crown", "bab", "complete")
RADII = (0.0, 1e-4, 0.01, 0.05, 0.1, 0.2, 0.5, 2.0)


@dataclass
class Net:
    """Stands for ``vnncomp.Network``: the float64 bound graph and the replay."""

    graph: BoundGraph
    net: nn.Module

    def run(self, x: torch.Tensor) -> torch.Tensor:
        dtype = next(self.net.parameters()).dtype
        with torch.no_grad():
            return self.net(x.reshape(len(x), *self.graph.input_shape).to(dtype))


@dataclass
class Case:
    """One case: the network, its float64 reference, the box (1, *shape), the disjuncts."""

    seed: int
    family: str
    net: Net
    reference: nn.Module
    lower: torch.Tensor
    upper: torch.Tensor
    disjuncts: list[list[tuple[torch.Tensor, float]]]
    what: str

    def props(self) -> list[Property]:
        return [rows_property(self.lower, self.upper, rows) for rows in self.disjuncts]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """v(x) (n,) of the float64 reference at points clamped into the box."""
        x = x.double().reshape(-1, *self.lower.shape[1:]).clamp(self.lower, self.upper)
        with torch.no_grad():
            y = self.reference(x)
        return torch.stack([p.rows(y).amax(1) for p in self.props()]).amin(0)

    def replayed_value(self, x: torch.Tensor) -> float:
        """v(x) by the replay (the network's dtype), x as given."""
        y = self.net.run(x).double()
        return min(float(p.rows(y).amax()) for p in self.props())


def random_case(seed: int, family: str | None = None) -> Case:
    gen = torch.Generator().manual_seed(seed)
    family = family or choice(gen, FAMILIES)
    net, shape, what = random_net(gen)
    if family == "targeted":  # class t against 2-4 others: at least 3 classes
        while net[-1].out_features < 3:
            net, shape, what = random_net(gen)
    net = net.to(choice(gen, [torch.float32, torch.float32, torch.float64]))
    reference = copy.deepcopy(net).double().eval()
    # float32 centres: a degenerate input (lower = upper) then has a point the replay can
    # take (a float64 one has none: ``falsify.into_box`` finds no float32 inside it). A
    # third of the cases keep float64 ones (drawn aside, the case's stream unchanged): such
    # boxes are never ``sat``, so they leave more answers open, whose margins are checked
    centre = torch.rand(1, *shape, generator=gen, dtype=torch.float64)
    if uniform(torch.Generator().manual_seed(seed + 2)) >= 1 / 3:
        centre = centre.float().double()
    radius = torch.full_like(centre, choice(gen, RADII))
    radius[torch.rand(centre.shape, generator=gen) < 0.2] = 0.0
    lower, upper = centre - radius, centre + radius
    with torch.no_grad():
        outputs = reference(centre)[0]
    disjuncts = _disjuncts(gen, family, outputs)
    graph = build_graph(net, shape, f"vnnfuzz{seed}")
    dtype = str(next(net.parameters()).dtype).removeprefix("torch.")
    atoms = "+".join(str(len(rows)) for rows in disjuncts)
    what = f"{family} {what} {dtype} atoms={atoms}"
    return Case(seed, family, Net(graph, net), reference, lower, upper, disjuncts, what)


def _disjuncts(gen, family: str, outputs: torch.Tensor) -> list[list[tuple[torch.Tensor, float]]]:
    classes = len(outputs)
    if family == "targeted":  # Y_j - Y_t <= 0 for 2-4 classes j: t on top
        t = int(torch.randint(classes, (1,), generator=gen))
        others = [j for j in range(classes) if j != t]
        count = min(len(others), int(torch.randint(2, 5, (1,), generator=gen)))
        keep = torch.randperm(len(others), generator=gen)[:count].tolist()
        rows = []
        for j in sorted(others[i] for i in keep):
            c = torch.zeros(classes, dtype=torch.float64)
            c[j], c[t] = 1.0, -1.0
            rows.append(c)
        return [[(c, _offset(gen, c, outputs)) for c in rows]]
    if family == "rows":
        sizes = [1] * int(torch.randint(2, 5, (1,), generator=gen))
    else:
        sizes = [int(torch.randint(1, 4, (1,), generator=gen))
                 for _ in range(int(torch.randint(2, 4, (1,), generator=gen)))]  # fmt: skip
    disjuncts = []
    for size in sizes:
        rows = [torch.randint(-2, 3, (classes,), generator=gen).double() for _ in range(size)]
        disjuncts.append([(c, _offset(gen, c, outputs)) for c in rows])
    return disjuncts


def _offset(gen, c: torch.Tensor, outputs: torch.Tensor) -> float:
    """An offset putting the atom's row near zero at the centre: above it (the atom false
    there) 60% of the time, by 1e-3..10 relative; some of them decimals."""
    at = float(c @ outputs)
    spread = 10 ** (4 * uniform(gen) - 3)
    sign = 1.0 if uniform(gen) < 0.6 else -1.0
    offset = -at + sign * spread * (1 + abs(at))
    if uniform(gen) < 0.2:
        offset = round(offset * 8) / 8 + 0.1
    return offset


@dataclass
class Reference:
    """The least v over the reference points, whether a MILP minimiser is among them, the
    float64 reference's tolerance, and whether the box holds a float32 point at all."""

    lowest: float
    milp: bool
    tolerance: float
    # False where some input's interval holds no float32 value (lower = upper at a float64
    # value float32 cannot represent): nothing can be replayed there, so such a case is
    # never ``sat`` however violated (VNN-COMP replays float32 too); counted, not a miss
    float32_point: bool = True

    @property
    def violated(self) -> bool:
        return self.lowest <= 0


def has_float32_point(lower: torch.Tensor, upper: torch.Tensor) -> bool:
    """Whether every input's interval [lower, upper] holds a float32 value: its lower end
    rounded up to float32 is at most its upper end."""
    up = lower.float()
    up = torch.where(up.double() < lower, torch.nextafter(up, torch.full_like(up, torch.inf)), up)
    return bool((up.double() <= upper).all())


def reference(case: Case, random_points: int = 64, pgd_steps: int = 20) -> Reference:
    gen = torch.Generator().manual_seed(case.seed + 1)
    lower, upper = case.lower, case.upper
    points = [(lower + upper) / 2, lower, upper]
    for _ in range(8):
        points.append(torch.where(torch.rand(lower.shape, generator=gen) < 0.5, lower, upper))
    width = upper - lower
    points += [lower + width * torch.rand(lower.shape, generator=gen, dtype=torch.float64)
               for _ in range(random_points)]  # fmt: skip
    for prop in case.props():
        largest = lambda x, p=prop: p.rows(case.reference(x.double())).amax(1, keepdim=True)  # noqa: E731
        one = Property(lower, upper, prop.spec.new_ones(1, 1, 1), prop.offset[:, :1] * 0)
        points.append(pgd_on_rows(largest, one, pgd_steps, 2, corners=True))
    graph64 = build_graph(case.reference, case.lower.shape[1:], "reference")
    milp = graph64.relu_only and _few_unstable(graph64, lower, upper)
    if milp:
        points += [p for p in (_milp_point(graph64, case, prop) for prop in case.props()) if
                   p is not None]  # fmt: skip
    lowest = float(torch.cat([case.value(p) for p in points]).min())
    boxes = interval_boxes(graph64, lower, upper)
    size = max(float(torch.maximum(lo.abs(), hi.abs()).max()) for lo, hi in boxes)
    size = size if math.isfinite(size) else 1e300
    scale = max(float(c.abs().sum()) * size + abs(d) for rows in case.disjuncts for c, d in rows)
    tolerance = 1e-12 * scale + 1e-9 * (1 + abs(lowest))
    return Reference(lowest, milp, tolerance, has_float32_point(lower, upper))


def _few_unstable(graph: BoundGraph, lower, upper) -> bool:
    boxes = interval_boxes(graph, lower, upper)
    unstable = sum(int(((boxes[op.inputs[0]][0] < 0) & (boxes[op.inputs[0]][1] > 0)).sum())
                   for op in graph.ops if op.kind == "activation")  # fmt: skip
    return unstable <= MILP_MAX_UNSTABLE


def _milp_point(graph: BoundGraph, case: Case, prop: Property) -> torch.Tensor | None:
    """The input minimising max_k row_k of one disjunct, by HiGHS to optimality: the
    network's MILP plus t >= row_k per atom (``with_max_row``), t within the rows' interval
    bounds."""
    boxes = interval_boxes(graph, case.lower, case.upper)
    try:
        enc = encode(graph, boxes)
    except VerificationError:
        return None
    spec, offset = prop.spec[0].numpy(), prop.offset[0].numpy()
    lo, hi = boxes[-1][0][0].numpy(), boxes[-1][1][0].numpy()
    row_lo = np.clip(spec, 0, None) @ lo + np.clip(spec, None, 0) @ hi + offset
    row_hi = np.clip(spec, 0, None) @ hi + np.clip(spec, None, 0) @ lo + offset
    if not (np.isfinite(row_lo).all() and np.isfinite(row_hi).all()):
        return None
    with_t, cost = with_max_row(enc, spec, offset, row_lo.max() - 1, row_hi.max() + 1)
    found = solve(with_t, cost, 0.0, 10.0, options={"mip_rel_gap": 0.0, "mip_abs_gap": 1e-9})
    if found.point is None:
        return None
    return torch.from_numpy(found.point).reshape(case.lower.shape)


def settings(name: str, timeout: float = 1.0) -> dict:
    """The fuzz's fast settings for ``name``'s config (testkit/verifier_fuzz.py's FAST)."""
    from aisafety.plugins import default_registry

    fields = getattr(default_registry().get("verifier", name).Config, "model_fields", {})
    return {k: v for k, v in {**FAST, "timeout": timeout}.items() if k in fields}


def run_case(registry, name: str, case: Case, timeout: float = 1.0):
    """``verify_disjuncts`` on the case: its ``InstanceResult``, or None where the verifier
    does not take the graph."""
    config = settings(name, timeout)
    try:
        registry.create("verifier", name, config).check(case.net.graph)
    except VerificationError:
        return None
    return verify_disjuncts(registry, case.net, case.lower, case.upper, case.disjuncts, name,
                            config)  # fmt: skip


@contextmanager
def ticking_clock() -> Iterator[None]:
    """The 'cpu' clock as a counter, one tick per reading (tests/test_verification_anytime.py):
    a limit of L ticks ends the run after a fixed amount of work, so a deadline expires at
    a point of the route set by L, the same on any machine."""
    ticks = itertools.count()
    saved = deadline.CLOCKS["cpu"]
    deadline.CLOCKS["cpu"] = lambda: float(next(ticks))
    try:
        yield
    finally:
        deadline.CLOCKS["cpu"] = saved


def tick_limit(seed: int, name: str) -> int:
    """A limit of 1 to ~80,000 ticks, log-uniform, drawn from the seed and verifier (a
    whole run here reads the clock 40 to 70,000 times)."""
    gen = torch.Generator().manual_seed(seed * 31 + sum(map(ord, name)))
    return int(10 ** (4.9 * uniform(gen)))


def counterexample(text: str, shape) -> torch.Tensor:
    """The input point of a ``sat`` answer's ``(X_i v)`` lines."""
    values = [float(v) for v in re.findall(r"\(X_\d+ ([^)]+)\)", text)]
    return torch.tensor(values, dtype=torch.float64).reshape(1, *shape)


def check(case: Case, ref: Reference, result, name: str) -> list[Finding]:
    """The invariants broken by ``result`` (``vnncomp.InstanceResult``) on ``case``."""
    found: list[Finding] = []

    def note(kind: str, detail: str) -> None:
        found.append(Finding(case.seed, name, kind, detail))

    status, margin, tol = result.status, result.margin, ref.tolerance
    if math.isnan(margin):
        note("NaN margin", f"{status}")
    if status == "unsat" and ref.lowest <= 0:
        note("unsat where a point violates", f"v = {ref.lowest:.6g} at a reference point, "
             f"margin {margin:.6g}")  # fmt: skip
    if status == "unsat" and not margin > 0:
        note("unsat without a positive margin", f"margin {margin:.6g}")
    if status != "unsat" and margin > 0:
        note("positive margin not unsat", f"{status} margin {margin:.6g} ({result.note})")
    if status != "sat" and margin > ref.lowest + tol:
        note("margin above a value", f"by {margin - ref.lowest:.4g} ({status}, margin "
             f"{margin:.6g}, lowest {ref.lowest:.6g}, {result.note})")  # fmt: skip
    if status == "sat" and not ref.float32_point:
        note("sat without a float32 point in the box", f"margin {margin:.6g}")
    if status == "sat":
        _check_sat(case, result, tol, note)
    return found


def _check_sat(case: Case, result, tol: float, note) -> None:
    x = counterexample(result.counterexample, case.lower.shape[1:])
    if not bool(((x >= case.lower) & (x <= case.upper)).all()):
        outside = (case.lower - x).clamp(min=0) + (x - case.upper).clamp(min=0)
        note("counterexample outside the box", f"by {float(outside.max()):.3g}")
        return
    replayed = case.replayed_value(x)
    if not replayed <= 0:
        note("counterexample does not replay", f"v = {replayed:.6g} by the replay")
    exact = float(case.value(x)[0])
    if not exact <= tol:
        note("counterexample violates only in the network's rounding", f"float64 v = {exact:.6g}")
    if not result.margin <= 0:
        note("sat with a positive margin", f"margin {result.margin:.6g}")
