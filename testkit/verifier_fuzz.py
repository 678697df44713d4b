"""Differential fuzzing of every registered verifier: random small graphs and properties,
and the invariants a sound verifier keeps on them (docs/certification.md, "Fuzzing").

A case is a random network (dense, convolutional with stride and padding, max/average
pooling, BatchNorm, a residual addition, ReLU/sigmoid/tanh, an elementwise affine map,
weights scaled by up to 1e3 or down to 1e-3), in float32 or float64, and a random property
of 1-3 samples (nonzero offsets, robustness or random integer spec rows, degenerate, thin
and wide boxes). Its reference values are the network in float64 at the box's centre and
corners, random points, box-PGD's minimiser and, for a small ReLU net, the MILP's optimum
point: every proved bound must be at most each of them. Shared by the bench
(bench/verifier_fuzz.py, many seeds) and the test slice (tests/test_verifier_fuzz.py).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from aisafety.verification.bounds import interval_boxes
from aisafety.verification.falsify import pgd_on_rows
from aisafety.verification.graph import BoundGraph, VerificationError, build_graph
from aisafety.verification.milp import encode, minimise_row
from aisafety.verification.property import Property, margin_spec

# fast settings, applied where a verifier's Config has the field (timeouts in CPU seconds)
FAST = {
    "timeout": 1.0,
    "clock": "cpu",
    "attack_steps": 10,
    "attack_restarts": 1,
    "steps": 5,
    "joint_steps": 10,
    "root_steps": 10,
    "stall_steps": 10,
    "alpha_steps": 5,
    "max_domains": 2000,
    "max_size": 50,  # the SDP and LMI matrices: side 1 + inputs + hidden neurons
}
# verifiers whose bound of a sample is documented not to depend on its batch
BATCH_FREE = {"ibp", "crown", "crown-ibp", "fast-lin", "deeppoly", "alpha-crown"}
RADII = (0.0, 1e-7, 1e-4, 0.01, 0.1, 0.5, 2.0)
MILP_MAX_UNSTABLE = 60


class Affine(nn.Module):
    """``x * scale + shift`` with constant tensors: the graph's elementwise op (a child
    module, so the tracer inlines it rather than keeping an unknown leaf)."""

    def __init__(self, shape: tuple[int, ...], gen: torch.Generator):
        super().__init__()
        self.inner = nn.Identity()
        self.register_buffer("scale", torch.randn(shape, generator=gen))
        self.register_buffer("shift", torch.randn(shape, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.scale + self.shift


class Residual(nn.Module):
    """``x + conv(act(conv(x)))``, shape-preserving: the graph's add of two branches."""

    def __init__(self, channels: int, act: nn.Module):
        super().__init__()
        self.a = nn.Conv2d(channels, channels, 3, padding=1)
        self.act = act
        self.b = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.act(self.a(x)))


@dataclass
class Case:
    """One fuzz case: the network (its own dtype), its graph, a float64 property."""

    seed: int
    net: nn.Module
    input_shape: tuple[int, ...]
    graph: BoundGraph
    prop: Property
    what: str
    reference: nn.Module = field(init=False)

    def __post_init__(self):
        self.reference = copy.deepcopy(self.net).double().eval()

    def model(self, x: torch.Tensor) -> torch.Tensor:
        """The network in its own dtype (what ``verify`` replays counterexamples through)."""
        dtype = next(self.net.parameters()).dtype
        with torch.no_grad():
            return self.net(x.to(dtype))

    def values_one(self, point: torch.Tensor, s: int) -> torch.Tensor:
        """Sample ``s``'s rows (K,) at one point, clamped into its box."""
        one = self.prop[s : s + 1]
        x = point.double().reshape(1, *self.input_shape).clamp(one.lower, one.upper)
        with torch.no_grad():
            return one.rows(self.reference(x))[0]

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """Spec rows (B, K) of the float64 reference at points ``x`` clamped into the box."""
        x = x.double().clamp(self.prop.lower, self.prop.upper)
        with torch.no_grad():
            return self.prop.rows(self.reference(x))


def choice(gen: torch.Generator, options):
    return options[int(torch.randint(len(options), (1,), generator=gen))]


def uniform(gen: torch.Generator) -> float:
    return float(torch.rand((), generator=gen, dtype=torch.float64))


def _activation(gen: torch.Generator, relu_only: bool) -> nn.Module:
    return nn.ReLU() if relu_only else choice(gen, [nn.ReLU, nn.Sigmoid, nn.Tanh])()


def _batchnorm(module: nn.Module, gen: torch.Generator) -> nn.Module:
    n = module.num_features
    with torch.no_grad():
        module.running_mean.copy_(torch.randn(n, generator=gen))
        module.running_var.copy_(torch.rand(n, generator=gen) * 2 + 0.1)
        module.weight.copy_(torch.randn(n, generator=gen))
        module.bias.copy_(torch.randn(n, generator=gen))
    return module


