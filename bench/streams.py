"""The cost of per-sample random streams against one generator shared by the batch.

    python bench/streams.py [--images 256] [--chunk 128] [--pairs 5] [--threads N]
                            [--attacks square-linf random-noise nattack pgd-linf]

Runs the built-in attacks that draw the most often (Square-linf: a few numbers per sample
and query; random noise: an image per sample and draw; NAttack: a population of noise images
per sample and iteration; PGD-l-inf: one random start) on the zoo ``mnist-cnn`` and the
embedded MNIST test images, once with the per-sample streams (``aisafety.attack.streams``)
and once with a stand-in that serves every draw from one shared generator (what the attacks
did before), interleaved, and prints the paired median of time(streams) / time(shared).
The numbers differ between the two (other draws); the work is the same.
Target: ratio <= 1.10 for every attack.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch

from aisafety.attack import base
from aisafety.attack.streams import SampleStreams
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.plugins import default_registry

ATTACKS = {
    "square-linf": ({"queries": 300}, 0.1),
    "random-noise": ({"draws": 10}, 0.1),
    "nattack": ({"iterations": 10, "population": 100}, 0.1),
    "pgd-linf": ({"steps": 10}, 0.1),
}


class SharedStreams(SampleStreams):
    """The streams' interface over one generator for the whole batch (the old behaviour)."""

    def __init__(self, seed: int, samples, device, n: int | None = None):
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._device = torch.device(device)
        self._n = len(samples) if n is None else n

    def __len__(self) -> int:
        return self._n

    @property
    def device(self) -> torch.device:
        return self._device

    def __getitem__(self, rows):
        view = SharedStreams.__new__(SharedStreams)
        view.generator, view._device = self.generator, self._device
        view._n = int(rows.sum()) if rows.dtype == torch.bool else len(rows)
        return view

    def _draw(self, kind: str, shape: Sequence[int]) -> torch.Tensor:
        draw = torch.rand if kind == "rand" else torch.randn
        return draw(tuple(shape), generator=self.generator, device=self._device)


def timed(attack, predictor, x, y, eps: float, chunk: int) -> float:
    started = time.perf_counter()
    attack(predictor, x, y, eps, chunk_size=chunk)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    predictor = load_zoo_model("mnist-cnn")
    data = EmbeddedMnist().load(None, "test").balanced_subset(args.images, seed=0)
    registry = default_registry()
    print(f"{args.images} images, chunks of {args.chunk}, {torch.get_num_threads()} threads")
    print(f"{'attack':<14} {'streams s':>10} {'shared s':>10} {'ratio (paired median)':>22}")
    for name in args.attacks:
        config, eps = ATTACKS[name]
        attack = registry.create("attack", name, config)
        timed(attack, predictor, data.x, data.y, eps, args.chunk)  # warm-up
        ratios, ours, theirs = [], [], []
        for _ in range(args.pairs):
            base.SampleStreams = SampleStreams
            a = timed(attack, predictor, data.x, data.y, eps, args.chunk)
            base.SampleStreams = SharedStreams
            b = timed(attack, predictor, data.x, data.y, eps, args.chunk)
            base.SampleStreams = SampleStreams
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
        print(
            f"{name:<14} {min(ours):>10.3f} {min(theirs):>10.3f} {statistics.median(ratios):>22.3f}"
        )


if __name__ == "__main__":
    main()
