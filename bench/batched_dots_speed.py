"""CROWN with the rounding margins' batched float64 sums against one product per sample.

    /work/venv-lirpa/bin/python bench/batched_dots_speed.py [--repeats 5]
        [--nets small-resnet resnet_2b resnet_4b 256x2 256x4 256x6 sok-cnn-a-adv1]

``rounding.dots`` sends a sample's rows below ``BATCHED_ROWS`` elements (cropped passes:
thousands of (image, position) samples with a few short rows) through ``bmm`` over chunks
of samples; ``BATCHED_ROWS = 0`` is the code before (a Python loop over the samples, one
row per sample batched as before). Per net and eps: the paired median of new/old CPU time
(interleaved, the order alternating, one thread) and how far the two bounds differ (the
sums run in another order). Nets and images as ``resnet_crown_speed.py`` (2 CIFAR images,
eps 1 and 2 /255) and ``bound_speed.py`` (8 MNIST images, its eps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches beside this one
import bound_speed  # noqa: E402
import resnet_crown_speed  # noqa: E402

from aisafety.verification import rounding  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402


@contextmanager
def looped(on: bool):
    """The code before when ``on``: every sample with several rows its own product."""
    kept = rounding.BATCHED_ROWS
    rounding.BATCHED_ROWS = 0 if on else kept
    try:
        yield
    finally:
        rounding.BATCHED_ROWS = kept


def timed(graph, prop, old: bool) -> tuple[float, torch.Tensor]:
    with looped(old):
        return resnet_crown_speed.ours(graph, prop)


def pair(name: str, graph, prop, repeats: int) -> None:
    timed(graph, prop, False)  # first-call costs outside the pairs
    ratios, news = [], []
    for r in range(repeats):
        if r % 2:
            (new, bound), (old, was) = timed(graph, prop, False), timed(graph, prop, True)
        else:
            (old, was), (new, bound) = timed(graph, prop, True), timed(graph, prop, False)
        ratios.append(new / old)
        news.append(new)
    moved = float((bound - was).abs().max())
    print(f"{name:<24} {statistics.median(ratios):>8.3f}x {statistics.median(news):>8.2f} "
          f"{moved:>10.2e} {bool(torch.equal(bound, was))!s:>6}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nets", nargs="*", default=["small-resnet", "resnet_2b", "resnet_4b",
                        "256x2", "256x4", "256x6", "sok-cnn-a-adv1"])  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(bound_speed.setting())
    print(f"{'network':<24} {'new/old':>9} {'new s':>8} {'bound moved':>10} {'equal':>6}")
    x, y = resnet_crown_speed.cifar_images([0, 1])
    for name in [n for n in args.nets if n in {"small-resnet", "resnet_2b", "resnet_4b"}]:
        graph = resnet_crown_speed.nets(name)[0]
        for eps in (1.0, 2.0):
            pair(f"{name} {eps:g}/255", graph, robustness_property(x, y, eps / 255, 10),
                 args.repeats)  # fmt: skip
    from aisafety.database.datasets.embedded import EmbeddedMnist

    data = EmbeddedMnist().load(None, "test")
    for name, network, shape, eps in bound_speed.networks():
        if name not in args.nets:
            continue
        prop = robustness_property(data.x[:8].reshape(-1, *shape), data.y[:8], eps, 10)
        prop = bound_speed.normalised(prop, network, shape, name)
        module = bound_speed.plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        pair(name, graph, prop, args.repeats)
    print(bound_speed.setting())


if __name__ == "__main__":
    main()
