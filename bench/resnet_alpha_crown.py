"""alpha-CROWN beside CROWN on a VNN-COMP 2021 CIFAR ResNet, image by image, as it goes.

    python bench/resnet_alpha_crown.py resnet_4b --eps 1 [--images 100] [--search-work W]
                                       [--only I ...]

The 100 shipped CIFAR-10 images and boxes of ``tests/test_vnncomp_resnets.py`` (x/255, eps
in pixel space, the benchmark's normalisation in the net), read as ``bench/resnet_crown_lirpa.py``
reads them (a bench does not import tests). CROWN bounds them all first
(batches of 20); alpha-CROWN (``alpha-crown`` with its box-PGD first, one image at a time)
then runs on the correctly classified images CROWN leaves open, those with the margin
nearest 0 first, then on CROWN's certified ones; each image's line (CROWN's and
alpha-CROWN's margin bounds, verdict, CPU s) is printed as it ends, so a run cut short
still says what it measured. Every image alpha-CROWN certifies beyond CROWN is attacked by
``standard`` at the end. ``--only``: these images alone (indices of the 100). Run one
thread (OMP_NUM_THREADS=1); say the load beside it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # resnet_crown_lirpa, beside this

from resnet_crown_lirpa import MEAN, STD, cifar_images, resnet_folder  # noqa: E402

from aisafety.plugins import default_registry  # noqa: E402
from aisafety.prediction.onnx_model import load_onnx  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402


def vnncomp_resnet(name: str):
    """The ONNX net with its external normalisation, as a gradient predictor (as
    tests/test_vnncomp_resnets.py loads it)."""
    return load_onnx(
        resnet_folder() / f"{name}.onnx", gradients=True, mean=MEAN, std=STD, name=name
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net", choices=["resnet_2b", "resnet_4b"])
    parser.add_argument("--eps", type=float, default=1.0, help="in 1/255 pixel units")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--search-work", type=float, help="alpha-crown's search_work")
    parser.add_argument("--only", type=int, nargs="*", help="these image indices alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    predictor = vnncomp_resnet(args.net)
    x, y = cifar_images(list(range(args.images)))
    names = torch.tensor(args.only) if args.only else torch.arange(len(x))
    x, y = x[names], y[names]
    graph = build_graph(predictor.network, predictor.input_shape, args.net)
    prop = robustness_property(x, y, args.eps / 255, 10)
    config = {"batch_size": 20, "clock": "cpu"}
    began = time.process_time()
    crown = CrownVerifier(config).verify(graph, prop, predictor.logits)
    correct = predictor.logits(x).argmax(1) == y
    print(f"{args.net} eps {args.eps:g}/255: CROWN certified {int(crown.certified.sum())} "
          f"{names[crown.certified].tolist()} in {time.process_time() - began:.0f} "
          f"CPU s; {int(correct.sum())} correct", flush=True)  # fmt: skip
    open_ = (correct & ~crown.certified).nonzero().flatten()
    order = open_[crown.margins[open_].abs().argsort()].tolist()
    order += crown.certified.nonzero().flatten().tolist()
    alpha = AlphaCrownVerifier(
        config if args.search_work is None else {**config, "search_work": args.search_work}
    )
    gained = []
    for i in order:
        began = time.process_time()
        result = alpha.verify(graph, prop[i : i + 1], predictor.logits)
        margin, crown_margin = float(result.margins[0]), float(crown.margins[i])
        if bool(result.certified[0]) and not bool(crown.certified[i]):
            gained.append(int(names[i]))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
        print(f"image {int(names[i]):3d} CROWN {crown_margin:9.4f} alpha-CROWN {margin:9.4f} "
              f"{result.verdicts[0].value:<10} {time.process_time() - began:5.1f} CPU s "
              f"peak {peak:.2f} GiB{'  BELOW CROWN' if margin < crown_margin - 1e-5 else ''}",
              flush=True)  # fmt: skip
    print(f"alpha-CROWN certified beyond CROWN: {gained}", flush=True)
    if gained:
        attack = default_registry().create("attack", "standard", {})
        index = torch.tensor(gained)
        x, y = cifar_images(list(range(args.images)))
        broken = attack(predictor, x[index], y[index], args.eps / 255).success
        print(f"standard breaks {index[broken].tolist()} of them", flush=True)


if __name__ == "__main__":
    main()
