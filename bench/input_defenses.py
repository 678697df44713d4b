"""Input-defense speed: batched tensor code against a per-image loop, in one run.

    python bench/input_defenses.py [--batch 256] [--repeats 3] [--threads 1]

Prints images/s and the ratio for:

1. JPEG round trip (quality 75) on MNIST (gray) and on 32 x 32 colour images: our batched
   block-DCT codec against Pillow's encoder/decoder called image by image (what a
   PIL-loop defense does). Target: ratio >= 1 (the codec must not be the bottleneck of an
   attack that calls it on every step); it also runs on a GPU, which Pillow cannot.
2. Median filter (2x2) and random resize-and-pad: our batched code against the same
   operation done image by image (scipy.ndimage.median_filter; F.interpolate + F.pad).

Every time is the best of ``--repeats`` runs after a warm-up (the machine is shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import scipy.ndimage as ndimage
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))

from pillow_jpeg import pillow_round_trip  # noqa: E402

from aisafety.database.datasets.embedded import EmbeddedMnist  # noqa: E402
from aisafety.defense.jpeg_codec import jpeg_round_trip
from aisafety.defense.median_filter import MedianFilter
from aisafety.defense.resize_pad import RandomResizePad
from aisafety.prediction.torch_module import TorchPredictor


def best_time(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def resize_pad_loop(defense: RandomResizePad, x: torch.Tensor) -> torch.Tensor:
    n, _, height, width = x.shape
    canvas = (round(height * defense.config.canvas_scale),) * 2
    sizes, tops, lefts = defense.draw(n, (height, width), canvas)
    out = []
    for i in range(n):
        rows, cols = sizes[i].tolist()
        image = F.interpolate(x[i : i + 1], size=(rows, cols), mode="nearest-exact")
        top, left = int(tops[i]), int(lefts[i])
        image = F.pad(image, (left, canvas[1] - left - cols, top, canvas[0] - top - rows))
        out.append(F.interpolate(image, size=(height, width), mode="bilinear", antialias=True))
    return torch.cat(out)


def report(label: str, ours: float, loop: float, n: int) -> None:
    print(f"{label:<34} ours {n / ours:>9.0f} img/s   loop {n / loop:>9.0f} img/s   "
          f"ratio {loop / ours:5.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gray = EmbeddedMnist().load(None, "test").x[: args.batch]
    coarse = torch.rand(args.batch, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    colour = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    n = len(gray)
    for label, x in (("JPEG q75, MNIST 28x28 gray", gray), ("JPEG q75, 32x32 colour", colour)):
        ours = best_time(lambda x=x: jpeg_round_trip(x, 75), args.repeats)
        loop = best_time(lambda x=x: pillow_round_trip(x, 75), args.repeats)
        report(label, ours, loop, n)
    model = TorchPredictor(torch.nn.Flatten(), (1, 28, 28), 784, name="identity")
    median = MedianFilter(model, {"size": 2})
    ours = best_time(lambda: median.transform(gray), args.repeats)
    loop = best_time(
        lambda: [ndimage.median_filter(im, size=2) for im in gray[:, 0].numpy()], args.repeats
    )
    report("median 2x2 vs scipy per image", ours, loop, n)
    resize = RandomResizePad(model, {"canvas_scale": 1.25})
    ours = best_time(lambda: resize.transform(gray), args.repeats)
    loop = best_time(lambda: resize_pad_loop(resize, gray), args.repeats)
    report("resize-pad vs per-image loop", ours, loop, n)


if __name__ == "__main__":
    main()
