"""`aisafety verify`'s input-space check on every VNN-COMP property of ../shared/data, and on
the mistakes it is there for.

    python bench/input_space.py

Checks (``input_space.check_box`` and ``check_centre_class``, with onnxruntime's logits at
the box's centre; no verifier runs) each of the 306 instances (mnistfc 90,
eran 72, CIFAR-10 ResNets 72, Marabou 72) as the benchmark pairs them, once with nothing
declared (the graph's own normalisation and the channel order are all it goes by) and once
with the convention ../shared/data/README.md gives for the network (``--scale 1``, or the
ResNets' ``--mean``/``--std``): every one must pass without a refusal or a warning. Then
the mistakes, each counted as refused / warned / passed:

- the CIFAR-10 boxes against the networks of the other layout (ResNet boxes, NCHW and
  normalised, against the three Marabou nets, NHWC [0, 1], and the reverse);
- every MNIST box normalised with MNIST's mean and std, or in 0..255 units, against the
  MNIST nets ([0, 1]);
- every MNIST and Marabou box with its eps in 0..255 units (half-width x 255);
- every Marabou box against the ResNets (targeted properties: no class to check), and every
  ResNet box taken back to [0, 1] pixels (x * std + mean) against them: [0, 1] pixels against
  normalised inputs.

Each mistake is counted with nothing declared and with the network's convention declared;
a warning is named by its kind (layout: the other channel order; class: the network's class
at the centre is not the property's; pixels: a box centred in [0, 1] against a wider range;
width: a box wider than its centres' spread).
"""

from __future__ import annotations

import csv
import math
import sys
import time
import warnings
from collections import Counter
from functools import cache, partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402
from vnncomp_cifar10 import instances  # noqa: E402

from aisafety.verification.graph import VerificationError  # noqa: E402
from aisafety.verification.input_space import (  # noqa: E402
    check_box,
    check_centre_class,
    declared_range,
    graph_range,
)
from aisafety.verification.vnnlib import read_disjuncts  # noqa: E402

RESNET = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2471, 0.2435, 0.2616]}
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
MEAN, SPREAD = (torch.tensor(RESNET[k], dtype=torch.float64).repeat_interleave(1024)
                for k in ("mean", "std"))  # per input of a (3, 32, 32) image  # fmt: skip


def pairs() -> list[tuple[Path, Path]]:
    """(network, property) of every instance the benchmarks' CSV files list."""
    found = [(net, spec) for net, spec, _ in instances(shared_data("cifar10-models"))]
    for name, table in (("vnncomp2021_eran", "eran_instances.csv"),
                        ("vnncomp2021_mnistfc", "mnistfc_instances.csv")):  # fmt: skip
        folder = shared_data(name)
        with (folder / table).open() as f:
            found += [(folder / r[0], folder / r[1]) for r in csv.reader(f) if r]
    return found


def graph_shape(network: Path) -> list:
    import onnx

    dims = onnx.load(str(network), load_external_data=False).graph.input[0]
    return [d.dim_value or d.dim_param for d in dims.type.tensor_type.shape.dim]


def declared(network: Path) -> dict:
    """The network's convention as ../shared/data/README.md states it."""
    return RESNET if network.name.startswith("resnet") else {"scale": 1.0}


BOXES: dict[Path, tuple[torch.Tensor, torch.Tensor]] = {}
DISJUNCTS: dict[str, list] = {}  # by the property's file name


def box(spec: Path, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if spec not in BOXES:
        BOXES[spec], DISJUNCTS[spec.name] = read_disjuncts(spec, n, 10)
    return BOXES[spec]


@cache
def session(network: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(network), providers=["CPUExecutionProvider"])


def logits(network: Path, x: torch.Tensor) -> torch.Tensor:
    """onnxruntime's logits on one input in the network's own layout."""
    graph_input = session(network).get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in graph_input.shape]
    feed = {graph_input.name: x.float().numpy().reshape(shape)}
    return torch.from_numpy(session(network).run(None, feed)[0]).reshape(1, -1)


KINDS = {"neighbouring rows": "layout", "gives class": "class", "centred in [0, 1]": "pixels",
         "half-width": "width"}  # fmt: skip


