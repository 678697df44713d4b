"""CROWN's CPU time against auto_LiRPA's on residual CIFAR networks, paired, one thread.

    /work/venv-lirpa/bin/python bench/resnet_crown_speed.py [--images 2] [--repeats 5]
                                [--nets resnet_2b resnet_4b small-resnet small-resnet-16]
                                [--eps 1 2]

bench/bound_speed.py does this for chains (MNIST MLPs, Conv-Small); these nets have
residual additions. Networks: the VNN-COMP 2021 ``resnet_2b`` and ``resnet_4b`` (ours as
``aisafety`` loads the ONNX file, the benchmark's mean/std in the graph; auto_LiRPA on
``bench/resnet_crown_lirpa.py``'s torch rebuild, checked against onnxruntime, with the box
normalised outside) and the benches' random-weight ``small-resnet`` (``testkit/shapes.py``,
width 8, and width 16 as ``small-resnet-16``: the same module for both). The box is
``[x - eps, x + eps]`` clipped to [0, 1] on the first ``--images`` shipped CIFAR-10 test
images, eps in 1/255; the spec the margin rows ``f_y - f_j``.

Per net and eps: the paired median of our time over auto_LiRPA's (``compute_bounds(method=
"backward")``, no upper bound) over ``--repeats`` interleaved runs, the order alternating;
both medians; and the largest amount auto_LiRPA's lower bound is above ours and below ours
over every row. auto_LiRPA has no rounding margin: its bound may sit above the exact bound
of the relaxation by its own float32 rounding, which no sound bound can match. ``--profile``
runs ours once more under cProfile (process time) and prints the top functions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches beside this one
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "testkit"))  # shapes
from bound_speed import setting  # noqa: E402
from resnet_crown_lirpa import MEAN, STD, OnnxResNet, cifar_images, resnet_folder  # noqa: E402
from shapes import small_resnet  # noqa: E402

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification.graph import BoundGraph, build_graph  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402
from aisafety.verification.property import Property, robustness_property  # noqa: E402

RANDOM = {"small-resnet": 8, "small-resnet-16": 16}


def nets(name: str) -> tuple[BoundGraph, torch.nn.Module, bool]:
    """Our bound graph, auto_LiRPA's module, and whether the box is normalised for it."""
    if name in RANDOM:
        torch.manual_seed(0)
        module = small_resnet(width=RANDOM[name]).eval()
        return build_graph(module, (3, 32, 32), name), module, False
    from aisafety.prediction.onnx_model import load_onnx

    predictor = load_onnx(
        resnet_folder() / f"{name}.onnx", gradients=True, mean=MEAN, std=STD, name=name
    )
    graph = build_graph(predictor.network, predictor.input_shape, name)
    return graph, OnnxResNet(resnet_folder() / f"{name}.onnx").eval(), True


def ours(graph: BoundGraph, prop: Property) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    with torch.no_grad(), reuse_freed_memory():
        bound, _ = CrownVerifier().lower_bounds(graph, prop.to(graph.dtype))
    return time.process_time() - start, bound.double()


@contextmanager
def old_crop_rule(graph: BoundGraph) -> Iterator[None]:
    """CROWN before session 12's crop rule (``--before``: the new/old ratio): crops only
    where the receptive field is at most half the input, flat unless a convolution's dense
    matrix is over ``receptive.LARGEST`` (no ``SPATIAL_RATIO``); its own crop cache."""
    from aisafety.verification import receptive

    saved = receptive.SHARE, receptive.SPATIAL_RATIO, graph.__dict__.pop("_crops", None)
    receptive.SHARE, receptive.SPATIAL_RATIO = 0.5, float("inf")
    graph.__dict__["_crops"] = graph.__dict__.pop("_old_crops", {})
    try:
        yield
    finally:
        graph.__dict__["_old_crops"] = graph.__dict__.pop("_crops")
        receptive.SHARE, receptive.SPATIAL_RATIO = saved[:2]
        if saved[2] is not None:
            graph.__dict__["_crops"] = saved[2]


def lirpa(bounded, prop: Property, normalise: bool) -> tuple[float, torch.Tensor]:
    from auto_LiRPA import BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    lower, upper = prop.lower.float(), prop.upper.float()
    if normalise:
        mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
        lower, upper = (lower - mean) / std, (upper - mean) / std
    start = time.process_time()
    x = BoundedTensor((lower + upper) / 2, PerturbationLpNorm(x_L=lower, x_U=upper))
    with torch.no_grad():
        bound, _ = bounded.compute_bounds(x=(x,), C=prop.spec.float(), method="backward",
                                          bound_upper=False)  # fmt: skip
    return time.process_time() - start, bound.double()


def row(name: str, eps: float, args, x: torch.Tensor, y: torch.Tensor) -> None:
    from auto_LiRPA import BoundedModule

    graph, module, normalise = nets(name)
    bounded = BoundedModule(module, torch.zeros(1, 3, 32, 32), device="cpu", verbose=False)
    prop = robustness_property(x, y, eps / 255, 10)
    ours(graph, prop)  # first-call costs (lazy imports, caches) outside the pairs
    mine, theirs, ratios = [], [], []
    for r in range(args.repeats):
        if r % 2:
            (a, bound), (b, their) = ours(graph, prop), lirpa(bounded, prop, normalise)
        else:
            (b, their), (a, bound) = lirpa(bounded, prop, normalise), ours(graph, prop)
        mine.append(a)
        theirs.append(b)
        ratios.append(a / b)
    above, below = float((their - bound).max()), float((bound - their).max())
    print(f"{name:<16} {eps:>3g}/255 {statistics.median(ratios):>9.2f}x "
          f"{statistics.median(mine):>8.2f} {statistics.median(theirs):>8.2f} "
          f"{above:>12.2e} {below:>12.2e}", flush=True)  # fmt: skip
    if args.before:
        before(graph, prop, args.repeats)
    if args.profile:
        profile(graph, prop)


def before(graph: BoundGraph, prop: Property, repeats: int) -> None:
    """Our time now over before ``old_crop_rule``'s change, paired and interleaved, and
    how the bounds moved (by rounding margins: a crop sums fewer terms than a dense pass)."""
    with old_crop_rule(graph):
        ours(graph, prop)  # its crops built outside the pairs, as the new rule's in ``row``
    ratios = []
    for r in range(repeats):
        if r % 2:
            new, bound = ours(graph, prop)
        with old_crop_rule(graph):
            old, was = ours(graph, prop)
        if not r % 2:
            new, bound = ours(graph, prop)
        ratios.append(new / old)
    same = torch.equal(bound, was)
    print(
        f"{'':<16} new/old {statistics.median(ratios):.2f}x, bounds equal {same}, "
        f"old above new by at most {float((was - bound).max()):.2e}",
        flush=True,
    )


def profile(graph: BoundGraph, prop: Property) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.process_time)
    profiler.runcall(ours, graph, prop)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nets", nargs="*", default=["resnet_2b", "resnet_4b", "small-resnet"])
    parser.add_argument("--eps", type=float, nargs="*", default=[1.0, 2.0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--before", action="store_true", help="also new/old (old_crop_rule)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y = cifar_images(list(range(args.images)))
    print(setting())
    print(f"{'network':<16} {'eps':>7} {'ours/lirpa':>10} {'ours s':>8} {'lirpa s':>8} "
          f"{'lirpa above':>12} {'lirpa below':>12}")  # fmt: skip
    for name in args.nets:
        for eps in args.eps:
            row(name, eps, args, x, y)
    print(setting())


if __name__ == "__main__":
    main()
