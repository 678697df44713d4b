"""How closely our corruptions follow the reference code: the tables of docs/corruptions.md.

    python bench/corruption_fidelity.py [--table cifar10-c] [--images 100] [--mnist 1000]

For every corruption and severity of one severity table, prints
- the mean absolute change from the clean image, ours / the reference's, on the first CIFAR-10
  test images (shared/data/eran_test_subsets), at 32 px for ``cifar10-c`` and upsampled
  (bilinear) to 224 px for ``imagenet-c``;
- the ``mnist-cnn`` zoo model's error on the embedded MNIST test images, ours vs the
  reference's (MNIST as three equal channels through the reference, its luma back).
The reference is ``testkit/corruption_reference.py`` (the hendrycks/robustness functions; needs
the ``test`` extra's OpenCV and, for motion blur and snow, ImageMagick's MagickWand library).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))

import corruption_reference as ref  # noqa: E402
from shared_location import shared_data  # noqa: E402

from aisafety.corruption import CORRUPTIONS, corrupt  # noqa: E402
from aisafety.database.datasets.embedded import EmbeddedMnist  # noqa: E402
from aisafety.database.zoo import load_zoo_model  # noqa: E402

LUMA = np.array([0.299, 0.587, 0.114])


def cifar_images(n: int, size: int) -> np.ndarray:
    """The first ``n`` CIFAR-10 test images, uint8 (n, size, size, 3)."""
    path = shared_data("eran_test_subsets") / "cifar10_test.csv"
    rows = np.loadtxt(path, delimiter=",", dtype=np.int64, max_rows=n)
    images = rows[:, 1:].reshape(n, 32, 32, 3).astype(np.uint8)
    if size == 32:
        return images
    x = torch.from_numpy(images).permute(0, 3, 1, 2).double()
    big = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return big.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def ours(name: str, images: np.ndarray, severity: int, table: str, seed: int = 0) -> np.ndarray:
    x = torch.from_numpy(images).permute(0, 3, 1, 2).double() / 255
    out = corrupt(x, name, severity, seed=seed, table=table)
    return out.permute(0, 2, 3, 1).numpy() * 255


def mean_change(out: np.ndarray, clean: np.ndarray) -> float:
    return float(np.abs(out - clean.astype(np.float64)).mean())


def mnist_errors(name: str, table: str, predictor, x: torch.Tensor, y: torch.Tensor):
    """mnist-cnn error per severity, ours and the reference's."""
    grey = (x[:, 0].numpy() * 255).round().astype(np.uint8)
    rgb = np.repeat(grey[..., None], 3, axis=-1)
    errors = []
    for severity in range(1, 6):
        mine = corrupt(x, name, severity, seed=0, table=table)
        theirs = np.uint8(ref.reference(name, rgb, severity, table, seed=0))
        theirs = torch.from_numpy((theirs @ LUMA) / 255)[:, None].float()
        err = [float((predictor.predict(v) != y).double().mean()) for v in (mine, theirs)]
        errors.append(tuple(err))
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="cifar10-c", choices=sorted(ref.TABLES))
    parser.add_argument("--images", type=int, default=100, help="CIFAR-10 images")
    parser.add_argument("--mnist", type=int, default=1000, help="MNIST images (0: skip)")
    parser.add_argument("--names", nargs="*", default=list(CORRUPTIONS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    size = ref.TABLES[args.table]["_size"]
    images = cifar_images(args.images, size)
    if args.mnist:
        data = EmbeddedMnist().load(None, "test")
        x, y = data.x[: args.mnist], data.y[: args.mnist]
        predictor = load_zoo_model("mnist-cnn")
    print(f"table {args.table}: {len(images)} CIFAR-10 images at {size} px", flush=True)
    print("| corruption | mean change ours / reference, s1..s5 | mnist-cnn error % ours / ref |")
    print("|---|---|---|")
    for name in args.names:
        if name in ref.NEEDS_WAND and not ref.HAVE_WAND:
            print(f"| {name} | (no MagickWand) | |")
            continue
        ratios = []
        for severity in range(1, 6):
            a = mean_change(ours(name, images, severity, args.table), images)
            b = mean_change(ref.reference(name, images, severity, args.table), images)
            ratios.append(f"{a:.3f}/{b:.3f}")
        errors = ""
        if args.mnist:
            pairs = mnist_errors(name, args.table, predictor, x, y)
            errors = " ".join(f"{100 * m:.1f}/{100 * r:.1f}" for m, r in pairs)
        print(f"| {name} | {' '.join(ratios)} | {errors} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
