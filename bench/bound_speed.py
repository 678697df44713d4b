"""CROWN's time against auto_LiRPA's on the same networks, images and specs, one thread.

    /work/venv-lirpa/bin/python bench/bound_speed.py [--images 8] [--repeats 7]

auto_LiRPA must be importable (a separate venv with --system-site-packages and
``pip install --no-deps -e`` a checkout of Verified-Intelligence/auto_LiRPA, plus appdirs
and graphviz, so it does not replace torch). Networks: the VNN-COMP 2021 mnistfc 256x2 /
256x4 / 256x6 MLPs at eps 0.03 and the zoo's Conv-Small ``sok-cnn-a-adv1`` at eps 0.1, on
the first ``--images`` embedded MNIST test images. Both bound the same plain
``nn.Sequential`` rebuilt from our bound graph (auto_LiRPA cannot trace onnx2torch's
modules), with the margin rows ``f_y - f_j`` as the spec ``C``.

Per network: the paired median of our time / auto_LiRPA's (interleaved, the order
alternating), for CROWN as shipped (float32 backward passes with their rounding margin,
verification/rounding.py) and with every pass in float64 (``pass_precision("float64")``),
and the largest amount by which auto_LiRPA's float32 lower bound exceeds our shipped one
(<= 0: ours at least as tight everywhere); how far auto_LiRPA's bound is above the exact
bound of the relaxation (our float64 passes: its own float32 rounding, which it does not
bound and which no sound bound of the same relaxation can match) and the largest gap
beyond that, ``max(min(theirs, exact) - ours)`` per row; how far our float64 passes are
above our shipped bound; and the gap against our float32 passes with every op's rounding
margin left out (unsound; the part of the gap that is not the margins). The CPU, the load
(before and after) and auto_LiRPA's commit are printed. One thread each.

``--alpha N``: alpha-CROWN instead, ours and auto_LiRPA's, on the first N images of
Conv-Small in chunks of 10, both with 20 Adam steps at lr 0.1 on the slopes: cumulative CPU
time, certified images per chunk, and the images where a row of ours is below our CROWN's;
``--skip K`` starts at image K (a run cut by a time limit goes on from there).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from aisafety.memory import reuse_freed_memory
from aisafety.verification import ops, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import CrownVerifier
from aisafety.verification.property import robustness_property

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


class Affine(nn.Module):
    """x * scale + shift (normalisation, BatchNorm) as auto_LiRPA's Mul and Add."""

    def __init__(self, scale: torch.Tensor, shift: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale.float().clone().unsqueeze(0))
        self.register_buffer("shift", shift.float().clone().unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, *self.shape)


def plain_module(network: nn.Module, shape: tuple[int, ...], name: str) -> nn.Module:
    """The chain of ``network``'s bound graph as standard torch layers."""
    graph = build_graph(network, shape, name, dtype=torch.float32)
    layers: list[nn.Module] = []
    for index, op in enumerate(graph.ops[1:], 1):
        if op.inputs != [index - 1]:
            raise SystemExit(f"{name}: not a chain at {op.name!r}")
        if isinstance(op, ops.Elementwise) and not layers:
            continue  # the input normalisation: applied to the box instead (``normalised``)
        if isinstance(op, ops.Dense):
            layer = nn.Linear(op.weight.shape[1], op.weight.shape[0])
            layer.weight.data, layer.bias.data = op.weight.detach(), op.bias.detach()
        elif isinstance(op, ops.Conv):
            layer = nn.Conv2d(op.weight.shape[1] * op.groups, op.weight.shape[0],
                              op.weight.shape[2:], op.stride, op.padding, op.dilation,
                              op.groups)  # fmt: skip
            layer.weight.data, layer.bias.data = op.weight.detach(), op.bias.detach()
        elif isinstance(op, ops.Activation) and op.fn is torch.relu:
            layer = nn.ReLU()
        elif isinstance(op, ops.Elementwise):
            layer = Affine(op.scale, op.shift)
        elif isinstance(op, ops.Reshape):
            layer = Reshape(op.out_shape)
        else:
            raise SystemExit(f"{name}: op {op.kind} {op.name!r} is not in a plain chain")
        layers.append(layer)
    return torch.fx.symbolic_trace(nn.Sequential(*layers).eval())  # Affine: a mul and an add


