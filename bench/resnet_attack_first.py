"""Attack first on the VNN-COMP 2021 CIFAR ResNets: what ``pgd-linf`` breaks, ``verify`` says sat.

    python bench/resnet_attack_first.py [--nets resnet_2b] [--steps 100] [--timeout 300]
                                        [--verifier complete] [--limit 0] [--widen 1] [--skip 0]

For every instance of ``../shared/data/cifar10-models/vnncomp2021_cifar10_resnet`` whose
network is in ``--nets``: ``pgd-linf`` (``--steps``, the platform's attack) on the instance's
box, then, for each instance it breaks (the point replayed through onnxruntime violates the
property), ``aisafety verify NET SPEC --verifier V --timeout T`` in a fresh process, with
its status, engine, the command's wall and CPU seconds (Python and torch's import
included) and the seconds it reports itself (loading the network and verifying).

The box is given in the network's normalised input space, so ``pgd-linf`` runs on the map
``u -> net(lower + u (upper - lower))`` from the unit cube, at the cube's centre with eps 0.5:
its [0, 1] clamp is then exactly the box (the step is relative to each pixel's width, which
differs between the three channels only by their standard deviations).

The instances are filtered so that PGD does not break them ("pgd_filtered"); ``--widen F``
writes each one again (to a temporary folder) with its box's radius multiplied by ``F``
around the same centre, the output constraints unchanged: properties of the same real
network that PGD does break.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def resnet_folder() -> Path:
    """The VNN-COMP 2021 CIFAR-10 ResNet benchmark in shared/data."""
    return shared_data("cifar10-models") / "vnncomp2021_cifar10_resnet"


class FromCube(nn.Module):
    """The network on the unit cube: ``u -> graph(lower + u (upper - lower))``."""

    def __init__(self, graph, lower: torch.Tensor, upper: torch.Tensor):
        super().__init__()
        self.graph, self.lower, self.width = graph, lower, upper - lower

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.graph.forward((self.lower + u * self.width).to(self.graph.dtype)).float()


def spec_file(name: str) -> Path:
    """The instance's vnnlib file as shipped here (flattened into ``vnnlib/``)."""
    return (
        resnet_folder()
        / "vnnlib"
        / name.replace("vnnlib_properties_pgd_filtered/", "").replace("/", "__")
    )


def widened(spec: Path, factor: float, folder: Path) -> Path:
    """A copy of ``spec`` with each input's interval scaled by ``factor`` about its centre."""
    text = spec.read_text()
    bound = re.compile(r"\(assert \((<=|>=) X_(\d+) ([^)]+)\)\)")
    ends: dict[int, dict[str, float]] = {}
    for op, i, v in bound.findall(text):
        ends.setdefault(int(i), {})[op] = float(v)

    def scaled(match: re.Match) -> str:
        op, i = match.group(1), int(match.group(2))
        hi, lo = ends[i]["<="], ends[i][">="]
        mid, half = (hi + lo) / 2, (hi - lo) / 2 * factor
        return f"(assert ({op} X_{i} {mid + half if op == '<=' else mid - half!r}))"

    out = folder / spec.name
    out.write_text(bound.sub(scaled, text))
    return out


def broken_by_pgd(onnx: Path, spec: Path, steps: int) -> bool:
    """Whether ``pgd-linf`` finds a point of the box that onnxruntime says violates the spec."""
    from aisafety.plugins import default_registry
    from aisafety.prediction.torch_module import TorchPredictor
    from aisafety.verification.vnncomp import load_network
    from aisafety.verification.vnnlib import read_vnnlib

    net = load_network(str(onnx))
    n = net.graph.input_shape
    prop = read_vnnlib(spec, int(torch.tensor(n).prod()), net.reference.num_classes)
    lower, upper = (t.reshape(1, *n).float() for t in (prop.lower, prop.upper))
    cube = FromCube(net.graph, lower, upper).eval()
    predictor = TorchPredictor(cube, tuple(n), net.reference.num_classes, name=onnx.stem)
    centre = torch.full((1, *n), 0.5)
    label = predictor.logits(centre).argmax(1)
    attack = default_registry().create("attack", "pgd-linf", {"steps": steps})
    u = attack(predictor, centre, label, 0.5).x_adv
    x = (lower + u.clamp(0, 1) * (upper - lower)).double()
    rows = prop.rows(net.run(x.reshape(1, -1)).double())
    return bool((rows <= 0).any())


def verify(onnx: Path, spec: Path, verifier: str, timeout: float) -> tuple[str, float, str]:
    """``aisafety verify`` in a fresh process: status, its wall seconds, its comment line."""
    command = ["aisafety", "verify", str(onnx), str(spec), "--verifier", verifier,
               "--timeout", str(timeout)]  # fmt: skip
    began, cpu = time.perf_counter(), _children_cpu()
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout * 3 + 120)
    wall, cpu = time.perf_counter() - began, _children_cpu() - cpu
    lines = out.stdout.strip().splitlines() or [f"exit {out.returncode}: {out.stderr[-200:]}"]
    return lines[0], wall, f"{cpu:.1f} cpu s for the command; {lines[-1]}"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", nargs="*", default=["resnet_2b"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--verifier", default="complete")
    parser.add_argument("--limit", type=int, default=0, help="instances per net (0: all)")
    parser.add_argument("--widen", type=float, default=1.0, help="box radius factor")
    parser.add_argument("--skip", type=int, default=0, help="start after this many instances")
    args = parser.parse_args()
    with (resnet_folder() / "instances.csv").open() as f:
        rows = [r for r in csv.reader(f) if r and any(n in r[0] for n in args.nets)]
    if args.limit:
        rows = [r for n in args.nets for r in [r for r in rows if n in r[0]][: args.limit]]
    rows = rows[args.skip :]
    print(f"{len(rows)} instances (box radius x{args.widen:g}), pgd-linf {args.steps} steps, "
          f"{args.verifier} {args.timeout:g} s; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="widened-"))
    broken = answered = 0
    for onnx_name, spec_name, _ in rows:
        onnx, spec = resnet_folder() / onnx_name.replace("onnx/", ""), spec_file(spec_name)
        if args.widen != 1:
            spec = widened(spec, args.widen, folder)
        cpu = time.process_time()
        hit = broken_by_pgd(onnx, spec, args.steps)
        cpu = time.process_time() - cpu
        line = f"{onnx.stem:<10} {spec.name:<48} pgd-linf {'broken' if hit else 'held':<6} " \
               f"{cpu:5.1f} cpu s"  # fmt: skip
        if hit:
            status, wall, comment = verify(onnx, spec, args.verifier, args.timeout)
            broken += 1
            answered += status == "sat" and wall <= 5
            line += f" | verify: {status} in {wall:.1f} s wall ({comment})"
        print(line, flush=True)
    print(f"broken by pgd-linf: {broken}/{len(rows)}; answered sat within 5 s: {answered}/{broken}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
