"""Does an image's CROWN / alpha-CROWN bound depend on its batch, and what does the fix cost?

    OMP_NUM_THREADS=1 nice -n 5 python bench/batch_precision.py resnet_4b --eps 1 \
        --images 1 73 90 97 [--verifier crown|alpha-crown] [--pairs 3 --old ../main]

Bounds the VNN-COMP CIFAR ResNet's images (the shipped ERAN CIFAR subset) as one batch and
each alone, and prints each image's margin (its worst spec row's bound plus offset) both
ways and the largest difference of any row. With ``--old PATH`` it runs this in fresh
processes (one thread each), the batch only, alternately with this checkout's code and with
PATH's (another commit's checkout on ``PYTHONPATH``), the order reversed every other pair,
and prints the paired median of new/old CPU time: the cost of choosing a pass's precision
per image (#32, docs/certification.md) instead of per batch. No wall clock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # resnet_crown_lirpa, beside this

from bab_speed import cpu_model  # noqa: E402
from resnet_crown_lirpa import MEAN, STD, cifar_images, resnet_folder  # noqa: E402

from aisafety.prediction.onnx_model import load_onnx  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402


def bound(verifier: str, graph, prop) -> torch.Tensor:
    """The verifier's bound (B, K) of ``prop``, as ``verify`` computes it (no attack)."""
    if verifier == "crown":
        with torch.no_grad():
            return CrownVerifier().lower_bounds(graph, prop)[0]
    return AlphaCrownVerifier().bounds_and_boxes(graph, prop).bound


def one(args) -> dict:
    """This process's measurement: the batch's CPU seconds and margins (and alone's)."""
    torch.set_num_threads(1)
    path = resnet_folder() / f"{args.net}.onnx"
    net = load_onnx(path, gradients=True, mean=MEAN, std=STD, name=args.net)
    x, y = cifar_images(args.images)
    graph = build_graph(net.network, net.input_shape, args.net)
    prop = robustness_property(x, y, args.eps / 255, 10).to(graph.dtype)
    began = time.process_time()
    batched = bound(args.verifier, graph, prop)
    out = {"cpu": time.process_time() - began, "batch": margins(batched, prop)}
    if not args.batch_only:
        alone = torch.cat([bound(args.verifier, graph, prop[[i]]) for i in range(len(prop))])
        out["alone"] = margins(alone, prop)
        out["diff"] = float((batched - alone).abs().max())
    return out


def margins(bounds: torch.Tensor, prop) -> list[float]:
    return (bounds + prop.offset).amin(1).tolist()


def paired(args) -> None:
    """Fresh processes, this checkout's code against ``--old``'s, interleaved."""
    here = str(Path(__file__).resolve().parents[1])
    images = [str(i) for i in args.images]
    command = [sys.executable, __file__, "--one", "--batch-only", args.net, "--eps",
               str(args.eps), "--verifier", args.verifier, "--images", *images]  # fmt: skip
    run = lambda root: json.loads(  # noqa: E731
        subprocess.run(command, env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"},
                       check=True, capture_output=True, text=True).stdout.splitlines()[-1]
    )  # fmt: skip
    times = {"new": [], "old": []}
    for i in range(args.pairs):
        for way in ("new", "old")[:: 1 if i % 2 == 0 else -1]:
            result = run(here if way == "new" else args.old)
            times[way].append(result["cpu"])
            print(f"pair {i} {way}: {result['cpu']:.1f} CPU s, margins "
                  f"{' '.join(f'{m:+.4f}' for m in result['batch'])}", flush=True)  # fmt: skip
    ratios = [n / o for n, o in zip(times["new"], times["old"], strict=True)]
    print(f"{args.net} {args.verifier} images {args.images} eps {args.eps:g}/255: new/old "
          f"CPU {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); "
          f"{cpu_model()}, one thread, load {os.getloadavg()[0]:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net", choices=["resnet_2b", "resnet_4b"])
    parser.add_argument("--eps", type=float, default=1.0, help="in 1/255 pixel units")
    parser.add_argument("--images", type=int, nargs="+", default=[1, 73, 90, 97])
    parser.add_argument("--verifier", choices=["crown", "alpha-crown"], default="alpha-crown")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--old", help="another checkout to time against (paired)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch-only", action="store_true", help="no image alone")
    args = parser.parse_args()
    if args.old and not args.one:
        paired(args)
        return
    result = one(args)
    if args.one:
        print(json.dumps(result))
        return
    print(f"{args.net} {args.verifier} eps {args.eps:g}/255; {cpu_model()}, one thread")
    for i, image in enumerate(args.images):
        print(f"image {image}: batch {result['batch'][i]:+.6f}, alone {result['alone'][i]:+.6f}")
    print(f"largest difference of a row, batch vs alone: {result['diff']:.3g}")


if __name__ == "__main__":
    main()