def normalised(prop, network: nn.Module, shape, name: str):
    """``prop`` with its box through the network's leading elementwise ops (monotone)."""
    graph = build_graph(network, shape, name)
    for op in graph.ops[1:]:
        if not isinstance(op, ops.Elementwise):
            break
        lo, hi = op.interval((prop.lower, prop.upper))
        prop = type(prop)(lo, hi, prop.spec, prop.offset)
    return prop


def networks() -> list[tuple[str, nn.Module, tuple[int, ...], float]]:
    from aisafety.database.zoo import load_zoo_model
    from aisafety.prediction.onnx_model import load_onnx

    found = []
    for depth in (2, 4, 6):
        path = shared_data("vnncomp2021_mnistfc") / f"mnist-net_256x{depth}.onnx"
        predictor = load_onnx(path, gradients=True, input_shape=(1, 28, 28))
        found.append((f"256x{depth}", predictor.network.cpu(), (1, 28, 28), 0.03))
    predictor = load_zoo_model("sok-cnn-a-adv1")
    found.append(("sok-cnn-a-adv1", predictor.network.cpu(), predictor.input_shape, 0.1))
    return found


def float64_cases(x: torch.Tensor, y: torch.Tensor):
    """Per network of ``networks()``: its name, its float64 graph of ``plain_module`` and the
    robustness property of the images ``x`` (labels ``y``) at its eps, normalised."""
    for name, network, shape, eps in networks():
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        yield name, graph, prop.to(graph.dtype)


def ours(graph, prop, precision: str = "auto") -> tuple[float, torch.Tensor]:
    prop = prop.to(graph.dtype)
    verifier = CrownVerifier()
    start = time.process_time()
    with torch.no_grad(), reuse_freed_memory(), rounding.pass_precision(precision):
        bound, _ = verifier.lower_bounds(graph, prop)
    return time.process_time() - start, bound


def bounded_module(module: nn.Module, shape):
    from auto_LiRPA import BoundedModule

    return BoundedModule(module, torch.zeros(1, *shape), device="cpu", verbose=False)


def lirpa(bounded, prop) -> tuple[float, torch.Tensor]:
    from auto_LiRPA import BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    lower, upper = prop.lower.float(), prop.upper.float()
    start = time.process_time()
    x = BoundedTensor((lower + upper) / 2, PerturbationLpNorm(x_L=lower, x_U=upper))
    with torch.no_grad():
        bound, _ = bounded.compute_bounds(x=(x,), C=prop.spec.float(), method="CROWN",
                                          bound_upper=False)  # fmt: skip
    return time.process_time() - start, bound


def alpha_rows(args, data) -> None:
    """alpha-CROWN, ours against auto_LiRPA's, on Conv-Small (see the module docstring)."""
    from auto_LiRPA import BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    from aisafety.verification import bounds

    name, network, shape, eps = networks()[-1]
    module = plain_module(network, shape, name)
    graph = build_graph(module, shape, name, dtype=torch.float64)
    bounded = bounded_module(module, shape)
    bounded.set_bound_opts({"optimize_bound_args": {"iteration": 20, "lr_alpha": 0.1}})
    mine = theirs = 0.0
    looser = 0
    for first in range(args.skip, args.alpha, 10):
        x, y = data.x[first : first + 10], data.y[first : first + 10]
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop = normalised(prop, network, shape, name).to(torch.float64)
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory():
            crown = bounds.spec_lower(graph, bounds.linear_boxes(graph, prop.lower, prop.upper),
                                      prop.spec)[0]  # fmt: skip
            boxes = bounds.linear_boxes(graph, prop.lower, prop.upper, "adaptive", 20)
            alpha = bounds.optimise_slopes(graph, boxes, prop.spec, 20, 0.1)[0]
        mine += time.process_time() - start
        looser += int((alpha < crown).any(1).sum())
        lower, upper = prop.lower.float(), prop.upper.float()
        start = time.process_time()
        point = BoundedTensor((lower + upper) / 2, PerturbationLpNorm(x_L=lower, x_U=upper))
        their, _ = bounded.compute_bounds(x=(point,), C=prop.spec.float(), method="alpha-CROWN",
                                          bound_upper=False)  # fmt: skip
        theirs += time.process_time() - start
        print(f"images {first + len(y):>4}: ours {mine:7.1f} s, auto_LiRPA {theirs:7.1f} s; "
              f"certified ours {int((alpha > 0).all(1).sum())} theirs "
              f"{int((their > 0).all(1).sum())}; images with a row below our CROWN {looser}",
              flush=True)  # fmt: skip