def dense_layers(gen, width: int, classes: int, relu_only: bool, what: list[str]):
    layers: list[nn.Module] = []
    for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
        out = int(torch.randint(2, 9, (1,), generator=gen))
        layers.append(nn.Linear(width, out))
        if uniform(gen) < 0.2:
            layers.append(_batchnorm(nn.BatchNorm1d(out), gen))
            what.append("bn1d")
        if uniform(gen) < 0.15:
            layers.append(Affine((out,), gen))
            what.append("affine")
        layers.append(_activation(gen, relu_only))
        width = out
    layers.append(nn.Linear(width, classes))
    return layers


def conv_layers(gen, shape: tuple[int, int, int], relu_only: bool, what: list[str]):
    layers: list[nn.Module] = []
    c, (h, w) = shape[0], shape[1:]
    for _ in range(int(torch.randint(1, 3, (1,), generator=gen))):
        if min(h, w) >= 3 and uniform(gen) < 0.25:
            layers.append(Residual(c, _activation(gen, relu_only)))
            what.append("residual")
        out = int(torch.randint(1, 4, (1,), generator=gen))
        k = int(torch.randint(1, min(3, h, w) + 1, (1,), generator=gen))
        stride, pad = choice(gen, [1, 1, 2]), choice(gen, [0, 0, 1])
        dilation = (
            2 if k > 1 and 2 * (k - 1) + 1 <= min(h, w) + 2 * pad and uniform(gen) < 0.2 else 1
        )
        layers.append(nn.Conv2d(c, out, k, stride=stride, padding=pad, dilation=dilation))
        what.append(f"conv{k}s{stride}p{pad}" + ("d2" if dilation > 1 else ""))
        c, h, w = _out_shape(layers, shape)
        if uniform(gen) < 0.25:
            layers.append(_batchnorm(nn.BatchNorm2d(c), gen))
            what.append("bn2d")
        layers.append(_activation(gen, relu_only))
        if min(h, w) >= 2 and uniform(gen) < 0.4:
            layers.append(_pool(gen, min(h, w), what))
            c, h, w = _out_shape(layers, shape)
    return layers, c * h * w


def _pool(gen, size: int, what: list[str]) -> nn.Module:
    """Max, average or adaptive average pooling; kernel 2-3, any stride, padding, ceil."""
    kind = choice(gen, ["max", "max", "avg", "adaptive"])
    if kind == "adaptive":
        what.append("adaptivepool")
        return nn.AdaptiveAvgPool2d(choice(gen, [1, 2]))
    k = int(torch.randint(2, min(3, size) + 1, (1,), generator=gen))
    stride, pad = choice(gen, [1, 2, k]), choice(gen, [0, 0, 1])
    ceil = uniform(gen) < 0.3
    what.append(f"{kind}pool{k}s{stride}p{pad}" + ("c" if ceil else ""))
    pool = nn.MaxPool2d if kind == "max" else nn.AvgPool2d
    return pool(k, stride=stride, padding=pad, ceil_mode=ceil)


def _out_shape(layers: list[nn.Module], shape: tuple[int, ...]) -> tuple[int, int, int]:
    with torch.no_grad():
        return tuple(nn.Sequential(*layers).eval()(torch.zeros(1, *shape)).shape[1:])


def random_net(gen: torch.Generator) -> tuple[nn.Module, tuple[int, ...], str]:
    """A small random network, its per-sample input shape and a short description."""
    relu_only = uniform(gen) < 0.6
    classes = int(torch.randint(2, 5, (1,), generator=gen))
    what: list[str] = ["relu" if relu_only else "mixed-act"]
    if uniform(gen) < 0.4:
        n = int(torch.randint(1, 7, (1,), generator=gen))
        shape: tuple[int, ...] = (n,)
        layers = dense_layers(gen, n, classes, relu_only, what)
        what.insert(0, "dense")
    else:
        shape = (int(torch.randint(1, 3, (1,), generator=gen)),) + (
            int(torch.randint(3, 7, (1,), generator=gen)),
        ) * 2
        body, width = conv_layers(gen, shape, relu_only, what)
        layers = [*body, nn.Flatten(), *dense_layers(gen, width, classes, relu_only, what)]
        what.insert(0, "conv")
    net = seeded_weights(nn.Sequential(*layers), gen, what)
    return net, shape, " ".join(what)