def outcome(network: Path, lower, upper, name: str, declare: dict | None) -> str:
    """refused / warned (which warnings) / passed, as `aisafety verify` answers before any
    bound."""
    shape = graph_shape(network)
    n = math.prod(d for d in shape[1:] if isinstance(d, int) and d > 0)
    known = declared_range(shape, n, **(declare or {})) or graph_range(network, n)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_box(lower, upper, known, name, shape)
        except VerificationError:
            return "refused"
        check_centre_class(lower, upper, DISJUNCTS[name], partial(logits, network), name)
    said = sorted({k for w in caught for text, k in KINDS.items() if text in str(w.message)})
    return f"warned ({'+'.join(said)})" if caught else "passed"


def count(label: str, cases) -> None:
    tally = Counter(outcome(*case) for case in cases)
    print(f"{label:60s} " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


def main() -> None:
    began = time.process_time()
    every = pairs()
    n_of = {
        net: math.prod(d for d in graph_shape(net)[1:] if isinstance(d, int)) for net, _ in every
    }
    real = [(net, *box(spec, n_of[net]), spec.name) for net, spec in every]
    print(f"{len(every)} instances, {len(BOXES)} properties, {len(n_of)} networks")
    count("as paired, nothing declared", [(*r, None) for r in real])
    count("as paired, the README's convention declared", [(*r, declared(r[0])) for r in real])
    cifar = shared_data("cifar10-models")
    resnets = [cifar / "vnncomp2021_cifar10_resnet" / f"resnet_{k}b.onnx" for k in (2, 4)]
    marabou = [cifar / "vnncomp2021_marabou_cifar10" / f"cifar10_{s}.onnx"
               for s in ("small", "medium", "large")]  # fmt: skip
    resnet_boxes = [r[1:] for r in real if r[0] in resnets]
    marabou_boxes = list({r[3]: r[1:] for r in real if r[0] in marabou}.values())
    mnist_boxes = list({r[3]: r[1:] for r in real if n_of[r[0]] == 784}.values())
    mnist_nets = sorted({r[0] for r in real if n_of[r[0]] == 784})
    for declare in (None, "declared"):
        said = "declared" if declare else "nothing declared"
        count(
            f"ResNet boxes vs Marabou nets, {said}",
            [(m, *b, declare and declared(m)) for m in marabou for b in resnet_boxes],
        )
        pixels = [(lo * SPREAD + MEAN, hi * SPREAD + MEAN, name) for lo, hi, name in resnet_boxes]
        count(
            f"ResNet boxes in [0, 1] pixels vs ResNets, {said}",
            [(r, *b, declare and declared(r)) for r in resnets for b in pixels],
        )
        count(
            f"Marabou boxes vs ResNets, {said}",
            [(r, *b, declare and declared(r)) for r in resnets for b in marabou_boxes],
        )
        normalised = [((lo - MNIST_MEAN) / MNIST_STD, (hi - MNIST_MEAN) / MNIST_STD, name)
                      for lo, hi, name in mnist_boxes]  # fmt: skip
        count(
            f"MNIST boxes normalised vs MNIST nets, {said}",
            [(m, *b, declare and declared(m)) for m in mnist_nets for b in normalised],
        )
        count(f"MNIST boxes in 0..255 vs MNIST nets, {said}",
              [(m, lo * 255, hi * 255, name, declare and declared(m))
               for m in mnist_nets for lo, hi, name in mnist_boxes])  # fmt: skip
        wide = [
            (c - 255 * e, c + 255 * e, name)
            for c, e, name in (((lo + hi) / 2, (hi - lo) / 2, name) for lo, hi, name in mnist_boxes)
        ]
        count(
            f"MNIST boxes, eps x 255, vs MNIST nets, {said}",
            [(m, *b, declare and declared(m)) for m in mnist_nets for b in wide],
        )
        wide = [
            (c - 255 * e, c + 255 * e, name)
            for c, e, name in (
                ((lo + hi) / 2, (hi - lo) / 2, name) for lo, hi, name in marabou_boxes
            )
        ]
        count(
            f"Marabou boxes, eps x 255, vs Marabou nets, {said}",
            [(m, *b, declare and declared(m)) for m in marabou for b in wide],
        )
    print(f"CPU {time.process_time() - began:.1f} s")


if __name__ == "__main__":
    main()