def setting() -> str:
    """The CPU, the load and the auto_LiRPA commit, printed beside the numbers."""
    import os
    import platform
    import subprocess

    import auto_LiRPA

    cpu = platform.processor() or "?"
    for line in (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    ):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    source = Path(auto_LiRPA.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"  # fmt: skip
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"CPU {cpu}; load {load}; torch {torch.__version__}; auto_LiRPA {commit}"


def unmargined(graph, prop) -> torch.Tensor:
    """Our float32 CROWN with every op's rounding margin left out (unsound, for this
    comparison only): what is left of the gap to auto_LiRPA is not the margins."""
    exact_shift = rounding.exact_shift

    def no_margin(*args):
        shift, error = exact_shift(*args)
        return shift, error * 0

    rounding.exact_shift = no_margin
    try:
        return ours(graph, prop)[1]
    finally:
        rounding.exact_shift = exact_shift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--alpha", type=int, default=0, help="alpha-CROWN on N images")
    parser.add_argument("--skip", type=int, default=0, help="with --alpha: start at image K")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from aisafety.database.datasets.embedded import EmbeddedMnist

    data = EmbeddedMnist().load(None, "test")
    if args.alpha:
        print(setting())
        alpha_rows(args, data)
        return print(setting())
    x, y = data.x[: args.images], data.y[: args.images]
    print(setting())
    print(f"{'network':<16} {'ours/lirpa':>11} {'f64 passes/lirpa':>17} {'lirpa s':>8} "
          f"{'lirpa tighter by':>17} {'lirpa over exact':>17} {'beyond that':>12} "
          f"{'f64 tighter by':>15} {'lirpa over no-margin':>21}")  # fmt: skip
    for name, network, shape, eps in networks():
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        bounded = bounded_module(module, shape)
        ratios: dict[str, list[float]] = {"auto": [], "float64": []}
        theirs: list[float] = []
        gap, loss = -float("inf"), -float("inf")
        for r in range(args.repeats):
            for precision in ratios:
                if r % 2:
                    (mine, bound), (their, their_bound) = (
                        ours(graph, prop, precision),
                        lirpa(bounded, prop),
                    )
                else:
                    (their, their_bound), (mine, bound) = (
                        lirpa(bounded, prop),
                        ours(graph, prop, precision),
                    )
                ratios[precision].append(mine / their)
                theirs.append(their)
                if precision == "auto":  # the bound we ship
                    gap = max(gap, float((their_bound.double() - bound).max()))
                    shipped = bound
                else:
                    loss = max(loss, float((bound - shipped).max()))
                    exact = bound
        fast, wide = (statistics.median(ratios[p]) for p in ("auto", "float64"))
        bare = float((their_bound.double() - unmargined(graph, prop)).max())
        their_bound = their_bound.double()
        own = float((their_bound - exact).max())  # auto_LiRPA's float32 rounding, upwards
        beyond = float((torch.minimum(their_bound, exact) - shipped).max())
        print(f"{name:<16} {fast:>10.2f}x {wide:>16.2f}x {statistics.median(theirs):>8.3f} "
              f"{gap:>17.2e} {own:>17.2e} {beyond:>12.2e} {loss:>15.2e} {bare:>21.2e}",
              flush=True)  # fmt: skip
    print(setting())


if __name__ == "__main__":
    main()