def seeded_weights(net: nn.Module, gen: torch.Generator, what: list[str]) -> nn.Module:
    """``net`` in eval mode with default initialisation drawn from ``gen``'s next seed, then
    one layer's weights scaled by 4, 1e3 or 1e-3 (half the time none): steep and flat nets."""
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    for module in net.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            module.reset_parameters()
    scaled = [m for m in net.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    factor = choice(gen, [1.0, 1.0, 1.0, 4.0, 1e3, 1e-3])
    if factor != 1.0:
        layer = choice(gen, scaled)
        with torch.no_grad():
            layer.weight.mul_(factor)
        what.append(f"x{factor:g}")
    return net.eval()


def random_property(gen: torch.Generator, case_net: nn.Module, shape, dtype) -> Property:
    """1-3 samples with their own boxes and rows; offsets put the rows near zero."""
    n = int(torch.randint(1, 4, (1,), generator=gen))
    centre = torch.rand(n, *shape, generator=gen, dtype=torch.float64)
    radius = torch.tensor([choice(gen, RADII) for _ in range(n)], dtype=torch.float64)
    radius = radius.reshape(n, *([1] * len(shape))).expand_as(centre).clone()
    radius[torch.rand(centre.shape, generator=gen) < 0.2] = 0.0  # degenerate inputs
    lower, upper = centre - radius, centre + radius
    if uniform(gen) < 0.5:
        lower, upper = lower.clamp(0, 1), upper.clamp(0, 1)
    with torch.no_grad():
        outputs = copy.deepcopy(case_net).double()(centre)
    classes = outputs.shape[1]
    if uniform(gen) < 0.4:
        spec = margin_spec(outputs.argmax(1), classes)
    else:
        k = int(torch.randint(1, 4, (1,), generator=gen))
        spec = torch.randint(-2, 3, (n, k, classes), generator=gen).double()
    at_centre = (spec @ outputs.unsqueeze(2)).squeeze(2)
    spread = 10 ** (4 * torch.rand(at_centre.shape, generator=gen, dtype=torch.float64) - 3)
    sign = torch.where(torch.rand(at_centre.shape, generator=gen) < 0.7, 1.0, -1.0)
    offset = -at_centre + sign * spread * (1 + at_centre.abs())
    if uniform(gen) < 0.2:
        offset = torch.round(offset * 8) / 8 + 0.1  # a decimal, not a float32, offset
    return Property(lower, upper, spec, offset)


def random_case(seed: int) -> Case:
    gen = torch.Generator().manual_seed(seed)
    net, shape, what = random_net(gen)
    dtype = choice(gen, [torch.float32, torch.float64])
    net = net.to(dtype)
    prop = random_property(gen, net, shape, dtype)
    graph = build_graph(net, shape, f"fuzz{seed}", dtype=dtype)
    what = f"{what} {str(dtype).removeprefix('torch.')} B={len(prop)} K={prop.spec.shape[1]}"
    return Case(seed, net, shape, graph, prop, what)


@dataclass
class Reference:
    """The least value found of every spec row (B, K), the tolerance of the float64
    reference (B, K) and whether a MILP optimum is among the points (per sample)."""

    lowest: torch.Tensor
    tolerance: torch.Tensor
    milp: torch.Tensor


def reference(case: Case, random_points: int = 64, pgd_steps: int = 20) -> Reference:
    prop, gen = case.prop, torch.Generator().manual_seed(case.seed + 1)
    lower, upper = prop.lower, prop.upper
    points = [(lower + upper) / 2, lower, upper]
    for _ in range(8):  # random corners
        pick = torch.rand(lower.shape, generator=gen, dtype=torch.float64) < 0.5
        points.append(torch.where(pick, lower, upper))
    for _ in range(random_points):
        points.append(lower + (upper - lower) * torch.rand(lower.shape, generator=gen,
                                                             dtype=torch.float64))  # fmt: skip
    points.append(pgd_on_rows(lambda x: case.reference(x.double()), prop, pgd_steps, 2,
                              corners=True))  # fmt: skip
    lowest = torch.stack([case.values(p) for p in points]).amin(0)
    graph64 = build_graph(case.reference, case.input_shape, "reference", dtype=torch.float64)
    boxes = interval_boxes(graph64, lower, upper)
    size = max(float(torch.maximum(lo.abs(), hi.abs()).max()) for lo, hi in boxes)
    size = size if math.isfinite(size) else 1e300
    scale = prop.spec.abs().sum(2) * size + prop.offset.abs()
    tolerance = 1e-12 * scale + 1e-9 * (1 + lowest.abs())
    milp = torch.zeros(len(prop), dtype=torch.bool)
    if graph64.relu_only:
        for s in range(len(prop)):
            one = prop[s : s + 1]
            for point in _milp_points(graph64, one):
                lowest[s] = torch.minimum(lowest[s], case.values_one(point, s))
                milp[s] = True
    return Reference(lowest, tolerance, milp)


def _milp_points(graph: BoundGraph, prop: Property) -> list[torch.Tensor]:
    """The MILP's minimising input of every row of a one-sample property (small nets)."""
    boxes = interval_boxes(graph, prop.lower, prop.upper)
    unstable = sum(int(((boxes[op.inputs[0]][0] < 0) & (boxes[op.inputs[0]][1] > 0)).sum())
                   for op in graph.ops if op.kind == "activation")  # fmt: skip
    if unstable > MILP_MAX_UNSTABLE:
        return []
    try:
        enc = encode(graph, boxes)
    except VerificationError:
        return []
    points = []
    for row, offset in zip(prop.spec[0], prop.offset[0], strict=True):
        _, _, point = minimise_row(enc, row.numpy().astype(np.float64), float(offset), 10.0)
        if point is not None:
            points.append(torch.from_numpy(point))
    return points


@dataclass
class Finding:
    """One broken invariant: which verifier, on which case, what."""

    seed: int
    verifier: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"seed {self.seed} {self.verifier}: {self.kind}: {self.detail}"


def make(registry, name: str):
    cls = registry.get("verifier", name)
    fields = getattr(cls.Config, "model_fields", {})
    return registry.create("verifier", name, {k: v for k, v in FAST.items() if k in fields})


def check_verifier(
    registry, name: str, case: Case, ref: Reference, verdicts: Counter | None = None
) -> list[Finding] | None:
    """The findings of verifier ``name`` on ``case``; None where it does not take the graph.
    ``verdicts`` counts the verdicts of its ``verify`` (how much each kind was exercised)."""
    verifier = make(registry, name)
    try:
        verifier.check(case.graph)
    except VerificationError:
        return None
    found: list[Finding] = []

    def note(kind: str, detail: str) -> None:
        found.append(Finding(case.seed, name, kind, detail))

    # ``lower_bounds`` as ``verify`` calls it: on the float64 copy of a float32 graph (a
    # float32 graph's own passes carry no rounding margin: training's objective)
    graph, prop = case.graph.in_dtype(torch.float64), case.prop
    with torch.no_grad():
        bounds = verifier.lower_bounds(graph, prop)[0].double()
    bounds = bounds + prop.offset
    over = bounds - ref.lowest - ref.tolerance
    if (over > 0).any():
        note("bound above a value", f"by {float(over.max()):.4g} (bounds {bounds.tolist()} "
             f"lowest {ref.lowest.tolist()})")  # fmt: skip
    if len(case.prop) > 1 and name in BATCH_FREE:
        with torch.no_grad():
            alone = torch.cat([verifier.lower_bounds(graph, prop[s : s + 1])[0].double()
                               for s in range(len(prop))]) + prop.offset  # fmt: skip
        gap = (alone - bounds).abs()
        close = torch.isclose(alone, bounds, rtol=1e-9, atol=1e-12)
        if not (close | (gap == 0)).all():
            note("batch-dependent bound", f"alone vs batched differ by {float(gap.max()):.3g}")
    result = verifier.verify(case.graph, case.prop, case.model)
    if verdicts is not None:
        verdicts.update(str(v) for v in result.verdicts)
    _check_verdicts(result, case, ref, note)
    return found


def _check_verdicts(result, case: Case, ref: Reference, note) -> None:
    if len(result) != len(case.prop):
        note("result length", f"{len(result)} for {len(case.prop)} samples")
        return
    lowest = ref.lowest.amin(1)
    tolerance = ref.tolerance.amax(1)
    certified, falsified = result.certified, result.falsified
    margins = result.margins.double()
    if (certified & margins.isnan()).any():
        note("NaN certified", f"margins {margins.tolist()}")
    bounded = ~falsified
    over = (margins - lowest - tolerance)[bounded]
    if (over > 0).any():
        verdicts = [str(v) for v in result.verdicts]
        note("margin above a value", f"by {float(over.max()):.4g} (margins {margins.tolist()}, "
             f"lowest {lowest.tolist()}, verdicts {verdicts})")  # fmt: skip
    if (certified & (lowest <= 0)).any():
        note("certified a violated sample", f"lowest {lowest.tolist()} margins {margins.tolist()}")
    for s in torch.nonzero(falsified).flatten().tolist():
        one = case.prop[s : s + 1]
        cex = result.counterexamples[s : s + 1]
        if not bool(one.inside(cex).all()):
            note("counterexample outside the box", f"sample {s}")
            continue
        rows = one.rows(case.model(cex).double())
        if not bool((rows <= 0).any()):
            note("counterexample does not replay", f"sample {s}: rows {rows.tolist()}")
        exact = case.values_one(cex[0], s)
        if not bool((exact <= ref.tolerance[s]).any()):
            note("counterexample violates only in the network's rounding",
                 f"sample {s}: float64 rows {exact.tolist()}")  # fmt: skip
